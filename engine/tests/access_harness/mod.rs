//! The fixture of `access.rs`: an engine on 127.0.0.1 with two tenants'
//! keys of every role, one run with a leased task in tenant `a`, the list
//! of RPCs from the service descriptors, a valid request for each, and a
//! snapshot of every table.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;

use belay_engine::auth::{self, Role, Tenants, policy};
use belay_engine::coordinator::{Coordinator, StartRun};
use belay_engine::definitions::SourceFile;
use belay_engine::server::{Engine, EngineOptions, Listeners};
use belay_engine::store::{NewPrincipal, Store};
use belay_proto::v1;
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

use crate::common::{Backend, TestDb};

/// The configured admin token of the fixture's engine.
pub const ROOT_TOKEN: &str = "root-token-0123456789abcdef";

/// A workflow that waits for an approval (grant `ops.approve`), then a
/// signal.
pub const APPROVAL: &str = r#"kind: workflow
name: early
nodes:
  - id: approve
    type: approval
    subject: "${ .input }"
    approver_grant: ops.approve
    next: docs
  - id: docs
    type: wait
    signal: documents_received
    timeout: 7d
    next: done
  - {id: done, type: succeed, output: "${ .nodes.docs.output }"}
"#;

/// How a caller is wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    /// No `authorization` header.
    NoKey,
    /// A key that is not `belay_<id>_<secret>`.
    Malformed,
    /// A revoked key.
    Revoked,
    /// An expired key.
    Expired,
    /// A key of tenant `b` with a role the call admits.
    OtherTenant,
    /// A key of tenant `a` with a role the call does not admit.
    WrongRole,
}

impl Case {
    /// Every case.
    pub const ALL: [Case; 6] = [
        Case::NoKey,
        Case::Malformed,
        Case::Revoked,
        Case::Expired,
        Case::OtherTenant,
        Case::WrongRole,
    ];
}

/// The refusal a case must get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `UNAUTHENTICATED`, 401.
    Unauthenticated,
    /// `PERMISSION_DENIED`, 403.
    PermissionDenied,
}

impl Refusal {
    /// The gRPC code.
    pub fn grpc(self) -> tonic::Code {
        match self {
            Refusal::Unauthenticated => tonic::Code::Unauthenticated,
            Refusal::PermissionDenied => tonic::Code::PermissionDenied,
        }
    }

    /// The HTTP status.
    pub fn http(self) -> u16 {
        match self {
            Refusal::Unauthenticated => 401,
            Refusal::PermissionDenied => 403,
        }
    }
}

/// Keys by tenant and role.
type Keys = BTreeMap<(&'static str, &'static str), String>;

/// A running engine with keys, a run and a leased task.
pub struct Fixture {
    db: TestDb,
    store: Store,
    grpc: tonic::transport::Channel,
    admin: String,
    keys: Keys,
    revoked: String,
    expired: String,
    /// The key id of tenant a's client key (revoked by the key route).
    a_client_key_id: String,
    run_id: String,
    task_id: String,
    attempt: u32,
    stop: tokio::sync::oneshot::Sender<()>,
    served: tokio::task::JoinHandle<()>,
}

