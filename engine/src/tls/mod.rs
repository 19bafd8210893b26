//! TLS for the engine's listeners (rustls, aws-lc-rs), and the one
//! connection type every endpoint serves, with the peer's identity.
//!
//! - [`TlsSettings`]: the PEM files (certificate chain, private key, and
//!   optionally the CA of client certificates) and how often they are
//!   polled for changes.
//! - [`ServerTls`]: the loaded settings. The certificate and key are
//!   reloaded when their files change ([`ServerTls::reload_if_changed`],
//!   polled by [`ServerTls::spawn_reloader`]); a failed reload (a
//!   half-written file, bad PEM, a key that does not match) keeps the
//!   certificate in use and logs a warning naming the file. With a client
//!   CA, a client *may* present a certificate (mTLS); one that does is
//!   verified against that CA (a bad one fails the handshake), one that
//!   does not is let in too and authenticates otherwise (an API key).
//! - [`Listener`]: accepts TCP (`TCP_NODELAY`), does TLS handshakes
//!   concurrently (a slow or failed handshake never holds up another
//!   connection; a failed one is logged at debug and dropped) and yields
//!   [`Connection`]s. It serves tonic ([`Listener::into_incoming`]) and
//!   axum ([`axum::serve::Listener`], see [`serve_http`]) alike, plaintext
//!   or TLS. A plaintext client on a TLS listener is answered in its own
//!   protocol that the port wants TLS ([`plaintext`]).
//! - [`check_exposure`]: a listener on a non-loopback address without TLS
//!   is refused unless the operator said `--insecure`.
//!
//! # The peer identity contract
//!
//! Every accepted connection, plaintext or TLS, carries a [`PeerInfo`]:
//! the client's address and, when it presented a certificate that the
//! client CA verified, that certificate's subject as an RFC 4514 string
//! ([`peer::subject_rfc4514`]: most significant RDN last, e.g.
//! `CN=worker-a,O=Acme`). Handlers find it the same way on every endpoint:
//!
//! - gRPC (tonic): `request.extensions().get::<PeerInfo>()` (from
//!   `tonic::transport::server::Connected` on [`Connection`], implemented
//!   in [`crate::api`], the one module of the engine that names tonic);
//! - HTTP (axum, served by [`serve_http`]): the request extension
//!   `PeerInfo`, and the extractor `ConnectInfo<PeerInfo>`.
//!
//! A plaintext connection's `client_cert_subject` is `None`; so is a TLS
//! client's that presented no certificate. A subject is only ever one the
//! client CA verified: without `client_ca` no certificate is asked for.

mod certs;
mod connection;
mod exposure;
mod http;
mod listener;
pub mod peer;
pub mod plaintext;
mod server_tls;

use std::path::PathBuf;
use std::time::Duration;

pub use certs::CertResolver;
pub use connection::Connection;
pub use exposure::{Exposure, ExposureError, check_exposure};
pub use http::serve_http;
pub use listener::{HANDSHAKE_TIMEOUT, Listener, MAX_PENDING_HANDSHAKES};
pub use peer::PeerInfo;
pub use server_tls::{Protocol, ServerTls};

/// How often the certificate and key files are checked for changes by
/// default (5 s).
pub const DEFAULT_RELOAD_INTERVAL: Duration = Duration::from_secs(5);

/// Where a TLS listener's certificate comes from (PEM files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// The certificate chain, leaf first (PEM, one or more `CERTIFICATE`
    /// blocks).
    pub cert: PathBuf,
    /// The leaf's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// CA certificates (PEM) that client certificates are verified against;
    /// `None`: no client certificate is asked for.
    pub client_ca: Option<PathBuf>,
    /// How often `cert` and `key` are checked for changes (their
    /// modification time and size).
    pub reload_interval: Duration,
}

