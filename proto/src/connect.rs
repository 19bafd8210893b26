//! The one way clients (worker, SDK, CLI) connect to an engine:
//! [`ConnectOptions`] give the URL, the trust and the API key, and make a
//! lazily connecting channel that sends `authorization: Bearer <key>` with
//! every request ([`AuthChannel`]).
//!
//! `https://` URLs use TLS (rustls, aws-lc-rs): with a CA file, only that
//! CA is trusted (a private CA, a test CA); without one, the system's
//! trust store (`rustls-native-certs`, already in the tree through
//! reqwest, rather than a copy of Mozilla's roots compiled in). `http://`
//! is plaintext, and refuses TLS options rather than ignore them.

use std::path::{Path, PathBuf};

use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Request, Status};

/// A channel whose every request carries the API key.
pub type AuthChannel = InterceptedService<Channel, BearerAuth>;

/// How to reach an engine. The API key never shows in `Debug` output.
#[derive(Clone, Default)]
pub struct ConnectOptions {
    /// `http://host:port` (plaintext) or `https://host:port` (TLS).
    pub url: String,
    /// CA certificates (PEM) the engine's certificate must chain to; `None`:
    /// the system's trust store. Only with `https://`.
    pub ca_file: Option<PathBuf>,
    /// Client certificate chain (PEM) for mTLS; needs `client_key`. Only
    /// with `https://`.
    pub client_cert: Option<PathBuf>,
    /// Private key (PEM) of `client_cert`.
    pub client_key: Option<PathBuf>,
    /// Sent as `authorization: Bearer <api_key>` with every request; `None`
    /// (or empty): no header.
    pub api_key: Option<String>,
}

impl std::fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectOptions")
            .field("url", &self.url)
            .field("ca_file", &self.ca_file)
            .field("client_cert", &self.client_cert)
            .field("client_key", &self.client_key)
            .field("api_key", &self.api_key.as_ref().map(|_| "<hidden>"))
            .finish()
    }
}

/// Why a channel could not be configured. Nothing here is about the
/// engine being unreachable: the channel connects lazily.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The URL does not parse, or is not `http://` or `https://`.
    #[error("engine URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL given.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// A TLS option was given with an `http://` URL.
    #[error(
        "{option} is set, but the engine URL {url:?} is plaintext http://: use https:// to connect with TLS, or drop {option}"
    )]
    TlsOptionWithoutHttps {
        /// The URL given.
        url: String,
        /// The option, e.g. `the CA file`.
        option: &'static str,
    },
    /// A client certificate without its key, or the reverse.
    #[error("{0}")]
    IncompleteIdentity(&'static str),
    /// A file could not be read.
    #[error("reading {what} {}: {source}", path.display())]
    Read {
        /// Which file, e.g. `the CA file`.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// A file holds no PEM block of the kind expected.
    #[error("{what} {} holds no PEM {block} block", path.display())]
    Pem {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// The block looked for, e.g. `CERTIFICATE`.
        block: &'static str,
    },
    /// The API key cannot be sent in a header (only visible ASCII is).
    #[error(
        "the API key is not a valid header value (only visible ASCII characters, no spaces or line breaks): check what was pasted"
    )]
    InvalidApiKey,
    /// The TLS configuration was refused (bad PEM content, no trust store).
    #[error("TLS configuration for {url:?}: {message}")]
    Tls {
        /// The URL given.
        url: String,
        /// Cause, with its own causes.
        message: String,
    },
}

impl ConnectOptions {
    /// Options for `url` with nothing else set.
    pub fn new(url: impl Into<String>) -> ConnectOptions {
        ConnectOptions {
            url: url.into(),
            ..ConnectOptions::default()
        }
    }

    /// The same options with `api_key`.
    pub fn with_api_key(mut self, api_key: impl Into<String>) -> ConnectOptions {
        self.api_key = Some(api_key.into());
        self
    }

    /// The same options trusting only the CA certificates in `ca_file`.
    pub fn with_ca_file(mut self, ca_file: impl Into<PathBuf>) -> ConnectOptions {
        self.ca_file = Some(ca_file.into());
        self
    }