impl Fixture {
    /// Start it on `backend`.
    pub async fn start(backend: Backend) -> Fixture {
        let db = TestDb::create(backend, "belay_acc").await;
        let engine = Engine::start(EngineOptions {
            tokens: auth::AdminAuth::parse(&format!("root:{ROOT_TOKEN}")).expect("tokens"),
            // Longer than any run of the tests: the table snapshots they
            // compare must not see the sweeper expire the seeded lease
            // (seen at 32 s on a loaded machine with the default 30 s).
            coordinator: belay_engine::coordinator::CoordinatorConfig {
                lease_ms: 600_000,
                ..Default::default()
            },
            ..EngineOptions::new(db.url.clone(), 4)
        })
        .await
        .expect("engine");
        let coord = Arc::clone(engine.coordinator());
        let store = coord.store().clone();
        let keys = mint_keys(&store).await;
        let revoked = mint(&store, "a", Role::Client).await;
        store
            .revoke_principal(key_id(&revoked))
            .await
            .expect("revoke")
            .expect("revoked row");
        let expired = expired_key(&store).await;
        let (run_id, task_id, attempt) = seed(&coord).await;
        let grpc_listener = bind().await;
        let admin_listener = bind().await;
        let grpc_url = format!("http://{}", grpc_listener.local_addr().expect("addr"));
        let admin = format!("http://{}", admin_listener.local_addr().expect("addr"));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let listeners = Listeners {
            admin: Some(admin_listener),
            ..Listeners::grpc_only(grpc_listener)
        };
        let served = tokio::spawn(async move {
            engine
                .serve(listeners, async {
                    let _ = stopped.await;
                })
                .await
                .expect("serve");
        });
        let grpc = tonic::transport::Endpoint::from_shared(grpc_url)
            .expect("url")
            .connect_lazy();
        Fixture {
            a_client_key_id: key_id(&keys[&("a", "client")]).to_owned(),
            db,
            store,
            grpc,
            admin,
            keys,
            revoked,
            expired,
            run_id,
            task_id,
            attempt,
            stop,
            served,
        }
    }

    /// The key of `role` in `tenant` (`a` or `b`; grants `crm.write`).
    pub fn key(&self, tenant: &'static str, role: Role) -> String {
        self.keys[&(tenant, role.as_str())].clone()
    }

    /// A channel to the gRPC API.
    pub fn channel(&self) -> tonic::transport::Channel {
        self.grpc.clone()
    }

    /// The admin endpoint's base URL.
    pub fn admin_url(&self) -> &str {
        &self.admin
    }

