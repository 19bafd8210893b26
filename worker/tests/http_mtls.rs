//! `tls_profile:` against a real local TLS server that requires a client
//! certificate (tokio-rustls; certificates made here with rcgen): with the
//! profile the call succeeds and the server sees the profile's
//! certificate; without one the server refuses the handshake and the
//! call's error says so (`REJECTED`); a profile this worker lacks is
//! `NOT_SENT` before any connection; the address policy (SSRF) still
//! applies to profile clients; bad profile files are errors at start.
#![allow(missing_docs, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use belay_proto::v1::FailureClass;
use belay_proto::wire::{HttpBinding, HttpRequestOptions, ToolBinding, ToolCallSpec};
use belay_worker::http_tool::TlsProfilesConfig;
use belay_worker::http_tool::tls::TlsProfileConfig;
use belay_worker::{HttpToolClient, HttpToolError, NetworkPolicy};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig, crypto};

struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        Ca {
            issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    /// A leaf certificate for `names` (DNS names or IP addresses): its DER
    /// and PEM, and its key's PEM.
    fn leaf(&self, common_name: &str, names: &[&str]) -> (CertificateDer<'static>, String, String) {
        let mut params =
            CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
                .unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.der().clone(), cert.pem(), key.serialize_pem())
    }
}

/// What the server saw.
#[derive(Default)]
struct Seen {
    /// TCP connections accepted.
    connections: AtomicUsize,
    /// Handshakes that failed, with rustls's reason.
    failed: Mutex<Vec<String>>,
    /// The client certificate of each request served.
    client_certs: Mutex<Vec<CertificateDer<'static>>>,
}

/// An HTTPS server on 127.0.0.1 that requires a client certificate issued
/// by `client_ca` and answers every request `{"hello": "mtls"}`.
async fn mtls_server(server_ca: &Ca, client_ca: &Ca) -> (String, Arc<Seen>) {
    let provider = Arc::new(crypto::aws_lc_rs::default_provider());
    let mut roots = RootCertStore::empty();
    roots.add(client_ca.issuer.der().clone()).unwrap();
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .unwrap();
    let (server_der, _, server_key) = server_ca.leaf("tools.test", &["127.0.0.1"]);
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(rustls_pem_key_der(&server_key)));
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![server_der], key)
        .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let log = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            log.connections.fetch_add(1, Ordering::SeqCst);
            let acceptor = acceptor.clone();
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                let mut tls = match acceptor.accept(tcp).await {
                    Ok(tls) => tls,
                    Err(e) => {
                        log.failed.lock().unwrap().push(e.to_string());
                        return;
                    }
                };
                // One HTTP/1.1 request: headers, then Content-Length bytes.
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let body_start = loop {
                    let Ok(n) = tls.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break at + 4;
                    }
                };
                let head = String::from_utf8_lossy(&buf[..body_start]).to_ascii_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().unwrap());
                while buf.len() < body_start + length {
                    let Ok(n) = tls.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                if let Some(certs) = tls.get_ref().1.peer_certificates() {
                    log.client_certs
                        .lock()
                        .unwrap()
                        .push(certs[0].clone().into_owned());
                }
                let body = r#"{"hello": "mtls"}"#;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tls.write_all(answer.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (format!("https://{addr}"), seen)
}

/// The DER of a PKCS#8 private key PEM.
fn rustls_pem_key_der(pem: &str) -> Vec<u8> {
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    PrivatePkcs8KeyDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .secret_pkcs8_der()
        .to_vec()
}

/// A fresh directory for this test's PEM files.
fn dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("belay-mtls-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn spec(endpoint: &str, profile: Option<&str>) -> ToolCallSpec {
    ToolCallSpec {
        tool: "partner_lookup".into(),
        tool_version: 1,
        arguments: json!({"q": "x"}),
        binding: ToolBinding::Http(HttpBinding {
            endpoint: endpoint.into(),
            method: "POST".into(),
            headers: BTreeMap::new(),
            timeout_ms: 5_000,
            request: HttpRequestOptions {
                tls_profile: profile.map(str::to_owned),
                ..HttpRequestOptions::default()
            },
        }),
        idempotency_key: "run-1/n.t1".into(),
        input: None,
        config_params: Vec::new(),
        result_secrets: Vec::new(),
        variant: None,
        sampling: None,
        trace: None,
        dispatch_with_claim: false,
        repeat_safety: String::new(),
    }
}

struct Setup {
    url: String,
    seen: Arc<Seen>,
    client_der: CertificateDer<'static>,
    profiles: TlsProfilesConfig,
}

/// A server, and the profiles: `partner` (a client certificate of the CA
/// the server trusts, and the server's CA), `ca_only` (the server's CA, no
/// certificate), `stranger` (a certificate of another CA).
async fn setup(test: &str) -> Setup {
    let server_ca = Ca::new("server ca");
    let client_ca = Ca::new("client ca");
    let other_ca = Ca::new("other ca");
    let (url, seen) = mtls_server(&server_ca, &client_ca).await;
    let dir = dir(test);
    let (client_der, client_pem, client_key) = client_ca.leaf("belay-worker", &[]);
    let (_, stranger_pem, stranger_key) = other_ca.leaf("stranger", &[]);
    let ca = write(&dir, "server-ca.pem", &server_ca.issuer.pem());
    let profile = |cert: Option<PathBuf>, key: Option<PathBuf>| TlsProfileConfig {
        cert,
        key,
        ca: Some(ca.clone()),
    };
    let profiles = TlsProfilesConfig {
        profiles: BTreeMap::from([
            (
                "partner".to_owned(),
                profile(
                    Some(write(&dir, "client.crt", &client_pem)),
                    Some(write(&dir, "client.key", &client_key)),
                ),
            ),
            ("ca_only".to_owned(), profile(None, None)),
            (
                "stranger".to_owned(),
                profile(
                    Some(write(&dir, "stranger.crt", &stranger_pem)),
                    Some(write(&dir, "stranger.key", &stranger_key)),
                ),
            ),
        ]),
    };
    Setup {
        url,
        seen,
        client_der,
        profiles,
    }
}