    /// The same options presenting `cert` with `key` (mTLS).
    pub fn with_client_cert(
        mut self,
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> ConnectOptions {
        self.client_cert = Some(cert.into());
        self.client_key = Some(key.into());
        self
    }

    /// Whether the URL asks for TLS (`https://`).
    pub fn is_tls(&self) -> bool {
        scheme_of(&self.url).is_some_and(|s| s.eq_ignore_ascii_case("https"))
    }

    /// The endpoint of the URL with TLS configured as the options say
    /// (timeouts and keep-alive are the caller's to add). Reads the files.
    ///
    /// Errors: every [`ConnectError`] but [`ConnectError::InvalidApiKey`].
    pub fn endpoint(&self) -> Result<Endpoint, ConnectError> {
        let url = self.url.trim();
        let invalid = |reason: String| ConnectError::InvalidUrl {
            url: self.url.clone(),
            reason,
        };
        let tls = match scheme_of(url) {
            Some(s) if s.eq_ignore_ascii_case("https") => true,
            Some(s) if s.eq_ignore_ascii_case("http") => false,
            _ => {
                return Err(invalid(
                    "must start with http:// (plaintext) or https:// (TLS)".into(),
                ));
            }
        };
        let endpoint = Endpoint::from_shared(url.to_owned()).map_err(|e| invalid(e.to_string()))?;
        if !tls {
            self.check_plaintext()?;
            return Ok(endpoint);
        }
        endpoint
            .tls_config(self.client_tls()?)
            .map_err(|e| ConnectError::Tls {
                url: self.url.clone(),
                message: error_chain(&e),
            })
    }

    /// The interceptor that adds the API key.
    ///
    /// Errors: [`ConnectError::InvalidApiKey`].
    pub fn auth(&self) -> Result<BearerAuth, ConnectError> {
        BearerAuth::new(self.api_key.as_deref())
    }

    /// A channel that connects on its first request (and reconnects after a
    /// loss), with the API key on every request.
    ///
    /// Errors: as [`ConnectOptions::endpoint`] and [`ConnectOptions::auth`].
    pub fn connect_lazy(&self) -> Result<AuthChannel, ConnectError> {
        self.connect_lazy_with(|endpoint| endpoint)
    }

    /// [`ConnectOptions::connect_lazy`] with the endpoint adjusted by
    /// `configure` first (timeouts, keep-alive, `TCP_NODELAY`).
    ///
    /// Errors: as [`ConnectOptions::connect_lazy`].
    pub fn connect_lazy_with(
        &self,
        configure: impl FnOnce(Endpoint) -> Endpoint,
    ) -> Result<AuthChannel, ConnectError> {
        let auth = self.auth()?;
        let channel = configure(self.endpoint()?).connect_lazy();
        Ok(InterceptedService::new(channel, auth))
    }

    fn check_plaintext(&self) -> Result<(), ConnectError> {
        let refuse = |option| ConnectError::TlsOptionWithoutHttps {
            url: self.url.clone(),
            option,
        };
        if self.ca_file.is_some() {
            return Err(refuse("a CA file (--ca-file, BELAY_CA_FILE)"));
        }
        if self.client_cert.is_some() || self.client_key.is_some() {
            return Err(refuse("a client certificate (--client-cert, --client-key)"));
        }
        Ok(())
    }

    fn client_tls(&self) -> Result<ClientTlsConfig, ConnectError> {
        let mut config = ClientTlsConfig::new();
        config = match &self.ca_file {
            Some(path) => config.ca_certificate(Certificate::from_pem(read_pem(
                "the CA file",
                path,
                "CERTIFICATE",
            )?)),
            None => config.with_native_roots(),
        };
        match (&self.client_cert, &self.client_key) {
            (Some(cert), Some(key)) => {
                let cert = read_pem("the client certificate", cert, "CERTIFICATE")?;
                let key = read_pem("the client key", key, "PRIVATE KEY")?;
                config = config.identity(Identity::from_pem(cert, key));
            }
            (Some(_), None) => {
                return Err(ConnectError::IncompleteIdentity(
                    "a client certificate (--client-cert) needs its key (--client-key)",
                ));
            }
            (None, Some(_)) => {
                return Err(ConnectError::IncompleteIdentity(
                    "a client key (--client-key) needs its certificate (--client-cert)",
                ));
            }
            (None, None) => {}
        }
        Ok(config)
    }
}

/// A status's message with the causes of a transport failure after it
/// (tonic's message alone is often `transport error`; rustls' reason, e.g.
/// `invalid peer certificate: UnknownIssuer`, is a source), each cause once.
pub fn status_detail(status: &Status) -> String {
    let mut text = status.message().to_owned();
    let mut source = std::error::Error::source(status);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// `e` and its sources, `: `-separated (tonic's transport error says only
/// "transport error" itself).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The scheme of `url`, if it has one (`https` of `https://…`).
fn scheme_of(url: &str) -> Option<&str> {
    url.trim().split_once("://").map(|(scheme, _)| scheme)
}

/// The file at `path`, which must hold a PEM block whose label ends in
/// `block` (`PRIVATE KEY` matches PKCS#8, `RSA` and `EC` keys).
fn read_pem(what: &'static str, path: &Path, block: &'static str) -> Result<Vec<u8>, ConnectError> {
    let pem = std::fs::read(path).map_err(|source| ConnectError::Read {
        what,
        path: path.to_owned(),
        source,
    })?;
    let text = String::from_utf8_lossy(&pem);
    let has_block = text.lines().any(|line| {
        line.trim()
            .strip_prefix("-----BEGIN ")
            .and_then(|rest| rest.strip_suffix("-----"))
            .is_some_and(|label| label.ends_with(block))
    });
    if !has_block {
        return Err(ConnectError::Pem {
            what,
            path: path.to_owned(),
            block,
        });
    }
    Ok(pem)
}

/// Adds `authorization: Bearer <key>` to every request (nothing without a
/// key). `Debug` shows whether there is a key, never the key.
#[derive(Clone)]
pub struct BearerAuth {
    header: Option<AsciiMetadataValue>,
}

impl std::fmt::Debug for BearerAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let key = if self.header.is_some() {
            "<hidden>"
        } else {
            "none"
        };
        f.debug_struct("BearerAuth").field("key", &key).finish()
    }
}