    /// The engine's store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The run of tenant a the fixture started.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Stop the engine and drop the database.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.served.await;
        self.db.drop().await;
    }

    /// Every row of every table, sorted.
    pub async fn snapshot(&self) -> BTreeMap<String, Vec<String>> {
        snapshot(&self.db).await
    }

    /// The credentials of `case` for a call that admits `roles`: for
    /// `WrongRole`, a key of every role it does not admit (the configured
    /// admin token too, where admins are not admitted); for `OtherTenant`,
    /// tenant b's key of every role it admits.
    pub fn credentials(&self, case: Case, roles: &[Role]) -> Vec<Option<String>> {
        let keys = |tenant: &'static str, admitted: bool| -> Vec<Option<String>> {
            [Role::Client, Role::Approver, Role::Operator, Role::Worker]
                .into_iter()
                .filter(|r| roles.contains(r) == admitted)
                .map(|r| Some(self.keys[&(tenant, r.as_str())].clone()))
                .collect()
        };
        match case {
            Case::NoKey => vec![None],
            Case::Malformed => vec![
                Some("belay_not-a-key".to_owned()),
                Some(format!("{}x", &self.keys[&("a", "client")][..60])),
                Some("not-a-configured-token".to_owned()),
            ],
            Case::Revoked => vec![Some(self.revoked.clone())],
            Case::Expired => vec![Some(self.expired.clone())],
            Case::OtherTenant => keys("b", true),
            Case::WrongRole => {
                let mut wrong = keys("a", false);
                if !roles.contains(&Role::Admin) {
                    wrong.push(Some(ROOT_TOKEN.to_owned()));
                }
                wrong
            }
        }
    }

    /// What `case` must get from `service/method`; `None` where the case
    /// does not apply (checked by other tests).
    pub fn expected_grpc(&self, service: &str, method: &str, case: Case) -> Option<Refusal> {
        match case {
            Case::NoKey | Case::Malformed | Case::Revoked | Case::Expired => {
                Some(Refusal::Unauthenticated)
            }
            Case::WrongRole => Some(Refusal::PermissionDenied),
            // A claim by another tenant's worker is allowed and gets none
            // of a's tasks (`what_another_tenant_may_call...`); a report of
            // an MCP server's tools is not a tenant's (pins are).
            Case::OtherTenant
                if service == "belay.v1.WorkerService"
                    && matches!(method, "ClaimTasks" | "ReportMcpTools") =>
            {
                None
            }
            Case::OtherTenant => Some(Refusal::PermissionDenied),
        }
    }

    /// Call `service/method` with `body` as `case`; the status code of a
    /// refusal.
    pub async fn call(
        &self,
        service: &str,
        method: &str,
        streaming: bool,
        body: &[u8],
        credential: Option<&str>,
    ) -> Result<(), tonic::Code> {
        let mut req = tonic::Request::new(body.to_vec());
        if let Some(key) = credential {
            req.metadata_mut().insert(
                "authorization",
                format!("Bearer {key}").parse().expect("header"),
            );
        }
        let path =
            http::uri::PathAndQuery::from_str(&format!("/{service}/{method}")).expect("path");
        let mut grpc = tonic::client::Grpc::new(self.grpc.clone());
        grpc.ready().await.expect("ready");
        let result = if streaming {
            grpc.server_streaming(req, path, RawCodec).await.map(|_| ())
        } else {
            grpc.unary(req, path, RawCodec).await.map(|_| ())
        };
        result.map_err(|s| s.code())
    }

    /// A valid request of `method` in tenant `a` (what the right principal
    /// would send). Panics for a method without a case: add one.
    pub fn request_for(&self, method: &str) -> Vec<u8> {
        let tenant = "a".to_owned();
        let run_id = self.run_id.clone();
        let task_id = self.task_id.clone();
        let worker_id = "w1".to_owned();
        let attempt = self.attempt;
        match method {
            "StartRun" => v1::StartRunRequest {
                tenant,
                workflow: "w".into(),
                input_json: "{}".into(),
                idempotency_key: "new-key".into(),
                ..Default::default()
            }
            .encode_to_vec(),
            "GetRun" => v1::GetRunRequest { tenant, run_id }.encode_to_vec(),
            "ListRuns" => v1::ListRunsRequest {
                tenant,
                ..Default::default()
            }
            .encode_to_vec(),
            "ListRunEvents" => v1::ListRunEventsRequest {
                tenant,
                run_id,
                ..Default::default()
            }
            .encode_to_vec(),
            "WatchRun" => v1::WatchRunRequest {
                tenant,
                run_id,
                after_seq: 0,
            }
            .encode_to_vec(),
            "CancelRun" => v1::CancelRunRequest {
                tenant,
                run_id,
                reason: "r".into(),
            }
            .encode_to_vec(),
            "PauseRun" => v1::PauseRunRequest {
                tenant,
                run_id,
                reason: "r".into(),
                ..Default::default()
            }
            .encode_to_vec(),
            "ResumeRun" => v1::ResumeRunRequest {
                tenant,
                run_id,
                reason: "r".into(),
                ..Default::default()
            }
            .encode_to_vec(),
            "SignalRun" => v1::SignalRunRequest {
                tenant,
                run_id,
                name: "s".into(),
                signal_id: "s1".into(),
                payload_json: "{}".into(),
                ..Default::default()
            }
            .encode_to_vec(),
            "DecideApproval" => v1::DecideApprovalRequest {
                tenant,
                run_id,
                node: "n".into(),
                approve: true,
                reason: "r".into(),
                ..Default::default()
            }
            .encode_to_vec(),
            "ProvideToolInput" => v1::ProvideToolInputRequest {
                tenant,
                run_id,
                call_id: "n.t1".into(),
                answer_json: "{}".into(),
                ..Default::default()
            }
            .encode_to_vec(),
            "RegisterBundle" => v1::RegisterBundleRequest {
                tenant,
                files: vec![v1::DefinitionFile {
                    path: "x.yaml".into(),
                    content: crate::common::CREATE_AGENT.into(),
                }],
            }
            .encode_to_vec(),
            "ListDefinitions" => v1::ListDefinitionsRequest {
                tenant,
                kind: String::new(),
            }
            .encode_to_vec(),
            "SetTenantGrants" => v1::SetTenantGrantsRequest {
                tenant,
                grants: vec!["payments.refund".into()],
            }
            .encode_to_vec(),
            "GetTenantGrants" => v1::GetTenantGrantsRequest { tenant }.encode_to_vec(),
            "ClaimTasks" => v1::ClaimTasksRequest {
                worker_id,
                max_tasks: 8,
                wait_ms: 0,
                capabilities: None,
            }
            .encode_to_vec(),
            "Heartbeat" => v1::HeartbeatRequest {
                worker_id,
                leases: vec![v1::TaskLease { task_id, attempt }],
            }
            .encode_to_vec(),
            "DispatchToolCall" => v1::DispatchToolCallRequest {
                worker_id,
                task_id,
                attempt,
                ..Default::default()
            }
            .encode_to_vec(),
            "CompleteTask" => v1::CompleteTaskRequest {
                worker_id,
                task_id,
                attempt,
                result_json: r#"{"content":"done","tool_calls":[]}"#.into(),
                ..Default::default()
            }
            .encode_to_vec(),
            "FailTask" => v1::FailTaskRequest {
                worker_id,
                task_id,
                attempt,
                error: "e".into(),
                ..Default::default()
            }
            .encode_to_vec(),
            "RequestToolInput" => v1::RequestToolInputRequest {
                worker_id,
                task_id,
                attempt,
                ..Default::default()
            }
            .encode_to_vec(),
            "ReportMcpTools" => v1::ReportMcpToolsRequest {
                worker_id,
                server: "s".into(),
                ..Default::default()
            }
            .encode_to_vec(),
            other => {
                panic!("no request for RPC {other}: add a case to access_harness::request_for")
            }
        }
    }

    /// What `case` must get from the admin route `template`; `None` where
    /// it does not apply.
    pub fn expected_admin(&self, template: &str, case: Case) -> Option<Refusal> {
        match case {
            Case::NoKey | Case::Malformed | Case::Revoked | Case::Expired => {
                Some(Refusal::Unauthenticated)
            }
            Case::WrongRole => Some(Refusal::PermissionDenied),
            // Listing keys as tenant b's operator shows b's keys only
            // (`what_another_tenant_may_call...`).
            Case::OtherTenant if template == belay_engine::admin::KEYS_PATH => None,
            Case::OtherTenant => Some(Refusal::PermissionDenied),
        }
    }

    /// The credentials of `case` for an admin route (which admits
    /// operators and admins).
    pub fn admin_credentials(&self, case: Case) -> Vec<Option<String>> {
        self.credentials(case, &[Role::Operator, Role::Admin])
    }

    /// Call an admin route with `key`; the HTTP status.
    pub async fn admin_call(&self, method: &str, template: &str, key: Option<&str>) -> u16 {
        let path = template
            .replace("{tenant}", "a")
            .replace("{run_id}", &self.run_id)
            .replace("{id}", &uuid::Uuid::new_v4().to_string())
            .replace("{call_id}", "n.t1")
            .replace("{server}", "s")
            .replace("{tool}", "t")
            .replace("{key_id}", &self.a_client_key_id);
        let url = format!("{}{path}", self.admin);
        let client = reqwest::Client::new();
        let mut req = match method {
            "GET" => client.get(&url),
            _ => client.post(&url).json(&admin_body(template)),
        };
        if let Some(key) = key {
            req = req.bearer_auth(key);
        }
        req.send().await.expect("admin request").status().as_u16()
    }

    /// Claim as tenant b's worker (`case` = OtherTenant): the tasks got.
    pub async fn claim_as(&self, case: Case) -> Vec<v1::Task> {
        assert_eq!(case, Case::OtherTenant);
        let mut client = v1::worker_service_client::WorkerServiceClient::new(self.grpc.clone());
        let mut req = tonic::Request::new(v1::ClaimTasksRequest {
            worker_id: "wb".into(),
            max_tasks: 8,
            wait_ms: 0,
            // Capabilities that cover the other tenant's tasks (worker
            // pools) do not widen the key's tenants.
            capabilities: Some(v1::WorkerCapabilities {
                model_providers: vec!["openai".into()],
                http_base_url: true,
                ..Default::default()
            }),
        });
        req.metadata_mut().insert(
            "authorization",
            format!("Bearer {}", self.keys[&("b", "worker")])
                .parse()
                .expect("header"),
        );
        client
            .claim_tasks(req)
            .await
            .expect("claim")
            .into_inner()
            .tasks
    }

    /// The `tenants` of every key tenant b's operator lists.
    pub async fn list_keys_as_other_operator(&self) -> Vec<Vec<String>> {
        let body: serde_json::Value = reqwest::Client::new()
            .get(format!("{}{}", self.admin, belay_engine::admin::KEYS_PATH))
            .bearer_auth(&self.keys[&("b", "operator")])
            .send()
            .await
            .expect("list")
            .json()
            .await
            .expect("json");
        body["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|k| serde_json::from_value(k["tenants"].clone()).expect("tenants"))
            .collect()
    }
}

