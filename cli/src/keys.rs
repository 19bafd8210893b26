//! `belay keys create|list|revoke`: API keys through the admin endpoint.

use belay_sdk::SdkError;
use belay_sdk::admin::AdminClient;
use belay_sdk::keys::{KeyInfo, NewKey};
use clap::Subcommand;

/// API keys (admin endpoint; an operator key manages its own tenant's).
#[derive(Subcommand)]
pub enum KeysCmd {
    /// Create a key and print it (shown this once).
    Create {
        /// Who the key proves (letters, digits, `.`, `_`, `-`, `@`).
        #[arg(long)]
        principal: String,
        /// client, worker, approver, operator or admin.
        #[arg(long)]
        role: String,
        /// Tenants it acts for, comma-separated; `*` for every tenant
        /// (default: the caller's tenant).
        #[arg(long, value_delimiter = ',')]
        tenants: Vec<String>,
        /// A grant it holds (repeatable, or comma-separated).
        #[arg(long = "grant", value_delimiter = ',')]
        grants: Vec<String>,
        /// Lifetime, e.g. `90d`, `12h` (default: no expiry).
        #[arg(long, value_parser = humantime::parse_duration)]
        expires_in: Option<std::time::Duration>,
        /// Authenticate this client-certificate subject (mTLS, RFC 4514,
        /// e.g. `CN=worker-a`) instead of making a key.
        #[arg(long)]
        cert_subject: Option<String>,
        /// Free text.
        #[arg(long, default_value = "")]
        description: String,
    },
    /// List keys: id, principal, role, tenants, status.
    List {
        /// Only keys of this tenant.
        #[arg(long = "of-tenant")]
        of_tenant: Option<String>,
    },
    /// Revoke a key: its next request is refused.
    Revoke {
        /// The key id (16 hex digits, as listed).
        key_id: String,
    },
}

/// Run a keys command against `admin`; JSON output with `as_json`.
/// Errors: the admin endpoint's, as [`SdkError`].
pub async fn run(cmd: KeysCmd, admin: AdminClient, as_json: bool) -> Result<(), SdkError> {
    match cmd {
        KeysCmd::Create {
            principal,
            role,
            tenants,
            grants,
            expires_in,
            cert_subject,
            description,
        } => {
            let created = admin
                .create_key(&NewKey {
                    principal,
                    role,
                    tenants: Some(tenants).filter(|t| !t.is_empty()),
                    grants,
                    expires_in_seconds: expires_in.map(|d| d.as_secs()),
                    cert_subject,
                    description,
                })
                .await?;
            if as_json {
                let mut v = serde_json::to_value(&created.info).unwrap_or_default();
                v["key"] = serde_json::json!(created.key);
                println!("{v}");
            } else {
                print_key(&created.info);
                match &created.key {
                    Some(key) => println!("key: {key}\n(shown once: only its hash is stored)"),
                    None => println!("certificate principal: no key"),
                }
            }
        }
        KeysCmd::List { of_tenant } => {
            let keys = admin.list_keys(of_tenant.as_deref()).await?;
            if as_json {
                println!("{}", serde_json::to_value(&keys).unwrap_or_default());
            } else {
                println!(
                    "{:<16}  {:<24}  {:<8}  {:<16}  STATUS",
                    "KEY ID", "PRINCIPAL", "ROLE", "TENANTS"
                );
                for k in &keys {
                    print_key(k);
                }
            }
        }
        KeysCmd::Revoke { key_id } => {
            let key = admin.revoke_key(&key_id).await?;
            if as_json {
                println!("{}", serde_json::to_value(&key).unwrap_or_default());
            } else {
                print_key(&key);
            }
        }
    }
    Ok(())
}

fn print_key(k: &KeyInfo) {
    println!(
        "{:<16}  {:<24}  {:<8}  {:<16}  {}",
        k.key_id,
        k.principal,
        k.role,
        k.tenants.join(","),
        k.status
    );
}
