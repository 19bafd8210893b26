//! Shared by the engine's integration tests: a fresh store of either backend
//! per test, direct SQL access for test setup, and [`on_both_backends!`],
//! which runs each test once per backend (`postgres::<name>`,
//! `sqlite::<name>`).
//!
//! PostgreSQL: a new database `<prefix>_<uuid>` on `$BELAY_TEST_PG`
//! (default `postgres://postgres@127.0.0.1:5432`), dropped by
//! [`TestDb::drop`]. SQLite: a new file in a fresh directory under the
//! system temp dir, removed by [`TestDb::drop`] (and when the [`TestDb`] is
//! dropped, so a failing test leaves nothing behind either).

#![allow(dead_code)]

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use std::sync::Arc;

use belay_engine::admin::{self, AdminAuth};
use belay_engine::coordinator::{ApprovalDecision, Coordinator, CoordinatorConfig, StartRun};
use belay_engine::definitions::SourceFile;
use belay_engine::store::{ClaimedTask, Store};
use belay_proto::wire::{ModelCallResult, ToolUse, Usage};
use sqlx::Row;
use uuid::Uuid;

/// Which database a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// PostgreSQL, a database per test.
    Postgres,
    /// SQLite, a file per test.
    Sqlite,
}

/// Generate, for each named `async fn name(backend: Backend)` of the test
/// file, `postgres::name` and `sqlite::name` tests that run it on that
/// backend (on a multi-threaded runtime, so concurrency is real).
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name($crate::common::Backend::Postgres).await
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name($crate::common::Backend::Sqlite).await
                }
            )*
        }
    };
}

/// A database created for one test; [`TestDb::drop`] removes it.
pub struct TestDb {
    /// Which backend.
    pub backend: Backend,
    /// The URL to give [`Store::connect`].
    pub url: String,
    place: Place,
}

enum Place {
    Postgres { name: String, admin: String },
    Sqlite { _dir: TempDir },
}

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl TestDb {
    /// A fresh, empty database (no migrations applied yet).
    pub async fn create(backend: Backend, prefix: &str) -> TestDb {
        let id = Uuid::new_v4().simple();
        match backend {
            Backend::Postgres => {
                let base = std::env::var("BELAY_TEST_PG")
                    .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
                let name = format!("{prefix}_{id}");
                let admin = format!("{base}/postgres");
                let pool = sqlx::PgPool::connect(&admin)
                    .await
                    .expect("PostgreSQL on 127.0.0.1:5432");
                sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                    .execute(&pool)
                    .await
                    .expect("create db");
                pool.close().await;
                TestDb {
                    backend,
                    url: format!("{base}/{name}"),
                    place: Place::Postgres { name, admin },
                }
            }
            Backend::Sqlite => {
                let dir = std::env::temp_dir().join(format!("{prefix}_{id}"));
                std::fs::create_dir_all(&dir).expect("temp dir");
                let file = dir.join("belay.db");
                TestDb {
                    backend,
                    url: format!("sqlite://{}", file.display()),
                    place: Place::Sqlite { _dir: TempDir(dir) },
                }
            }
        }
    }

    /// Open a store on this database and apply the migrations.
    pub async fn store(&self, max_connections: u32) -> Store {
        let store = Store::connect(&self.url, max_connections)
            .await
            .expect("connect");
        store.migrate().await.expect("migrate");
        store
    }

    /// A direct connection for test setup (aging rows, corrupting one,
    /// reading columns the store API does not return).
    pub async fn raw(&self) -> Raw {
        match self.backend {
            Backend::Postgres => Raw::Pg(sqlx::PgPool::connect(&self.url).await.expect("pool")),
            Backend::Sqlite => {
                let options = sqlx::sqlite::SqliteConnectOptions::from_str(&self.url)
                    .expect("url")
                    .busy_timeout(Duration::from_secs(10));
                Raw::Lite(
                    sqlx::sqlite::SqlitePoolOptions::new()
                        .max_connections(1)
                        .connect_with(options)
                        .await
                        .expect("pool"),
                )
            }
        }
    }

    /// Remove the database (PostgreSQL: closing leftover connections).
    pub async fn drop(self) {
        match &self.place {
            Place::Postgres { name, admin } => {
                let pool = sqlx::PgPool::connect(admin).await.expect("admin");
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                )))
                .execute(&pool)
                .await
                .expect("drop db");
                pool.close().await;
            }
            // The directory goes with `self`.
            Place::Sqlite { .. } => {}
        }
    }
}