/// A valid body for a POST admin route.
fn admin_body(template: &str) -> serde_json::Value {
    use belay_engine::admin;
    if template == admin::UNCERTAIN_RESOLVE_PATH {
        serde_json::json!({"resolution": "retry", "reason": "r"})
    } else if template == admin::MCP_TOOL_ACCEPT_PATH {
        serde_json::json!({"definition_hash": "0".repeat(64), "reason": "r"})
    } else if template == admin::KEYS_PATH {
        serde_json::json!({"principal": "x", "role": "client", "tenants": ["a"]})
    } else {
        serde_json::json!({"reason": "r"})
    }
}

/// Every method of every `belay.v1` service, from the descriptors:
/// `(package.Service, Method, server streaming)`.
pub fn grpc_methods() -> Vec<(String, String, bool)> {
    let set = prost_types::FileDescriptorSet::decode(belay_proto::FILE_DESCRIPTOR_SET)
        .expect("descriptor set");
    let mut out = Vec::new();
    for file in set.file {
        let package = file.package().to_owned();
        for service in &file.service {
            for m in &service.method {
                out.push((
                    format!("{package}.{}", service.name()),
                    m.name().to_owned(),
                    m.server_streaming(),
                ));
            }
        }
    }
    out
}

/// The roles each method must admit: the specification the policy table
/// (`belay_engine::auth::policy`) is checked against, written out here on
/// purpose. Panics for a method without an entry: add one.
pub fn admitted(service: &str, method: &str) -> &'static [Role] {
    use Role::{Admin, Approver, Client, Operator, Worker};
    let roles: &'static [Role] = match (service, method) {
        ("belay.v1.RunService", "StartRun" | "SignalRun" | "ProvideToolInput") => {
            &[Client, Operator, Admin]
        }
        ("belay.v1.RunService", "GetRun" | "ListRuns" | "ListRunEvents" | "WatchRun") => {
            &[Client, Approver, Operator, Admin]
        }
        ("belay.v1.RunService", "CancelRun" | "PauseRun" | "ResumeRun") => &[Operator, Admin],
        ("belay.v1.RunService", "DecideApproval") => &[Approver, Operator, Admin],
        ("belay.v1.DefinitionService", "RegisterBundle") => &[Operator, Admin],
        ("belay.v1.DefinitionService", "ListDefinitions") => &[Client, Approver, Operator, Admin],
        ("belay.v1.TenantService", _) => &[Operator, Admin],
        ("belay.v1.WorkerService", _) => &[Worker],
        _ => {
            panic!("no roles written for {service}/{method}: add them to access_harness::admitted")
        }
    };
    assert_eq!(
        policy::grpc_access(&format!("/{service}/{method}")),
        Some(policy::Access::Roles(roles)),
        "the policy of {service}/{method} differs from the specification"
    );
    roles
}

