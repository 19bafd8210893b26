//! TLS of the engine's listeners, over real sockets on 127.0.0.1, with a
//! test CA made by rcgen: gRPC and the admin endpoint over TLS; the peer
//! identity handlers see (a client certificate's subject, or none);
//! plaintext clients and clients that trust another CA; certificate
//! reload (a new certificate from the next connection on, a broken file
//! keeps the old one). TLS does not depend on the database: the engine
//! runs on SQLite. Nothing sleeps.

mod common;
use common::{Backend, TestDb};

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use belay_engine::server::{Engine, EngineOptions, Listeners};
use belay_engine::tls::{self, Listener, PeerInfo, Protocol, ServerTls, TlsSettings};
use belay_proto::connect::ConnectOptions;
use belay_proto::v1::{ListDefinitionsRequest, definition_service_client::DefinitionServiceClient};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use tokio::net::TcpListener;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::rustls::{self, RootCertStore};
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

/// A CA that issues test certificates.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("key");
        Ca {
            issuer: CertifiedIssuer::self_signed(params, key).expect("CA"),
        }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A leaf for `usage`, named `common_name` in organization `Acme`,
    /// valid for 127.0.0.1 and localhost: (certificate PEM, key PEM).
    fn leaf(&self, common_name: &str, usage: ExtendedKeyUsagePurpose) -> (String, String) {
        let mut params =
            CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()]).expect("params");
        // Encoded most general first, as X.509 subjects are.
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::OrganizationName, "Acme");
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("leaf");
        (cert.pem(), key.serialize_pem())
    }
}

/// A directory of PEM files, removed when dropped.
struct Files(PathBuf);

