//! Secret scrubbing of tool results (on by default; a tool opts out with
//! `scrub_secrets: false`).
//!
//! A tool's result is data from outside: it goes into the run's events
//! (kept for ever, shown to operators) and to the model. A result carrying
//! a credential (an API that echoes its request headers, a config dump, a
//! log line) must not spread it, so before a result is recorded every string
//! in it is searched for secrets, and each is replaced by
//! `[REDACTED:<kind>]`:
//!
//! - values of object keys that name a secret (`password`, `passwd`,
//!   `secret`, `client_secret`, `api_key`, `apikey`, `access_token`,
//!   `refresh_token`, `id_token`, `token`, `private_key`, `authorization`,
//!   compared without case, `-` and `_`), when they are strings;
//! - PEM private keys (`-----BEGIN … PRIVATE KEY-----` … `-----END …`);
//! - `Bearer <token>` and `Basic <credentials>` (RFC 6750 §2.1, RFC 7617);
//! - well-known key formats: OpenAI / Anthropic `sk-…`, AWS access key ids
//!   `AKIA…`, GitHub tokens `ghp_…` / `github_pat_…`, Slack `xox?-…`,
//!   Google API keys `AIza…`, JSON Web Tokens `eyJ….eyJ….…`;
//! - `password=…`, `secret: …`, `api_key=…` and the like inside text.
//!
//! The rules favour catching a secret over keeping text intact; they are
//! not a guarantee (a secret with no recognisable shape passes), which is
//! why credentials never reach results in the first place where Belay
//! controls it (they stay in the worker's configuration).

use std::sync::OnceLock;

use regex::Regex;
use serde_json::Value;

/// Object keys whose string value is a secret, normalised (lower case,
/// without `-` and `_`).
const SECRET_KEYS: &[&str] = &[
    "password",
    "passwd",
    "pwd",
    "secret",
    "clientsecret",
    "apikey",
    "apisecret",
    "accesstoken",
    "refreshtoken",
    "idtoken",
    "token",
    "authtoken",
    "privatekey",
    "authorization",
    "cookie",
    "setcookie",
];

/// (kind, pattern, the capture group that is the secret: 0 for the whole
/// match).
const PATTERNS: &[(&str, &str, usize)] = &[
    (
        "private_key",
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----[\s\S]*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----",
        0,
    ),
    (
        "bearer_token",
        r"(?i)\bbearer\s+([A-Za-z0-9\-._~+/]{8,}=*)",
        1,
    ),
    (
        "basic_credentials",
        r"(?i)\bbasic\s+([A-Za-z0-9+/]{8,}=*)",
        1,
    ),
    ("api_key", r"\bsk-(?:ant-|proj-)?[A-Za-z0-9_\-]{20,}", 0),
    ("api_key", r"\bAKIA[0-9A-Z]{16}\b", 0),
    (
        "api_key",
        r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{36,}\b",
        0,
    ),
    ("api_key", r"\bgithub_pat_[A-Za-z0-9_]{22,}\b", 0),
    ("api_key", r"\bxox[abprs]-[A-Za-z0-9\-]{10,}", 0),
    ("api_key", r"\bAIza[0-9A-Za-z\-_]{35}\b", 0),
    (
        "jwt",
        r"\beyJ[A-Za-z0-9_\-]{5,}\.eyJ[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]{5,}",
        0,
    ),
    (
        "password",
        r#"(?i)\b(?:password|passwd|pwd|secret|client_secret|api[_-]?key|access[_-]?token|auth[_-]?token)\b["']?\s*[:=]\s*["']?([^\s"',;&]{3,})"#,
        1,
    ),
];