/// The public id of a key text.
pub fn key_id(key: &str) -> &str {
    &key[6..22]
}

async fn bind() -> tokio::net::TcpListener {
    tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind")
}

/// A key of `role` in `tenant` with grants `crm.write`.
pub async fn mint(store: &Store, tenant: &'static str, role: Role) -> String {
    auth::mint_key(
        store,
        &format!("{tenant}-{role}"),
        role,
        Tenants::Only(vec![tenant.to_owned()]),
        vec!["crm.write".into()],
        "test",
    )
    .await
    .expect("mint")
}

async fn mint_keys(store: &Store) -> Keys {
    let mut keys = Keys::new();
    for tenant in ["a", "b"] {
        for role in [Role::Client, Role::Approver, Role::Operator, Role::Worker] {
            keys.insert((tenant, role.as_str()), mint(store, tenant, role).await);
        }
    }
    keys
}

/// A client key of tenant a that expired (by the database clock).
async fn expired_key(store: &Store) -> String {
    let new = auth::key::generate().expect("key");
    store
        .create_principal(&NewPrincipal {
            key_id: new.key_id.clone(),
            principal: "a-expired".into(),
            role: "client".into(),
            tenants: Some(vec!["a".into()]),
            grants: Vec::new(),
            secret_sha256: Some(new.secret_sha256.clone()),
            cert_subject: None,
            description: String::new(),
            created_by: "test".into(),
            expires_in_ms: Some(1_000),
        })
        .await
        .expect("create");
    store.advance_clock(2_000).await.expect("advance clock");
    new.key
}