/// One `reconcile` HTTP tool, `create` (permission `crm.write`): the
/// fixture of tests that need a run with a tool.
pub const CREATE_TOOL: &str = r#"TOOLS:
  create(email: string) -> {id: string}
    description: "create"
    type: http
    endpoint: "/create"
    permission: crm.write
    repeat_safety: reconcile
"#;
/// An agent `a` that may call `create`, and a workflow `w` of that agent.
pub const CREATE_AGENT: &str = "kind: agent\nname: a\nmodel: m\ninstructions: i\ntools: [create]\ngrants: [crm.write]\n---\nkind: workflow\nname: w\nnodes:\n  - id: n\n    type: agent\n    agent: a\n";

/// A decision of `node` (no request id: the node's only request).
pub fn decision(
    node: &str,
    approve: bool,
    edit: &str,
    by: &str,
    grants: &[String],
    reason: &str,
) -> ApprovalDecision {
    ApprovalDecision {
        node: node.to_owned(),
        approve,
        edited_subject_json: edit.to_owned(),
        approver: by.to_owned(),
        approver_grants: grants.to_vec(),
        reason: reason.to_owned(),
        ..ApprovalDecision::default()
    }
}

/// A fresh database of `backend` (named `prefix_…`) with [`coordinator`]
/// for tenant `t` ([`CREATE_TOOL`], [`CREATE_AGENT`], `crm.write`) and a
/// started run of workflow `w`; returns the run id.
pub async fn create_run(backend: Backend, prefix: &str) -> (TestDb, Arc<Coordinator>, String) {
    let db = TestDb::create(backend, prefix).await;
    let coord = coordinator(
        db.store(4).await,
        &["t"],
        CREATE_TOOL,
        CREATE_AGENT,
        &["crm.write"],
    )
    .await;
    let (run, created) = coord
        .start_run(StartRun {
            tenant: "t".into(),
            workflow: "w".into(),
            input_json: "{}".into(),
            idempotency_key: "k".into(),
            caller: "c".into(),
            caller_grants: vec!["crm.write".into()],
        })
        .await
        .expect("start");
    assert!(created);
    (db, coord, run.run_id.to_string())
}

/// The model proposes `create`; returns the create call's task, claimed
/// and dispatched by worker `w1`.
pub async fn dispatched_create(coord: &Coordinator) -> String {
    let model = coord.claim("w1", 1, 0).await.expect("claim").remove(0);
    let answer = ModelCallResult {
        content: None,
        tool_calls: vec![ToolUse {
            id: "tu".into(),
            name: "create".into(),
            arguments: r#"{"email":"e"}"#.into(),
        }],
        usage: Usage::default(),
        finish_reason: None,
    };
    let answer = serde_json::to_string(&answer).expect("json");
    coord
        .complete("w1", &model.task_id.to_string(), 1, &answer)
        .await
        .expect("complete");
    let task = coord.claim("w1", 1, 0).await.expect("claim").remove(0);
    let id = task.task_id.to_string();
    coord.dispatch("w1", &id, 1).await.expect("dispatch");
    id
}

/// A coordinator on `store` (60 s leases, a sweep a second) with, for each
/// of `tenants`, `tools` (a `.tools.abl`) and `yaml` (agents and workflows)
/// registered and `grants` granted to the tenant.
pub async fn coordinator(
    store: Store,
    tenants: &[&str],
    tools: &str,
    yaml: &str,
    grants: &[&str],
) -> Arc<Coordinator> {
    let coord = Coordinator::new(
        store,
        CoordinatorConfig {
            lease_ms: 60_000,
            sweep_interval_ms: 1_000,
            ..CoordinatorConfig::default()
        },
    );
    let grants: Vec<String> = grants.iter().map(|g| (*g).to_owned()).collect();
    for tenant in tenants {
        coord
            .register_bundle(
                tenant,
                vec![
                    SourceFile {
                        path: "x.tools.abl".into(),
                        content: tools.into(),
                    },
                    SourceFile {
                        path: "x.yaml".into(),
                        content: yaml.into(),
                    },
                ],
            )
            .await
            .expect("register");
        coord
            .store()
            .set_tenant_grants(tenant, &grants)
            .await
            .expect("grants");
    }
    coord
}

/// Serve the admin router of `coord` with `tokens` (`name:token[:tenant],…`)
/// on 127.0.0.1, a free port, until the test's runtime ends; returns its
/// base URL (`http://127.0.0.1:<port>`).
pub async fn serve_admin(coord: &Arc<Coordinator>, tokens: &str) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let auth = belay_engine::auth::Authenticator::new(
        coord.store().clone(),
        AdminAuth::parse(tokens).expect("tokens"),
    );
    let app = admin::router(Arc::clone(coord), auth);
    // As the engine serves it: each request carries its `tls::PeerInfo`.
    tokio::spawn(belay_engine::tls::serve_http(
        listener,
        app,
        std::future::pending(),
    ));
    format!("http://{addr}")
}

