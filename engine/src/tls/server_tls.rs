//! The rustls server configurations of an engine's listeners, built once
//! from [`TlsSettings`] and sharing one [`CertResolver`].

use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use tokio_rustls::TlsAcceptor;

use super::certs::{self, CertResolver};
use super::{TlsError, TlsSettings};

/// What a listener speaks over TLS, which is what it offers in ALPN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// gRPC: HTTP/2 only (`h2`); tonic serves no HTTP/1.
    Grpc,
    /// The HTTP endpoints (admin, callbacks, MCP): `http/1.1` only. axum is
    /// built with its `http1` feature alone; none of them needs HTTP/2.
    Http1,
}

impl Protocol {
    fn alpn(self) -> Vec<Vec<u8>> {
        match self {
            Protocol::Grpc => vec![b"h2".to_vec()],
            Protocol::Http1 => vec![b"http/1.1".to_vec()],
        }
    }
}

/// TLS as an engine serves it: the certificate (reloaded when its files
/// change) and the client CA. Cheap to clone.
#[derive(Clone)]
pub struct ServerTls {
    resolver: Arc<CertResolver>,
    grpc: TlsAcceptor,
    http: TlsAcceptor,
    reload_interval: Duration,
    mtls: bool,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("resolver", &self.resolver)
            .field("client_ca", &self.mtls)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Loads the files of `settings` (aws-lc-rs, TLS 1.3 and 1.2).
    ///
    /// Errors: [`TlsError::Read`], [`TlsError::Pem`],
    /// [`TlsError::KeyMismatch`], [`TlsError::Config`].
    pub fn load(settings: &TlsSettings) -> Result<ServerTls, TlsError> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let resolver = Arc::new(CertResolver::load(
            &settings.cert,
            &settings.key,
            Arc::clone(&provider),
        )?);
        let config = |protocol: Protocol| -> Result<TlsAcceptor, TlsError> {
            let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
                .with_safe_default_protocol_versions()
                .map_err(|e| TlsError::Config(e.to_string()))?;
            let builder = match &settings.client_ca {
                Some(ca) => builder.with_client_cert_verifier(client_verifier(ca, &provider)?),
                None => builder.with_no_client_auth(),
            };
            let mut config = builder.with_cert_resolver(Arc::clone(&resolver) as _);
            config.alpn_protocols = protocol.alpn();
            Ok(TlsAcceptor::from(Arc::new(config)))
        };
        Ok(ServerTls {
            grpc: config(Protocol::Grpc)?,
            http: config(Protocol::Http1)?,
            resolver,
            reload_interval: settings.reload_interval,
            mtls: settings.client_ca.is_some(),
        })
    }

    /// The acceptor of listeners that speak `protocol`.
    pub fn acceptor(&self, protocol: Protocol) -> TlsAcceptor {
        match protocol {
            Protocol::Grpc => self.grpc.clone(),
            Protocol::Http1 => self.http.clone(),
        }
    }

    /// The certificate resolver, whose reload step tests call directly
    /// ([`CertResolver::reload_if_changed`], [`CertResolver::reload`]).
    pub fn resolver(&self) -> &Arc<CertResolver> {
        &self.resolver
    }

    /// Whether client certificates are asked for (a client CA is set).
    pub fn asks_for_client_certs(&self) -> bool {
        self.mtls
    }

    /// The reload step: see [`CertResolver::reload_if_changed`].
    ///
    /// Errors: as [`ServerTls::load`], and the certificate in use stays.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        self.resolver.reload_if_changed()
    }

    /// Polls the files every reload interval of the settings and reloads
    /// them when they changed, until the task is aborted. A zero interval
    /// polls nothing (the task ends at once).
    pub fn spawn_reloader(&self) -> tokio::task::JoinHandle<()> {
        let resolver = Arc::clone(&self.resolver);
        let interval = self.reload_interval;
        tokio::spawn(async move {
            if interval.is_zero() {
                return;
            }
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                // Logged inside; the certificate in use stays on error.
                let _ = resolver.reload_if_changed();
            }
        })
    }
}

fn client_verifier(
    ca: &std::path::Path,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    let roots = certs::load_roots(ca)?;
    // Clients without a certificate are let in: they authenticate with an
    // API key. A certificate that is presented must verify.
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(provider))
        .allow_unauthenticated()
        .build()
        .map_err(|e| TlsError::Config(format!("the TLS client CA {}: {e}", ca.display())))
}