/// Tenants a and b with the bundle; a run of a whose model task is leased
/// to a's worker (`a-worker/w1`, as the API names it).
async fn seed(coord: &Coordinator) -> (String, String, u32) {
    for tenant in ["a", "b"] {
        coord
            .register_bundle(
                tenant,
                vec![
                    SourceFile {
                        path: "x.tools.abl".into(),
                        content: crate::common::CREATE_TOOL.into(),
                    },
                    SourceFile {
                        path: "x.yaml".into(),
                        content: crate::common::CREATE_AGENT.into(),
                    },
                    SourceFile {
                        path: "early.yaml".into(),
                        content: APPROVAL.into(),
                    },
                ],
            )
            .await
            .expect("register");
    }
    let (run, _) = coord
        .start_run(StartRun {
            tenant: "a".into(),
            workflow: "w".into(),
            input_json: "{}".into(),
            idempotency_key: "k".into(),
            caller: "a-client".into(),
            caller_grants: vec!["crm.write".into()],
        })
        .await
        .expect("start");
    let task = coord
        .claim("a-worker/w1", 1, 0)
        .await
        .expect("claim")
        .pop()
        .expect("a task");
    (
        run.run_id.to_string(),
        task.task_id.to_string(),
        task.attempt as u32,
    )
}

/// Every row of every table but the migrations' and those the engine's
/// sweeper writes whatever is asked (`fleet_liveness` every tick, the
/// fleet registry `engine_replicas` and `fleet_level` every second),
/// sorted.
async fn snapshot(db: &TestDb) -> BTreeMap<String, Vec<String>> {
    let raw = db.raw().await;
    let mut out = BTreeMap::new();
    for table in raw.tables().await.into_iter().filter(|t| {
        !matches!(
            t.as_str(),
            "fleet_liveness" | "engine_replicas" | "fleet_level"
        )
    }) {
        let mut rows = raw.dump(&table, "1").await;
        rows.sort();
        out.insert(table, rows);
    }
    raw.close().await;
    out
}

/// Panic naming the first table that changed.
pub fn assert_same(
    before: &BTreeMap<String, Vec<String>>,
    after: &BTreeMap<String, Vec<String>>,
    what: &str,
) {
    for (table, rows) in before {
        assert_eq!(Some(rows), after.get(table), "{what} changed table {table}");
    }
    assert_eq!(before.len(), after.len(), "{what} changed the tables");
}

/// Request and response bodies as raw protobuf bytes.
#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        use bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        use bytes::Buf;
        let mut out = vec![0; src.remaining()];
        src.copy_to_slice(&mut out);
        Ok(Some(out))
    }
}

/// `msg` with `authorization: Bearer <key>`.
pub fn authed<T>(msg: T, key: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut().insert(
        "authorization",
        format!("Bearer {key}").parse().expect("header"),
    );
    req
}
