//! Client-certificate (mTLS) profiles of HTTP tools (`tls_profile:`).
//!
//! A tool names a profile; the worker's configuration says what it is: the
//! client certificate chain and its private key (PEM files), and optionally
//! a CA bundle (PEM) that then is the only set of roots the tool's server
//! certificate is checked against (a partner's private CA), instead of the
//! system's. A profile of a CA bundle alone trusts that CA and sends no
//! client certificate. The files are read when the worker starts; a profile that
//! cannot be read or used stops the start with the profile's name and the
//! path (never the file's content). Definitions and task specs carry the
//! name only.
//!
//! `--tls-profiles FILE` (`BELAY_TLS_PROFILES`), JSON:
//! `{"profiles": {"partner_mtls": {"cert": "/etc/belay/partner.crt",
//! "key": "/etc/belay/partner.key", "ca": "/etc/belay/partner-ca.pem"}}}`.
//!
//! Each profile gets its own HTTP client (a TLS identity belongs to a
//! connection pool), built like the worker's other tool client: the same
//! address checks on every resolved address (SSRF, [`crate::ssrf`]), no
//! redirects, no proxy. An OAuth token request of the same tool goes
//! without the certificate.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The `--tls-profiles` file: profile name → files.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsProfilesConfig {
    /// The profiles, by the name `tls_profile:` gives.
    #[serde(default)]
    pub profiles: BTreeMap<String, TlsProfileConfig>,
}

/// One profile's files: `cert` and `key` together (the client
/// certificate), `ca`, or all three.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsProfileConfig {
    /// PEM: the client certificate, then any intermediates.
    #[serde(default)]
    pub cert: Option<PathBuf>,
    /// PEM: the certificate's private key (PKCS#8, PKCS#1 or SEC1).
    #[serde(default)]
    pub key: Option<PathBuf>,
    /// PEM: CA certificates; when given, the only roots the server's
    /// certificate is checked against.
    #[serde(default)]
    pub ca: Option<PathBuf>,
}

impl TlsProfilesConfig {
    /// Parses the file's text; names are checked as the tools parser
    /// checks `tls_profile:` (1 to 64 of `A-Za-z0-9_.-`).
    pub fn from_json(text: &str) -> Result<Self, String> {
        let config: Self = serde_json::from_str(text).map_err(|e| e.to_string())?;
        for name in config.profiles.keys() {
            let ok = !name.is_empty()
                && name.chars().count() <= 64
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
            if !ok {
                return Err(format!(
                    "profile name {name:?} must be 1 to 64 letters, digits, `_`, `-` or `.`"
                ));
            }
        }
        Ok(config)
    }

    /// Reads and parses the file at `path`; none (or empty) is no profiles.
    pub fn load(path: Option<&str>) -> Result<Self, String> {
        let Some(path) = path.filter(|p| !p.is_empty()) else {
            return Ok(Self::default());
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--tls-profiles {path}: cannot read: {e}"))?;
        let config = Self::from_json(&text).map_err(|e| format!("--tls-profiles {path}: {e}"))?;
        for (name, profile) in &config.profiles {
            profile
                .read()
                .map_err(|e| format!("--tls-profiles {path}: profile `{name}`: {e}"))?;
        }
        Ok(config)
    }
}

/// What a profile's files hold, read.
pub(super) struct TlsMaterial {
    /// The certificate chain and the key, as [`reqwest::Identity`] takes
    /// them (none for a profile of a CA bundle only).
    pub identity: Option<reqwest::Identity>,
    /// The CA bundle, when given.
    pub roots: Option<Vec<reqwest::Certificate>>,
}

impl TlsProfileConfig {
    /// Reads the files. Errors name the file, never its content.
    pub(super) fn read(&self) -> Result<TlsMaterial, String> {
        let read = |what: &str, path: &Path| {
            std::fs::read(path)
                .map_err(|e| format!("cannot read the {what} {}: {e}", path.display()))
        };
        let identity = match (&self.cert, &self.key) {
            (Some(cert), Some(key_path)) => {
                let mut pem = read("certificate", cert)?;
                if !pem.ends_with(b"\n") {
                    pem.push(b'\n');
                }
                let key = read("key", key_path)?;
                pem.extend_from_slice(&key);
                Some(reqwest::Identity::from_pem(&pem).map_err(|_| {
                    format!(
                        "{} and {} are not a PEM certificate and private key",
                        cert.display(),
                        key_path.display()
                    )
                })?)
            }
            (None, None) if self.ca.is_some() => None,
            (None, None) => return Err("needs `cert` and `key`, or `ca`".into()),
            _ => return Err("`cert` and `key` go together".into()),
        };
        let roots = match &self.ca {
            None => None,
            Some(ca) => {
                let bundle = read("CA bundle", ca)?;
                let certs = reqwest::Certificate::from_pem_bundle(&bundle)
                    .ok()
                    .filter(|c| !c.is_empty())
                    .ok_or_else(|| format!("{} holds no PEM certificate", ca.display()))?;
                Some(certs)
            }
        };
        Ok(TlsMaterial { identity, roots })
    }
}

/// The TLS alert, when `err` is the server refusing the handshake over the
/// client certificate (TLS 1.3 reports it after the client's last
/// handshake flight, so it surfaces when the answer is read).
pub(super) fn client_certificate_refused(err: &reqwest::Error) -> Option<String> {
    use rustls::AlertDescription as A;
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(inner) = source {
        // `io::Error::source` skips the error it wraps: look inside too.
        let wrapped = inner
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .map(|e| e as &(dyn std::error::Error + 'static));
        for candidate in [Some(inner), wrapped].into_iter().flatten() {
            if let Some(rustls::Error::AlertReceived(alert)) =
                candidate.downcast_ref::<rustls::Error>()
                && matches!(
                    alert,
                    A::CertificateRequired
                        | A::BadCertificate
                        | A::UnsupportedCertificate
                        | A::CertificateRevoked
                        | A::CertificateExpired
                        | A::CertificateUnknown
                        | A::UnknownCA
                )
            {
                return Some(format!("TLS alert {alert:?}"));
            }
        }
        source = inner.source();
    }
    None
}