fn client(profiles: &TlsProfilesConfig, policy: NetworkPolicy) -> HttpToolClient {
    HttpToolClient::new(None, policy)
        .unwrap()
        .with_tls_profiles(profiles)
        .unwrap()
}

#[tokio::test]
async fn with_the_profile_the_call_succeeds_and_the_server_sees_the_certificate() {
    let s = setup("ok").await;
    let tools = client(&s.profiles, NetworkPolicy::allowing_loopback());
    let result = tools
        .call(&spec(&format!("{}/lookup", s.url), Some("partner")))
        .await
        .unwrap();
    assert_eq!(result, json!({"hello": "mtls"}));
    assert_eq!(
        *s.seen.client_certs.lock().unwrap(),
        vec![s.client_der.clone()]
    );
}

#[tokio::test]
async fn without_a_client_certificate_the_handshake_fails_and_the_error_says_so() {
    let s = setup("none").await;
    let tools = client(&s.profiles, NetworkPolicy::allowing_loopback());
    let url = format!("{}/lookup", s.url);
    // The server's certificate is trusted (the profile's CA), but no client
    // certificate is sent.
    let err = tools.call(&spec(&url, Some("ca_only"))).await.unwrap_err();
    assert!(
        matches!(err, HttpToolError::ClientCertificate { .. }),
        "{err:?}"
    );
    assert_eq!(err.class(), FailureClass::Rejected);
    let message = err.to_string();
    assert!(message.contains("CertificateRequired"), "{message}");
    assert!(
        message.contains("give the tool a `tls_profile:`"),
        "{message}"
    );
    // A certificate the server does not trust.
    let err = tools.call(&spec(&url, Some("stranger"))).await.unwrap_err();
    assert!(
        matches!(err, HttpToolError::ClientCertificate { .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("does not accept the certificate"),
        "{err}"
    );
    // Without any profile the worker does not even trust the server (a
    // private CA): the call fails to connect, nothing sent.
    let err = tools.call(&spec(&url, None)).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::NotSent, "{err}");
    assert!(s.seen.client_certs.lock().unwrap().is_empty());
    // Every handshake failed on the server's side (the last one records
    // its failure as the client gives up: wait for it).
    for _ in 0..100 {
        if s.seen.failed.lock().unwrap().len() == 3 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(s.seen.failed.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn an_unknown_profile_is_not_sent_and_the_address_policy_still_applies() {
    let s = setup("policy").await;
    let url = format!("{}/lookup", s.url);
    let tools = client(&s.profiles, NetworkPolicy::allowing_loopback());
    let err = tools.prepare(&spec(&url, Some("nope"))).unwrap_err();
    assert!(
        matches!(err, HttpToolError::UnknownTlsProfile(_)),
        "{err:?}"
    );
    assert_eq!(err.class(), FailureClass::NotSent);
    assert!(
        err.to_string()
            .contains("`nope` is not configured on this worker"),
        "{err}"
    );
    // The default policy refuses loopback for profile clients too.
    let strict = client(&s.profiles, NetworkPolicy::default());
    let err = strict.call(&spec(&url, Some("partner"))).await.unwrap_err();
    assert!(matches!(err, HttpToolError::Refused(_)), "{err:?}");
    let err = strict
        .call(&spec("https://localhost:1/lookup", Some("partner")))
        .await
        .unwrap_err();
    assert!(matches!(err, HttpToolError::Refused(_)), "{err:?}");
    assert_eq!(s.seen.connections.load(Ordering::SeqCst), 0);
}

#[test]
fn bad_profiles_are_errors_at_start_naming_the_profile_and_the_file() {
    let parse = |text: &str| TlsProfilesConfig::from_json(text).unwrap_err();
    assert!(parse(r#"{"profiles": {"a": {"cert": "/c", "kee": "/k"}}}"#).contains("unknown field"));
    assert!(parse(r#"{"profiles": {"a b": {"ca": "/c"}}}"#).contains("profile name"));
    let dir = dir("bad");
    let missing = TlsProfilesConfig {
        profiles: BTreeMap::from([(
            "partner".to_owned(),
            TlsProfileConfig {
                cert: Some(dir.join("nope.crt")),
                key: Some(dir.join("nope.key")),
                ca: None,
            },
        )]),
    };
    let err = HttpToolClient::new(None, NetworkPolicy::default())
        .unwrap()
        .with_tls_profiles(&missing)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("TLS profile `partner`") && err.contains("nope.crt"),
        "{err}"
    );
    let garbage = write(&dir, "garbage.pem", "not a certificate");
    let not_pem = TlsProfilesConfig {
        profiles: BTreeMap::from([(
            "partner".to_owned(),
            TlsProfileConfig {
                cert: Some(garbage.clone()),
                key: Some(garbage),
                ca: None,
            },
        )]),
    };
    let err = HttpToolClient::new(None, NetworkPolicy::default())
        .unwrap()
        .with_tls_profiles(&not_pem)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("not a PEM certificate and private key"),
        "{err}"
    );
    let only_cert = r#"{"profiles": {"a": {"cert": "/c"}}}"#;
    let config = TlsProfilesConfig::from_json(only_cert).unwrap();
    let err = HttpToolClient::new(None, NetworkPolicy::default())
        .unwrap()
        .with_tls_profiles(&config)
        .unwrap_err()
        .to_string();
    assert!(err.contains("`cert` and `key` go together"), "{err}");
}
