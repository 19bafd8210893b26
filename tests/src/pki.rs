//! A test CA and the certificates an engine, its workers and the CLI use
//! over TLS ([`TestPki`]), as PEM files in a directory of their own.

use std::path::{Path, PathBuf};

use anyhow::Result;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};

/// The subject of the client certificate of [`TestPki`] (RFC 4514).
pub const CLIENT_SUBJECT: &str = "CN=worker-a,O=Acme";

/// A CA (`ca.pem`), a server certificate for 127.0.0.1 and localhost
/// (`server.pem`, `server-key.pem`) and a client certificate
/// [`CLIENT_SUBJECT`] (`client.pem`, `client-key.pem`), all from that CA;
/// and `other-ca.pem`, a CA that issued none of them. The directory is
/// removed when this is dropped.
pub struct TestPki {
    dir: PathBuf,
}

impl TestPki {
    /// Makes the CA and the certificates and writes them.
    ///
    /// Errors: generating or writing them.
    pub fn generate() -> Result<TestPki> {
        let dir = std::env::temp_dir().join(format!("belay-pki-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir)?;
        let pki = TestPki { dir };
        let ca = ca("Belay test CA")?;
        pki.write("ca.pem", &ca.pem())?;
        pki.write("other-ca.pem", &self::ca("Another CA")?.pem())?;
        let (cert, key) = leaf(&ca, "engine", ExtendedKeyUsagePurpose::ServerAuth)?;
        pki.write("server.pem", &cert)?;
        pki.write("server-key.pem", &key)?;
        let (cert, key) = leaf(&ca, "worker-a", ExtendedKeyUsagePurpose::ClientAuth)?;
        pki.write("client.pem", &cert)?;
        pki.write("client-key.pem", &key)?;
        Ok(pki)
    }

    fn write(&self, name: &str, content: &str) -> Result<()> {
        std::fs::write(self.dir.join(name), content)?;
        Ok(())
    }

    /// The path of `name` (`ca.pem`, `server.pem`, …).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The directory of the files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The engine's flags: its certificate, and the CA of client
    /// certificates.
    pub fn engine_args(&self) -> Vec<String> {
        vec![
            "--tls-cert".into(),
            self.path("server.pem").display().to_string(),
            "--tls-key".into(),
            self.path("server-key.pem").display().to_string(),
            "--tls-client-ca".into(),
            self.path("ca.pem").display().to_string(),
        ]
    }

    /// A worker's flags: the CA, and the client certificate.
    pub fn worker_args(&self) -> Vec<String> {
        vec![
            "--ca-file".into(),
            self.path("ca.pem").display().to_string(),
            "--client-cert".into(),
            self.path("client.pem").display().to_string(),
            "--client-key".into(),
            self.path("client-key.pem").display().to_string(),
        ]
    }
}

impl Drop for TestPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ca(name: &str) -> Result<CertifiedIssuer<'static, KeyPair>> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    Ok(CertifiedIssuer::self_signed(params, KeyPair::generate()?)?)
}

/// A leaf `CN=<common_name>,O=Acme` for 127.0.0.1 and localhost: (PEM, key PEM).
fn leaf(
    ca: &CertifiedIssuer<'static, KeyPair>,
    common_name: &str,
    usage: ExtendedKeyUsagePurpose,
) -> Result<(String, String)> {
    let mut params = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])?;
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::OrganizationName, "Acme");
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, ca)?;
    Ok((cert.pem(), key.serialize_pem()))
}
