//! The server certificate in use and its reload from the PEM files, and
//! the client CA's roots.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::SystemTime;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use super::TlsError;

/// A file's modification time and size: what "the file changed" means.
type Stamp = Option<(SystemTime, u64)>;

/// Serves the current certificate to every handshake and swaps in a new
/// one when the files change. Shared by every TLS listener of an engine.
pub struct CertResolver {
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
    /// The stamps of the files as last loaded, and of the last attempt
    /// that failed (so a file that stays broken is warned about once).
    stamps: Mutex<Stamps>,
}

#[derive(Default)]
struct Stamps {
    loaded: (Stamp, Stamp),
    failed: Option<(Stamp, Stamp)>,
}

impl std::fmt::Debug for CertResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertResolver")
            .field("cert", &self.cert_path)
            .field("key", &self.key_path)
            .finish_non_exhaustive()
    }
}

impl CertResolver {
    /// Loads `cert` (chain, leaf first) and `key` with `provider`.
    ///
    /// Errors: [`TlsError::Read`], [`TlsError::Pem`], [`TlsError::KeyMismatch`].
    pub fn load(
        cert: &Path,
        key: &Path,
        provider: Arc<CryptoProvider>,
    ) -> Result<CertResolver, TlsError> {
        let loaded = (stamp(cert), stamp(key));
        let certified = load_certified_key(cert, key, &provider)?;
        Ok(CertResolver {
            cert_path: cert.to_owned(),
            key_path: key.to_owned(),
            provider,
            current: RwLock::new(Arc::new(certified)),
            stamps: Mutex::new(Stamps {
                loaded,
                failed: None,
            }),
        })
    }

    /// The certificate chain in use (leaf first).
    pub fn current_chain(&self) -> Vec<CertificateDer<'static>> {
        self.current().cert.clone()
    }

    fn current(&self) -> Arc<CertifiedKey> {
        Arc::clone(&self.current.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Reads both files again and uses them from the next handshake on;
    /// on any error the certificate in use stays.
    ///
    /// Errors: as [`CertResolver::load`].
    pub fn reload(&self) -> Result<(), TlsError> {
        let stamps = (stamp(&self.cert_path), stamp(&self.key_path));
        let result = load_certified_key(&self.cert_path, &self.key_path, &self.provider);
        let mut recorded = self.stamps.lock().unwrap_or_else(PoisonError::into_inner);
        match result {
            Ok(certified) => {
                *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(certified);
                recorded.loaded = stamps;
                recorded.failed = None;
                Ok(())
            }
            Err(e) => {
                recorded.failed = Some(stamps);
                Err(e)
            }
        }
    }

    /// The reload step of the poller: when either file's modification
    /// time or size differs from what was loaded, [`CertResolver::reload`].
    /// `Ok(true)`: a new certificate is in use; `Ok(false)`: nothing
    /// changed. A failed reload is logged (a warning naming the file the
    /// first time a given state of the files fails, debug after that: a
    /// half-written file is retried on the next poll) and returned.
    ///
    /// Errors: as [`CertResolver::load`].
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let stamps = (stamp(&self.cert_path), stamp(&self.key_path));
        let failed_before = {
            let recorded = self.stamps.lock().unwrap_or_else(PoisonError::into_inner);
            if recorded.loaded == stamps {
                return Ok(false);
            }
            recorded.failed == Some(stamps)
        };
        match self.reload() {
            Ok(()) => {
                tracing::info!(
                    cert = %self.cert_path.display(),
                    key = %self.key_path.display(),
                    "TLS certificate reloaded"
                );
                Ok(true)
            }
            Err(e) => {
                if failed_before {
                    tracing::debug!(error = %e, "TLS certificate reload still failing; keeping the current certificate");
                } else {
                    tracing::warn!(error = %e, "TLS certificate reload failed; keeping the current certificate");
                }
                Err(e)
            }
        }
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn stamp(path: &Path) -> Stamp {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })
}

/// Every `CERTIFICATE` block of the PEM file at `path`; at least one.
///
/// Errors: [`TlsError::Read`]; [`TlsError::Pem`] for a bad block or none.
pub(super) fn load_certs(
    what: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(what, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what,
            path: path.to_owned(),
            message: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            what,
            path: path.to_owned(),
            message: "no CERTIFICATE block".into(),
        });
    }
    Ok(certs)
}

fn load_certified_key(
    cert: &Path,
    key: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let chain = load_certs("the TLS certificate", cert)?;
    let pem = read("the TLS key", key)?;
    let private = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::Pem {
        what: "the TLS key",
        path: key.to_owned(),
        message: format!("no usable private key (PKCS#8, PKCS#1 or SEC1): {e}"),
    })?;
    CertifiedKey::from_der(chain, private, provider).map_err(|source| TlsError::KeyMismatch {
        cert: cert.to_owned(),
        key: key.to_owned(),
        source,
    })
}

/// The roots of the client CA file at `path`.
///
/// Errors: [`TlsError::Read`], [`TlsError::Pem`] (also for a certificate
/// that is not a usable trust anchor).
pub(super) fn load_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let what = "the TLS client CA";
    let mut roots = RootCertStore::empty();
    for cert in load_certs(what, path)? {
        roots.add(cert).map_err(|e| TlsError::Pem {
            what,
            path: path.to_owned(),
            message: format!("not a usable CA certificate: {e}"),
        })?;
    }
    Ok(roots)
}
