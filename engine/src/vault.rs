//! Encryption of the run secret vault (`RESULT_SECRETS` / `SECRET_ACCESS`):
//! AES-256-GCM under the engine's vault key (`--vault-key` /
//! `BELAY_VAULT_KEY`: 32 bytes, as 64 hex digits or base64), a fresh
//! 96-bit nonce from the OS for every value, and the run id and vault key
//! as associated data, so a row copied to another run or key does not
//! open. The coordinator seals what a worker took out of a producer's
//! result ([`VaultKey::seal`]) and opens what a consumer's dispatch read
//! ([`VaultKey::open`]); the machine and the store only ever see the sealed
//! form ([`SealedSecret`]).
//!
//! Invariant: a value is never logged, put in an error, an event or a task
//! spec; [`SecretText`] and [`VaultKey`] print nothing of it in `Debug`.
//!
//! # In detail (moved from ARCHITECTURE.md)
//!
//! AES-256-GCM of the run secret vault (`aes-gcm`): the key
//! (`VaultKey`, from `--vault-key` / `BELAY_VAULT_KEY`, 32 bytes as hex or
//! base64), a fresh 96-bit nonce from the OS per value, and the run id and
//! vault key as associated data (a row moved to another run or key does not
//! open). `SecretText` and `VaultKey` hide themselves in `Debug`.
//! **Invariant:** a vault value is in no event, spec, log or error.

use std::fmt;

use aes_gcm::aead::{Aead, Payload};
use aes_gcm::{Aes256Gcm, KeyInit, Nonce};
use base64::Engine as _;
use uuid::Uuid;

use crate::machine::SealedSecret;

/// Length of a vault key, bytes.
pub const VAULT_KEY_BYTES: usize = 32;

/// Length of a nonce, bytes (96 bits, as GCM wants).
const NONCE_BYTES: usize = 12;

/// The engine's vault key (AES-256). `Debug` prints nothing of it.
#[derive(Clone)]
pub struct VaultKey(Aes256Gcm);

impl fmt::Debug for VaultKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("VaultKey(<hidden>)")
    }
}

/// A value of the vault, as text. `Debug` prints its length only.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretText(String);

impl fmt::Debug for SecretText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretText(<{} bytes hidden>)", self.0.len())
    }
}

impl SecretText {
    /// Wraps `value`.
    pub fn new(value: String) -> SecretText {
        SecretText(value)
    }

    /// The value. Only for the request that uses it (or the worker that
    /// reports it): never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The value, taken out.
    pub fn into_inner(self) -> String {
        self.0
    }
}

/// Why the vault could not seal or open a value; never carries one.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VaultError {
    /// The configured key is not 32 bytes of hex or base64.
    #[error(
        "the vault key must be 32 bytes, written as 64 hex digits or in base64 (e.g. the output of `openssl rand -hex 32`); got {0}"
    )]
    BadKey(String),
    /// The OS random source failed.
    #[error("the OS random source failed: {0}")]
    Random(String),
    /// A stored value does not open with this key for this run and key
    /// (another vault key, or a row that was changed or moved).
    #[error(
        "vault key `{0}` does not decrypt with the engine's vault key (was BELAY_VAULT_KEY changed?)"
    )]
    Undecryptable(String),
}

impl VaultKey {
    /// Parses a configured key: 64 hex digits, or base64 (standard or URL-safe,
    /// padded or not) of 32 bytes. Surrounding whitespace is ignored.
    pub fn parse(text: &str) -> Result<VaultKey, VaultError> {
        let text = text.trim();
        let bytes =
            if text.len() == 2 * VAULT_KEY_BYTES && text.bytes().all(|b| b.is_ascii_hexdigit()) {
                hex::decode(text).map_err(|_| VaultError::BadKey("invalid hex".into()))?
            } else {
                let engines = [
                    base64::engine::general_purpose::STANDARD,
                    base64::engine::general_purpose::STANDARD_NO_PAD,
                    base64::engine::general_purpose::URL_SAFE,
                    base64::engine::general_purpose::URL_SAFE_NO_PAD,
                ];
                engines
                    .iter()
                    .find_map(|e| e.decode(text).ok())
                    .ok_or_else(|| {
                        VaultError::BadKey(format!(
                            "{} characters that are neither 64 hex digits nor base64",
                            text.chars().count()
                        ))
                    })?
            };
        if bytes.len() != VAULT_KEY_BYTES {
            return Err(VaultError::BadKey(format!("{} bytes", bytes.len())));
        }
        Aes256Gcm::new_from_slice(&bytes)
            .map(VaultKey)
            .map_err(|_| VaultError::BadKey(format!("{} bytes", bytes.len())))
    }