impl BearerAuth {
    /// The interceptor for `api_key` (`None` or blank: no header).
    ///
    /// Errors: [`ConnectError::InvalidApiKey`] for a key with characters a
    /// header cannot carry (the error does not repeat the key).
    pub fn new(api_key: Option<&str>) -> Result<BearerAuth, ConnectError> {
        let header = match api_key.map(str::trim).filter(|k| !k.is_empty()) {
            None => None,
            Some(key) => {
                if !key.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err(ConnectError::InvalidApiKey);
                }
                let mut value: AsciiMetadataValue =
                    MetadataValue::try_from(format!("Bearer {key}"))
                        .map_err(|_| ConnectError::InvalidApiKey)?;
                // Kept out of HTTP/2 header compression tables.
                value.set_sensitive(true);
                Some(value)
            }
        };
        Ok(BearerAuth { header })
    }
}

impl tonic::service::Interceptor for BearerAuth {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(header) = &self.header {
            request
                .metadata_mut()
                .insert("authorization", header.clone());
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::service::Interceptor;

    #[test]
    fn the_key_goes_into_the_authorization_header_and_never_into_debug() {
        let options = ConnectOptions::new("http://127.0.0.1:1").with_api_key("bk_secret123");
        let shown = format!("{options:?}");
        assert!(!shown.contains("bk_secret123"), "{shown}");
        let mut auth = options.auth().expect("valid key");
        let shown = format!("{auth:?}");
        assert!(!shown.contains("bk_secret123"), "{shown}");
        let request = auth.call(Request::new(())).expect("intercepted");
        assert_eq!(
            request
                .metadata()
                .get("authorization")
                .and_then(|v| v.to_str().ok()),
            Some("Bearer bk_secret123")
        );
        let mut none = BearerAuth::new(Some("  ")).expect("blank is none");
        let request = none.call(Request::new(())).expect("intercepted");
        assert!(request.metadata().get("authorization").is_none());
    }

    #[test]
    fn a_key_a_header_cannot_carry_is_refused_without_repeating_it() {
        for bad in ["bk_one two", "bk_\u{e9}t\u{e9}", "bk_a\nb"] {
            let err = BearerAuth::new(Some(bad)).expect_err(bad);
            assert!(matches!(err, ConnectError::InvalidApiKey), "{err}");
            assert!(!err.to_string().contains("bk_"), "{err}");
        }
    }

    #[test]
    fn tls_options_with_a_plaintext_url_are_refused() {
        let err = ConnectOptions::new("http://127.0.0.1:1")
            .with_ca_file("/tmp/ca.pem")
            .endpoint()
            .expect_err("CA with http");
        let text = err.to_string();
        assert!(
            text.contains("CA file") && text.contains("use https://"),
            "{text}"
        );
        let err = ConnectOptions::new("http://127.0.0.1:1")
            .with_client_cert("/tmp/c.pem", "/tmp/k.pem")
            .endpoint()
            .expect_err("client cert with http");
        assert!(err.to_string().contains("client certificate"), "{err}");
    }

    #[test]
    fn a_url_without_a_known_scheme_is_refused() {
        for bad in ["127.0.0.1:50051", "grpc://127.0.0.1:50051", "ftp://x"] {
            let err = ConnectOptions::new(bad).endpoint().expect_err(bad);
            assert!(
                err.to_string().contains("http:// (plaintext) or https://"),
                "{err}"
            );
        }
        assert!(ConnectOptions::new("HTTPS://example.com").is_tls());
    }

    #[test]
    fn a_missing_or_empty_ca_file_is_named() {
        let err = ConnectOptions::new("https://127.0.0.1:1")
            .with_ca_file("/nonexistent/belay-ca.pem")
            .endpoint()
            .expect_err("missing");
        assert!(
            err.to_string().contains("/nonexistent/belay-ca.pem"),
            "{err}"
        );
        let dir = std::env::temp_dir().join(format!("belay-connect-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not pem").expect("write");
        let err = ConnectOptions::new("https://127.0.0.1:1")
            .with_ca_file(&empty)
            .endpoint()
            .expect_err("no PEM");
        assert!(
            err.to_string().contains("holds no PEM CERTIFICATE block"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_client_certificate_needs_its_key() {
        let options = ConnectOptions {
            client_cert: Some("/tmp/c.pem".into()),
            ..ConnectOptions::new("https://127.0.0.1:1")
        };
        let err = options.endpoint().expect_err("no key");
        assert!(err.to_string().contains("needs its key"), "{err}");
    }
}