impl Files {
    fn new() -> Files {
        let dir = std::env::temp_dir().join(format!("belay-tls-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("dir");
        Files(dir)
    }

    fn write(&self, name: &str, content: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, content).expect("write");
        path
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A CA, a server certificate for 127.0.0.1 (`CN=engine-one`) and a
/// client certificate `CN=worker-a,O=Acme`, as files.
struct Pki {
    ca: Ca,
    files: Files,
    settings: TlsSettings,
}

fn pki() -> Pki {
    let ca = Ca::new("Belay test CA");
    let files = Files::new();
    files.write("ca.pem", &ca.pem());
    let (cert, key) = ca.leaf("engine-one", ExtendedKeyUsagePurpose::ServerAuth);
    let cert = files.write("server.pem", &cert);
    let key = files.write("server-key.pem", &key);
    let (client, client_key) = ca.leaf("worker-a", ExtendedKeyUsagePurpose::ClientAuth);
    files.write("client.pem", &client);
    files.write("client-key.pem", &client_key);
    let settings = TlsSettings {
        cert,
        key,
        client_ca: Some(files.path("ca.pem")),
        reload_interval: Duration::ZERO,
    };
    Pki {
        ca,
        files,
        settings,
    }
}

async fn bind() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").await.expect("bind")
}

/// What the recording interceptor saw, one entry per request.
type Seen = Arc<Mutex<Vec<Option<PeerInfo>>>>;

/// The health service behind an interceptor that records each request's
/// `PeerInfo`, served on `listener`; returns its URL.
async fn recording_server(listener: Listener) -> (String, Seen) {
    let addr = listener.local_addr().expect("addr");
    let scheme = if listener.is_tls() { "https" } else { "http" };
    let seen: Seen = Arc::default();
    let log = Arc::clone(&seen);
    let (_reporter, health) = tonic_health::server::health_reporter();
    let recorded = tonic::service::interceptor::InterceptedService::new(
        health,
        move |request: tonic::Request<()>| {
            let peer = request.extensions().get::<PeerInfo>().cloned();
            log.lock().expect("lock").push(peer);
            Ok(request)
        },
    );
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(recorded)
            .serve_with_incoming(listener.into_incoming()),
    );
    (format!("{scheme}://{addr}"), seen)
}

async fn health_check(options: &ConnectOptions) -> Result<i32, tonic::Status> {
    let channel = options.connect_lazy().expect("channel");
    let response = HealthClient::new(channel)
        .check(HealthCheckRequest::default())
        .await?;
    Ok(response.into_inner().status)
}

/// The status's message with its sources (rustls' reason is a source).
fn full_message(status: &tonic::Status) -> String {
    let mut text = format!("{status}");
    let mut source = std::error::Error::source(status);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

#[tokio::test]
async fn handlers_see_the_client_certificate_subject_or_none() {
    let pki = pki();
    let server_tls = ServerTls::load(&pki.settings).expect("load");
    let (url, seen) =
        recording_server(Listener::tls(bind().await, &server_tls, Protocol::Grpc)).await;
    let with_cert = ConnectOptions::new(&url)
        .with_ca_file(pki.files.path("ca.pem"))
        .with_client_cert(
            pki.files.path("client.pem"),
            pki.files.path("client-key.pem"),
        );
    assert_eq!(health_check(&with_cert).await.expect("health"), 1);
    let without = ConnectOptions::new(&url).with_ca_file(pki.files.path("ca.pem"));
    assert_eq!(health_check(&without).await.expect("health"), 1);
    // Plaintext connections carry a PeerInfo too.
    let (plain_url, plain_seen) = recording_server(Listener::plain(bind().await)).await;
    assert_eq!(
        health_check(&ConnectOptions::new(&plain_url))
            .await
            .expect("health"),
        1
    );

    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    let subjects: Vec<Option<String>> = seen
        .iter()
        .map(|p| p.as_ref().expect("PeerInfo").client_cert_subject.clone())
        .collect();
    assert_eq!(subjects, [Some("CN=worker-a,O=Acme".to_owned()), None]);
    for peer in seen.iter().flatten() {
        assert!(
            peer.remote_addr.is_some_and(|a| a.ip().is_loopback()),
            "{peer:?}"
        );
    }
    let plain = plain_seen.lock().expect("lock").clone();
    assert!(
        matches!(
            plain.as_slice(),
            [Some(PeerInfo {
                remote_addr: Some(_),
                client_cert_subject: None
            })]
        ),
        "{plain:?}"
    );
}

#[tokio::test]
async fn a_client_certificate_of_another_ca_fails_the_handshake() {
    let pki = pki();
    let server_tls = ServerTls::load(&pki.settings).expect("load");
    let (url, seen) =
        recording_server(Listener::tls(bind().await, &server_tls, Protocol::Grpc)).await;
    let other = Ca::new("Another CA");
    let (cert, key) = other.leaf("mallory", ExtendedKeyUsagePurpose::ClientAuth);
    let options = ConnectOptions::new(&url)
        .with_ca_file(pki.files.path("ca.pem"))
        .with_client_cert(
            pki.files.write("m.pem", &cert),
            pki.files.write("mk.pem", &key),
        );
    let err = health_check(&options).await.expect_err("refused");
    // TLS 1.3: the server's verdict on the client's certificate arrives
    // after the client's handshake is done, as an alert.
    let text = full_message(&err);
    assert!(text.contains("received fatal alert: UnknownCA"), "{text}");
    assert!(seen.lock().expect("lock").is_empty());
}

#[tokio::test]
async fn a_slow_handshake_holds_up_no_other_connection() {
    let pki = pki();
    let server_tls = ServerTls::load(&pki.settings).expect("load");
    let (url, _seen) =
        recording_server(Listener::tls(bind().await, &server_tls, Protocol::Grpc)).await;
    let addr = url.trim_start_matches("https://").to_owned();
    // Two clients that never finish a handshake: one silent, one that sent
    // half a ClientHello.
    let _silent = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let mut half = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    tokio::io::AsyncWriteExt::write_all(&mut half, &[0x16, 0x03, 0x01, 0x02, 0x00])
        .await
        .expect("write");
    let options = ConnectOptions::new(&url).with_ca_file(pki.files.path("ca.pem"));
    assert_eq!(health_check(&options).await.expect("health"), 1);
}

#[tokio::test]
async fn grpc_over_tls_reaches_the_engine_and_plaintext_or_another_ca_is_refused_clearly() {
    let pki = pki();
    let db = TestDb::create(Backend::Sqlite, "belay_tls").await;
    let engine = Engine::start(EngineOptions {
        tls: Some(pki.settings.clone()),
        tokens: belay_engine::admin::AdminAuth::parse("ops:ops-token-0123456789").expect("tokens"),
        ..EngineOptions::new(db.url.clone(), 2)
    })
    .await
    .expect("engine");
    assert_eq!(engine.scheme(), "https");
    let grpc = bind().await;
    let addr = grpc.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(engine.serve(Listeners::grpc_only(grpc), async {
        let _ = stopped.await;
    }));

    let url = format!("https://{addr}");
    let options = ConnectOptions::new(&url)
        .with_ca_file(pki.files.path("ca.pem"))
        .with_api_key("ops-token-0123456789");
    assert_eq!(health_check(&options).await.expect("health"), 1);
    let mut definitions = DefinitionServiceClient::new(options.connect_lazy().expect("channel"));
    let listed = definitions
        .list_definitions(ListDefinitionsRequest {
            tenant: "acme".into(),
            kind: String::new(),
        })
        .await
        .expect("a real RPC over TLS");
    assert!(listed.into_inner().definitions.is_empty());

    // Plaintext against the TLS port: told what to do.
    let err = health_check(&ConnectOptions::new(format!("http://{addr}")))
        .await
        .expect_err("plaintext");
    assert_eq!(
        err.code(),
        tonic::Code::Unavailable,
        "{}",
        full_message(&err)
    );
    assert!(
        err.message().contains("serves TLS") && err.message().contains("https://"),
        "{}",
        err.message()
    );

    // A client that trusts another CA: a certificate error.
    let other = pki
        .files
        .write("other-ca.pem", &Ca::new("Another CA").pem());
    let err = health_check(&ConnectOptions::new(&url).with_ca_file(other))
        .await
        .expect_err("untrusted");
    let text = full_message(&err);
    assert_eq!(err.code(), tonic::Code::Unavailable, "{text}");
    assert!(
        text.contains("invalid peer certificate: UnknownIssuer"),
        "{text}"
    );

    let _ = stop.send(());
    served.await.expect("join").expect("served");
    db.drop().await;
}

#[tokio::test]
async fn the_admin_endpoint_serves_https_and_tells_plaintext_clients() {
    let pki = pki();
    let db = TestDb::create(Backend::Sqlite, "belay_tls").await;
    let engine = Engine::start(EngineOptions {
        tls: Some(pki.settings.clone()),
        ..EngineOptions::new(db.url.clone(), 2)
    })
    .await
    .expect("engine");
    let admin = bind().await;
    let addr = admin.local_addr().expect("addr");
    let listeners = Listeners {
        admin: Some(admin),
        ..Listeners::grpc_only(bind().await)
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(engine.serve(listeners, async {
        let _ = stopped.await;
    }));

    let ca = reqwest::Certificate::from_pem(pki.ca.pem().as_bytes()).expect("CA");
    let http = reqwest::Client::builder()
        .tls_certs_only([ca])
        .build()
        .expect("client");
    let response = http
        .get(format!(
            "https://{addr}{}",
            belay_engine::admin::OPENAPI_PATH
        ))
        .send()
        .await
        .expect("https");
    assert_eq!(response.status(), 200);
    assert_eq!(response.version(), reqwest::Version::HTTP_11);

    let response = reqwest::Client::new()
        .get(format!(
            "http://{addr}{}",
            belay_engine::admin::OPENAPI_PATH
        ))
        .send()
        .await
        .expect("plaintext gets an answer");
    assert_eq!(response.status(), 400);
    let body = response.text().await.expect("body");
    assert_eq!(body, tls::plaintext::HTTP_MESSAGE);

    let _ = stop.send(());
    served.await.expect("join").expect("served");
    db.drop().await;
}

/// The subject of the certificate a fresh TLS connection to `addr` gets.
async fn served_subject(addr: std::net::SocketAddr, ca: &Path) -> String {
    let mut roots = RootCertStore::empty();
    for cert in rustls::pki_types::pem::PemObject::pem_file_iter(ca).expect("CA") {
        roots.add(cert.expect("CA PEM")).expect("root");
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::IpAddress(addr.ip().into()), tcp)
        .await
        .expect("handshake");
    let leaf = tls.get_ref().1.peer_certificates().expect("certificates")[0].clone();
    tls::peer::subject_rfc4514(&leaf).expect("subject")
}

#[tokio::test]
async fn a_changed_certificate_is_served_after_the_reload_step_and_a_broken_one_is_not() {
    let pki = pki();
    let server_tls = ServerTls::load(&pki.settings).expect("load");
    let listener = Listener::tls(bind().await, &server_tls, Protocol::Http1);
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(tls::serve_http(
        listener,
        axum::Router::new(),
        std::future::pending(),
    ));
    let ca = pki.files.path("ca.pem");
    assert_eq!(served_subject(addr, &ca).await, "CN=engine-one,O=Acme");
    assert!(!server_tls.reload_if_changed().expect("unchanged"));

    // A new certificate (a longer name: a new size even within one mtime tick).
    let (cert, key) = pki
        .ca
        .leaf("engine-second", ExtendedKeyUsagePurpose::ServerAuth);
    pki.files.write("server.pem", &cert);
    pki.files.write("server-key.pem", &key);
    assert!(server_tls.reload_if_changed().expect("reloaded"));
    assert_eq!(served_subject(addr, &ca).await, "CN=engine-second,O=Acme");

    // Half written: the certificate in use stays, and the error names the file.
    pki.files.write("server.pem", &cert[..cert.len() / 2]);
    let err = server_tls.reload_if_changed().expect_err("broken");
    assert!(
        err.to_string()
            .contains(&pki.files.path("server.pem").display().to_string()),
        "{err}"
    );
    assert_eq!(served_subject(addr, &ca).await, "CN=engine-second,O=Acme");
    // Not PEM at all, and a key of another certificate: the same.
    pki.files.write("server.pem", "not a certificate\n");
    assert!(server_tls.reload_if_changed().is_err());
    let (other_cert, _) = pki
        .ca
        .leaf("engine-third", ExtendedKeyUsagePurpose::ServerAuth);
    pki.files.write("server.pem", &other_cert);
    let err = server_tls.reload_if_changed().expect_err("key mismatch");
    assert!(err.to_string().contains("does not fit"), "{err}");
    assert_eq!(served_subject(addr, &ca).await, "CN=engine-second,O=Acme");
}

/// mTLS end to end: a principal row naming the client certificate's
/// subject authenticates the connection without any key (here a worker
/// that claims); without the certificate, or once the row is revoked, the
/// same call is `UNAUTHENTICATED`.
#[tokio::test]
async fn a_client_certificate_proves_the_principal_that_names_its_subject() {
    use belay_proto::v1::{ClaimTasksRequest, worker_service_client::WorkerServiceClient};
    let pki = pki();
    let db = TestDb::create(Backend::Sqlite, "belay_tls").await;
    let engine = Engine::start(EngineOptions {
        tls: Some(pki.settings.clone()),
        ..EngineOptions::new(db.url.clone(), 2)
    })
    .await
    .expect("engine");
    let store = engine.coordinator().store().clone();
    store
        .create_principal(&belay_engine::store::NewPrincipal {
            key_id: "00000000000000aa".into(),
            principal: "worker-a".into(),
            role: "worker".into(),
            tenants: None,
            grants: Vec::new(),
            secret_sha256: None,
            cert_subject: Some("CN=worker-a,O=Acme".into()),
            description: String::new(),
            created_by: "test".into(),
            expires_in_ms: None,
        })
        .await
        .expect("certificate principal");
    let grpc = bind().await;
    let url = format!("https://{}", grpc.local_addr().expect("addr"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(engine.serve(Listeners::grpc_only(grpc), async {
        let _ = stopped.await;
    }));
    let claim = |options: ConnectOptions| async move {
        WorkerServiceClient::new(options.connect_lazy().expect("channel"))
            .claim_tasks(ClaimTasksRequest {
                worker_id: "w1".into(),
                max_tasks: 1,
                wait_ms: 0,
                capabilities: None,
            })
            .await
    };
    let with_cert = || {
        ConnectOptions::new(&url)
            .with_ca_file(pki.files.path("ca.pem"))
            .with_client_cert(
                pki.files.path("client.pem"),
                pki.files.path("client-key.pem"),
            )
    };
    claim(with_cert())
        .await
        .expect("the certificate proves worker-a");
    let without = claim(ConnectOptions::new(&url).with_ca_file(pki.files.path("ca.pem")))
        .await
        .expect_err("no certificate, no key");
    assert_eq!(without.code(), tonic::Code::Unauthenticated);
    store
        .revoke_principal("00000000000000aa")
        .await
        .expect("revoke")
        .expect("row");
    let revoked = claim(with_cert()).await.expect_err("revoked");
    assert_eq!(revoked.code(), tonic::Code::Unauthenticated);
    assert!(
        revoked.message().contains("revoked"),
        "{}",
        revoked.message()
    );
    let _ = stop.send(());
    served.await.expect("join").expect("served");
    db.drop().await;
}
