//! The API key format: `belay_<key id>_<secret>`, where the key id is 16
//! lowercase hex digits (8 random bytes, public: shown in listings and
//! logs) and the secret 43 characters of unpadded base64url (32 random
//! bytes from the operating system). Only the secret's SHA-256 is stored;
//! a key is shown once, when created. The `belay_` prefix makes leaked keys
//! findable by secret scanners, as GitHub's and Stripe's prefixes do.

use base64::Engine as _;
use sha2::{Digest, Sha256};

use super::AuthError;

/// Every key starts with this.
pub const KEY_PREFIX: &str = "belay_";
/// Length of a key id, hex digits.
pub const KEY_ID_CHARS: usize = 16;
/// Length of a key's secret, base64url characters.
pub const SECRET_CHARS: usize = 43;

/// A freshly generated key: its public id and the whole key text (shown
/// once). `Debug` never prints the secret.
#[derive(Clone)]
pub struct NewKey {
    /// The public id.
    pub key_id: String,
    /// `belay_<key id>_<secret>`.
    pub key: String,
    /// Lowercase hex SHA-256 of the secret: what is stored.
    pub secret_sha256: String,
}

impl std::fmt::Debug for NewKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewKey")
            .field("key_id", &self.key_id)
            .field("key", &"<redacted>")
            .finish()
    }
}

/// A presented key, split into its parts (not yet checked against the
/// store).
#[derive(Clone, PartialEq, Eq)]
pub struct PresentedKey {
    /// The public id.
    pub key_id: String,
    secret: String,
}

impl std::fmt::Debug for PresentedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PresentedKey")
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

/// A new random key. Errors: [`AuthError::Internal`] when the operating
/// system has no randomness to give.
pub fn generate() -> Result<NewKey, AuthError> {
    let mut id = [0u8; 8];
    let mut secret = [0u8; 32];
    getrandom::fill(&mut id)
        .and_then(|()| getrandom::fill(&mut secret))
        .map_err(|e| AuthError::Internal(format!("no randomness for a key: {e}")))?;
    let key_id = hex::encode(id);
    let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret);
    Ok(NewKey {
        key: format!("{KEY_PREFIX}{key_id}_{secret}"),
        secret_sha256: secret_sha256(&secret),
        key_id,
    })
}

/// Split `text` into key id and secret. Errors:
/// [`AuthError::Unauthenticated`] saying which part is malformed (never
/// echoing the text).
pub fn parse(text: &str) -> Result<PresentedKey, AuthError> {
    let malformed = |what: &str| {
        AuthError::Unauthenticated(format!(
            "malformed API key: {what} (keys look like `belay_<16 hex digits>_<43 base64url characters>`)"
        ))
    };
    let rest = text
        .strip_prefix(KEY_PREFIX)
        .ok_or_else(|| malformed("it does not start with `belay_`"))?;
    if rest.len() != KEY_ID_CHARS + 1 + SECRET_CHARS || !rest.is_ascii() {
        return Err(malformed("wrong length"));
    }
    let (key_id, secret) = rest.split_at(KEY_ID_CHARS);
    let secret = secret
        .strip_prefix('_')
        .ok_or_else(|| malformed("no `_` after the key id"))?;
    if !key_id
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(malformed("the key id is not lowercase hex"));
    }
    if !secret
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(malformed("the secret is not base64url"));
    }
    Ok(PresentedKey {
        key_id: key_id.to_owned(),
        secret: secret.to_owned(),
    })
}

impl PresentedKey {
    /// Whether the secret hashes to `stored` (lowercase hex SHA-256),
    /// compared in constant time.
    pub fn matches(&self, stored: &str) -> bool {
        let presented = secret_sha256(&self.secret);
        constant_time_eq(presented.as_bytes(), stored.as_bytes())
    }
}

/// Lowercase hex SHA-256 of a secret.
pub fn secret_sha256(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Byte equality whose time depends only on the lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_key_parses_and_matches_only_its_hash() {
        let key = generate().expect("key");
        assert_eq!(
            key.key.len(),
            KEY_PREFIX.len() + KEY_ID_CHARS + 1 + SECRET_CHARS
        );
        let presented = parse(&key.key).expect("parse");
        assert_eq!(presented.key_id, key.key_id);
        assert!(presented.matches(&key.secret_sha256));
        let other = generate().expect("key");
        assert!(!presented.matches(&other.secret_sha256));
        assert!(!format!("{key:?}{presented:?}").contains(&key.key[KEY_PREFIX.len() + 17..]));
    }

    #[test]
    fn malformed_keys_are_named_without_echoing_them() {
        let good = generate().expect("key").key;
        let cases = [
            ("", "does not start"),
            ("bearer-token", "does not start"),
            (&good[..good.len() - 1], "wrong length"),
            (&good.replacen('_', "-", 2)[..], "does not start"),
            (&format!("belay_{}X{}", &good[6..22], &good[23..]), "no `_`"),
            (
                &format!("belay_{}{}", "G".repeat(16), &good[22..]),
                "not lowercase hex",
            ),
            (
                &format!("{}{}", &good[..23], "!".repeat(43)),
                "not base64url",
            ),
        ];
        for (text, want) in cases {
            let err = parse(text).expect_err(text).to_string();
            assert!(err.contains(want), "{text:?}: {err}");
            if text.len() > 10 {
                assert!(!err.contains(text), "{err}");
            }
        }
    }
}