impl TlsSettings {
    /// Settings from the `--tls-cert`, `--tls-key` and `--tls-client-ca`
    /// flags; an empty value counts as unset (a variable set empty).
    /// `Ok(None)`: no TLS.
    ///
    /// Errors: [`TlsError::Incomplete`] for a certificate without a key,
    /// a key without a certificate, or a client CA without both.
    pub fn from_flags(
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        client_ca: Option<PathBuf>,
        reload_interval: Duration,
    ) -> Result<Option<TlsSettings>, TlsError> {
        let given = |p: Option<PathBuf>| p.filter(|p| !p.as_os_str().is_empty());
        match (given(cert), given(key), given(client_ca)) {
            (Some(cert), Some(key), client_ca) => Ok(Some(TlsSettings {
                cert,
                key,
                client_ca,
                reload_interval,
            })),
            (None, None, None) => Ok(None),
            (Some(_), None, _) => Err(TlsError::Incomplete(
                "--tls-cert (BELAY_TLS_CERT) is set without --tls-key (BELAY_TLS_KEY): give both, or neither for plaintext",
            )),
            (None, Some(_), _) => Err(TlsError::Incomplete(
                "--tls-key (BELAY_TLS_KEY) is set without --tls-cert (BELAY_TLS_CERT): give both, or neither for plaintext",
            )),
            (None, None, Some(_)) => Err(TlsError::Incomplete(
                "--tls-client-ca (BELAY_TLS_CLIENT_CA) needs --tls-cert and --tls-key: client certificates are only asked for over TLS",
            )),
        }
    }
}

/// Why TLS could not be set up, or a reload was refused.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The flags name only part of what TLS needs.
    #[error("{0}")]
    Incomplete(&'static str),
    /// A file could not be read.
    #[error("reading {what} {}: {source}", path.display())]
    Read {
        /// Which file, e.g. `the TLS certificate`.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// A file holds no usable PEM of the kind expected.
    #[error("{what} {}: {message}", path.display())]
    Pem {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// What is wrong, e.g. `no CERTIFICATE block`.
        message: String,
    },
    /// The key does not fit the certificate, or rustls refused it.
    #[error("the TLS key {} does not fit the certificate {}: {source}", key.display(), cert.display())]
    KeyMismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls' reason.
        source: rustls::Error,
    },
    /// rustls refused the configuration (protocol versions, the client CA).
    #[error("TLS configuration: {0}")]
    Config(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(
        cert: Option<&str>,
        key: Option<&str>,
        ca: Option<&str>,
    ) -> Result<Option<TlsSettings>, TlsError> {
        TlsSettings::from_flags(
            cert.map(PathBuf::from),
            key.map(PathBuf::from),
            ca.map(PathBuf::from),
            DEFAULT_RELOAD_INTERVAL,
        )
    }

    #[test]
    fn a_certificate_and_a_key_come_together_or_not_at_all() {
        assert!(flags(None, None, None).expect("plaintext").is_none());
        // A variable set empty is unset.
        assert!(
            flags(Some(""), Some(""), Some(""))
                .expect("plaintext")
                .is_none()
        );
        let settings = flags(Some("c.pem"), Some("k.pem"), Some("ca.pem"))
            .expect("complete")
            .expect("TLS");
        assert_eq!(settings.client_ca, Some(PathBuf::from("ca.pem")));
        for (cert, key, ca, says) in [
            (
                Some("c.pem"),
                None,
                None,
                "--tls-cert (BELAY_TLS_CERT) is set without --tls-key",
            ),
            (
                None,
                Some("k.pem"),
                None,
                "--tls-key (BELAY_TLS_KEY) is set without --tls-cert",
            ),
            (Some("c.pem"), Some(""), None, "without --tls-key"),
            (
                None,
                None,
                Some("ca.pem"),
                "--tls-client-ca (BELAY_TLS_CLIENT_CA) needs --tls-cert and --tls-key",
            ),
        ] {
            let err = flags(cert, key, ca).expect_err(says).to_string();
            assert!(err.contains(says), "{err}");
        }
    }
}