/// Claim every ready task for `worker` and return `run`'s task of `kind`
/// (the others stay leased to `worker`).
pub async fn claim_of(coord: &Coordinator, worker: &str, run: Uuid, kind: &str) -> ClaimedTask {
    let claimed = coord.claim(worker, 64, 0).await.expect("claim");
    claimed
        .into_iter()
        .find(|t| t.run_id == run && t.kind == kind)
        .unwrap_or_else(|| panic!("no {kind} of run {run} was ready"))
}

/// `s` percent-encoded for a query string (every byte but RFC 3986's
/// unreserved ones).
pub fn percent(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Direct SQL on a test's database. Statements use `$1`-style parameters,
/// which both backends accept; SQL that differs between them is given per
/// backend by the caller.
pub enum Raw {
    /// PostgreSQL.
    Pg(sqlx::PgPool),
    /// SQLite.
    Lite(sqlx::SqlitePool),
}

impl Raw {
    /// Run a statement with an optional uuid parameter `$1`; returns the rows changed.
    pub async fn execute(&self, sql: &str, id: Option<Uuid>) -> u64 {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match self {
            Raw::Pg(pool) => {
                let mut q = sqlx::query(sql);
                if let Some(id) = id {
                    q = q.bind(id);
                }
                q.execute(pool).await.expect("execute").rows_affected()
            }
            Raw::Lite(pool) => {
                let mut q = sqlx::query(sql);
                if let Some(id) = id {
                    q = q.bind(id);
                }
                q.execute(pool).await.expect("execute").rows_affected()
            }
        }
    }

    /// The text columns of the first row of a query with a uuid parameter `$1`.
    pub async fn fetch_texts(&self, sql: &str, id: Uuid) -> Vec<String> {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match self {
            Raw::Pg(pool) => {
                let row = sqlx::query(sql)
                    .bind(id)
                    .fetch_one(pool)
                    .await
                    .expect("fetch");
                (0..row.len())
                    .map(|i| row.try_get::<String, _>(i).expect("text column"))
                    .collect()
            }
            Raw::Lite(pool) => {
                let row = sqlx::query(sql)
                    .bind(id)
                    .fetch_one(pool)
                    .await
                    .expect("fetch");
                (0..row.len())
                    .map(|i| row.try_get::<String, _>(i).expect("text column"))
                    .collect()
            }
        }
    }

    /// Every row of `table` (every column, as text), ordered by `order_by`:
    /// for comparing a database before and after something that must
    /// change nothing.
    pub async fn dump(&self, table: &str, order_by: &str) -> Vec<String> {
        match self {
            Raw::Pg(pool) => {
                let rows: Vec<(String,)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                    "SELECT to_jsonb(t)::text FROM {table} t ORDER BY {order_by}"
                )))
                .fetch_all(pool)
                .await
                .expect("dump");
                rows.into_iter().map(|r| r.0).collect()
            }
            Raw::Lite(pool) => {
                let columns: Vec<(String,)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                    "SELECT name FROM pragma_table_info('{table}') ORDER BY cid"
                )))
                .fetch_all(pool)
                .await
                .expect("columns");
                let quoted: Vec<String> =
                    columns.iter().map(|(c,)| format!("quote({c})")).collect();
                let rows: Vec<(String,)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                    "SELECT json_array({}) FROM {table} ORDER BY {order_by}",
                    quoted.join(", ")
                )))
                .fetch_all(pool)
                .await
                .expect("dump");
                rows.into_iter().map(|r| r.0).collect()
            }
        }
    }

    /// The names of every table but sqlx's migration record.
    pub async fn tables(&self) -> Vec<String> {
        let rows: Vec<(String,)> = match self {
            Raw::Pg(pool) => sqlx::query_as(
                "SELECT table_name::text FROM information_schema.tables
                 WHERE table_schema = 'public' AND table_name <> '_sqlx_migrations'",
            )
            .fetch_all(pool)
            .await
            .expect("tables"),
            Raw::Lite(pool) => sqlx::query_as(
                "SELECT name FROM sqlite_master WHERE type = 'table'
                 AND name NOT LIKE 'sqlite_%' AND name <> '_sqlx_migrations'",
            )
            .fetch_all(pool)
            .await
            .expect("tables"),
        };
        rows.into_iter().map(|r| r.0).collect()
    }

    /// Close the connections.
    pub async fn close(&self) {
        match self {
            Raw::Pg(pool) => pool.close().await,
            Raw::Lite(pool) => pool.close().await,
        }
    }
}