    /// Encrypts `value` for vault key `key` of run `run_id`.
    pub fn seal(&self, run_id: Uuid, key: &str, value: &str) -> Result<SealedSecret, VaultError> {
        let mut nonce = [0u8; NONCE_BYTES];
        getrandom::fill(&mut nonce).map_err(|e| VaultError::Random(e.to_string()))?;
        let aad = associated_data(run_id, key);
        let ciphertext = self
            .0
            .encrypt(
                &Nonce::from(nonce),
                Payload {
                    msg: value.as_bytes(),
                    aad: &aad,
                },
            )
            // Encryption fails only for a message beyond GCM's limit (64
            // GiB); values are far smaller.
            .map_err(|_| VaultError::Undecryptable(key.to_owned()))?;
        Ok(SealedSecret {
            key: key.to_owned(),
            nonce: nonce.to_vec(),
            ciphertext,
        })
    }

    /// Decrypts `sealed`, a value of run `run_id`.
    pub fn open(&self, run_id: Uuid, sealed: &SealedSecret) -> Result<SecretText, VaultError> {
        let undecryptable = || VaultError::Undecryptable(sealed.key.clone());
        let nonce: [u8; NONCE_BYTES] = sealed
            .nonce
            .as_slice()
            .try_into()
            .map_err(|_| undecryptable())?;
        let aad = associated_data(run_id, &sealed.key);
        let plain = self
            .0
            .decrypt(
                &Nonce::from(nonce),
                Payload {
                    msg: &sealed.ciphertext,
                    aad: &aad,
                },
            )
            .map_err(|_| undecryptable())?;
        String::from_utf8(plain)
            .map(SecretText)
            .map_err(|_| undecryptable())
    }
}

/// What a sealed value is bound to: the format, the run and the key.
fn associated_data(run_id: Uuid, key: &str) -> Vec<u8> {
    let mut aad = b"belay-vault-v1\0".to_vec();
    aad.extend_from_slice(run_id.as_bytes());
    aad.push(0);
    aad.extend_from_slice(key.as_bytes());
    aad
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    #[test]
    fn keys_are_hex_or_base64_of_32_bytes() {
        let b64 = base64::engine::general_purpose::STANDARD.encode(hex::decode(HEX).unwrap());
        for text in [
            HEX,
            &HEX.to_uppercase(),
            &b64,
            b64.trim_end_matches('='),
            &format!(" {HEX}\n"),
        ] {
            assert!(VaultKey::parse(text).is_ok(), "{text}");
        }
        for bad in ["", "00", &HEX[..62], "not a key at all!", &"A".repeat(44)] {
            let err = VaultKey::parse(bad).unwrap_err();
            assert!(matches!(err, VaultError::BadKey(_)), "{bad}: {err}");
            assert!(!err.to_string().contains(bad) || bad.is_empty(), "{err}");
        }
        assert_eq!(
            format!("{:?}", VaultKey::parse(HEX).unwrap()),
            "VaultKey(<hidden>)"
        );
    }

    #[test]
    fn a_value_opens_only_for_its_run_and_key() {
        let vault = VaultKey::parse(HEX).unwrap();
        let run = Uuid::now_v7();
        let sealed = vault.seal(run, "txn_otp", "otp-123456").unwrap();
        assert_eq!(sealed.nonce.len(), NONCE_BYTES);
        assert!(
            !sealed
                .ciphertext
                .windows(b"otp-123456".len())
                .any(|w| w == b"otp-123456")
        );
        assert_eq!(vault.open(run, &sealed).unwrap().expose(), "otp-123456");
        // Another nonce each time.
        assert_ne!(
            vault.seal(run, "txn_otp", "otp-123456").unwrap().nonce,
            sealed.nonce
        );
        // Another run, another key name, another vault key, a changed byte.
        assert!(vault.open(Uuid::now_v7(), &sealed).is_err());
        let renamed = SealedSecret {
            key: "other".into(),
            ..sealed.clone()
        };
        assert!(vault.open(run, &renamed).is_err());
        let other = VaultKey::parse(&"11".repeat(32)).unwrap();
        assert_eq!(
            other.open(run, &sealed).unwrap_err(),
            VaultError::Undecryptable("txn_otp".into())
        );
        let mut flipped = sealed.clone();
        flipped.ciphertext[0] ^= 1;
        assert!(vault.open(run, &flipped).is_err());
        let text = vault.open(run, &sealed).unwrap();
        assert!(!format!("{text:?}").contains("otp-123456"));
        assert!(!format!("{sealed:?}").contains("123456"));
    }
}