fn patterns() -> &'static [(&'static str, Regex, usize)] {
    static COMPILED: OnceLock<Vec<(&'static str, Regex, usize)>> = OnceLock::new();
    COMPILED.get_or_init(|| {
        PATTERNS
            .iter()
            // The patterns are constants checked by the tests below; one that
            // failed to compile would be skipped, never a panic.
            .filter_map(|(kind, p, group)| Regex::new(p).ok().map(|r| (*kind, r, *group)))
            .collect()
    })
}

/// `value` with every secret replaced by `[REDACTED:<kind>]`, and how many
/// were replaced.
pub fn scrub(value: &Value) -> (Value, usize) {
    let mut count = 0;
    let out = walk(value, None, &mut count);
    (out, count)
}

fn is_secret_key(key: &str) -> bool {
    let k: String = key
        .chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect();
    SECRET_KEYS.contains(&k.as_str())
}

fn walk(value: &Value, key: Option<&str>, count: &mut usize) -> Value {
    match value {
        Value::String(s) if key.is_some_and(is_secret_key) && !s.is_empty() => {
            *count += 1;
            Value::String("[REDACTED:secret_field]".into())
        }
        Value::String(s) => Value::String(scrub_text(s, count)),
        Value::Array(items) => Value::Array(items.iter().map(|v| walk(v, None, count)).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), walk(v, Some(k), count)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// `text` with the secrets the patterns find replaced.
pub fn scrub_text(text: &str, count: &mut usize) -> String {
    let mut out = text.to_owned();
    for (kind, regex, group) in patterns() {
        if !regex.is_match(&out) {
            continue;
        }
        let replacement = format!("[REDACTED:{kind}]");
        let mut n = 0;
        out = regex
            .replace_all(&out, |caps: &regex::Captures<'_>| {
                n += 1;
                let whole = caps.get(0).map_or("", |m| m.as_str());
                match caps.get(*group).filter(|_| *group != 0) {
                    // Keep what names the secret (`Bearer `, `password=`).
                    Some(secret) => {
                        let start = secret.start() - caps.get(0).map_or(0, |m| m.start());
                        format!(
                            "{}{replacement}{}",
                            &whole[..start],
                            &whole[start + secret.len()..]
                        )
                    }
                    None => replacement.clone(),
                }
            })
            .into_owned();
        *count += n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_pattern_compiles() {
        assert_eq!(patterns().len(), PATTERNS.len());
    }

    #[test]
    fn secrets_in_fields_and_text_are_redacted_and_counted() {
        let pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\nabc\n-----END RSA PRIVATE KEY-----";
        let result = json!({
            "id": "acct_1",
            "api_key": "k-123",
            "Client-Secret": "shh",
            "headers": {"Authorization": "Bearer abcdefghijklmnop"},
            "log": "called with Authorization: Bearer tok_0123456789abcdef and password=hunter22 ok",
            "keys": [pem, "AKIAIOSFODNN7EXAMPLE", "sk-proj-abcdefghijklmnopqrstuvwxyz012345"],
            "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
            "count": 3,
            "note": "nothing secret here: token bucket of 5"
        });
        let (out, n) = scrub(&result);
        assert_eq!(out["id"], "acct_1");
        assert_eq!(out["api_key"], "[REDACTED:secret_field]");
        assert_eq!(out["Client-Secret"], "[REDACTED:secret_field]");
        assert_eq!(out["headers"]["Authorization"], "[REDACTED:secret_field]");
        assert_eq!(
            out["log"],
            "called with Authorization: Bearer [REDACTED:bearer_token] and password=[REDACTED:password] ok"
        );
        assert_eq!(
            out["keys"],
            json!([
                "[REDACTED:private_key]",
                "[REDACTED:api_key]",
                "[REDACTED:api_key]"
            ])
        );
        assert_eq!(out["jwt"], "[REDACTED:jwt]");
        assert_eq!(out["count"], 3);
        assert_eq!(out["note"], "nothing secret here: token bucket of 5");
        assert_eq!(n, 9);
    }

    #[test]
    fn a_result_without_secrets_is_unchanged() {
        let result =
            json!({"account_id": "acct_42", "status": "active", "items": [1, "two", null]});
        assert_eq!(scrub(&result), (result.clone(), 0));
    }
}
