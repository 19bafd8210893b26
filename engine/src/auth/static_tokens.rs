//! Configured tokens (`--admin-tokens`, `BELAY_ADMIN_TOKENS`; the MCP
//! server's `--mcp-tokens`): secrets given to the engine at start, kept
//! only as SHA-256 digests and compared in constant time. They are the
//! bootstrap principals: a `*` token is an admin, a tenant's token an
//! operator of that tenant (see [`AdminToken::principal`]).

use std::str::FromStr;

use axum::http::{HeaderMap, header};
use sha2::{Digest, Sha256};

use super::{AuthError, Principal, Role, Tenants};

/// One admin token: a name (recorded as who resolved or paused), the
/// secret (kept only as its SHA-256 digest) and a tenant scope (`*` = every
/// tenant). `Debug` never prints the secret.
#[derive(Clone)]
pub struct AdminToken {
    name: String,
    digest: [u8; 32],
    tenant: String,
    short: bool,
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminToken")
            .field("name", &self.name)
            .field("tenant", &self.tenant)
            .field("token", &"<redacted>")
            .finish()
    }
}

/// Tokens shorter than this are accepted but reported by [`AdminAuth::weak_tokens`].
pub const RECOMMENDED_TOKEN_CHARS: usize = 16;

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'))
}

impl AdminToken {
    /// A token named `name` (letters, digits, `.`, `_`, `-`, `@`; at most 64),
    /// with secret `token` (no whitespace, `,` or `:`), for `tenant` (`*` for
    /// every tenant). Errors: [`AuthError::Config`] naming what is wrong,
    /// never echoing the secret.
    pub fn new(name: &str, token: &str, tenant: &str) -> Result<AdminToken, AuthError> {
        if !valid_name(name) {
            return Err(AuthError::Config(format!(
                "token name {name:?} must be 1 to 64 letters, digits, `.`, `_`, `-` or `@`"
            )));
        }
        if token.is_empty()
            || token
                .chars()
                .any(|c| c.is_whitespace() || c == ',' || c == ':')
        {
            return Err(AuthError::Config(format!(
                "the token of `{name}` must be non-empty, without whitespace, `,` or `:`"
            )));
        }
        if tenant != "*"
            && (tenant.is_empty() || tenant.chars().any(|c| c.is_whitespace() || c == '/'))
        {
            return Err(AuthError::Config(format!(
                "the tenant of token `{name}` must be `*` or a tenant name, got {tenant:?}"
            )));
        }
        Ok(AdminToken {
            name: name.to_owned(),
            digest: Sha256::digest(token.as_bytes()).into(),
            tenant: tenant.to_owned(),
            short: token.chars().count() < RECOMMENDED_TOKEN_CHARS,
        })
    }

    /// The token's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The tenant scope (`*` = every tenant).
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// Whether this token's secret has the lowercase hex SHA-256
    /// `digest_hex` (compared in constant time).
    pub fn has_digest(&self, digest_hex: &str) -> bool {
        super::key::constant_time_eq(hex::encode(self.digest).as_bytes(), digest_hex.as_bytes())
    }

    /// Whether this token may act for `tenant`.
    pub fn allows(&self, tenant: &str) -> bool {
        self.tenant == "*" || self.tenant == tenant
    }
    /// The principal this token proves: id `<name>`, credential
    /// `token:<name>`, an admin for `*`, else an operator of its tenant,
    /// without grants (a configured token administers; it does not start
    /// runs with permissions of its own).
    pub fn principal(&self) -> Principal {
        let (role, tenants) = if self.tenant == "*" {
            (Role::Admin, Tenants::All)
        } else {
            (Role::Operator, Tenants::Only(vec![self.tenant.clone()]))
        };
        Principal {
            id: self.name.clone(),
            credential: format!("token:{}", self.name),
            role,
            tenants,
            grants: Vec::new(),
        }
    }
}

/// The configured admin tokens. Parse from the `BELAY_ADMIN_TOKENS` format:
/// comma-separated `name:token[:tenant]` entries, tenant defaulting to `*`
/// (every tenant), e.g. `ops:s3cr3t-0123456789,acme-bot:t0k3n-abcdefgh:acme`.
/// Names and tokens must be unique. Presented tokens are compared in constant
/// time (SHA-256 digests compared without early exit, over every token).
#[derive(Debug, Clone, Default)]
pub struct AdminAuth {
    tokens: Vec<AdminToken>,
}

impl AdminAuth {
    /// Auth over `tokens`. Errors: [`AuthError::Config`] on a duplicate name
    /// or token.
    pub fn new(tokens: Vec<AdminToken>) -> Result<AdminAuth, AuthError> {
        for (i, t) in tokens.iter().enumerate() {
            for u in &tokens[..i] {
                if u.name == t.name {
                    return Err(AuthError::Config(format!(
                        "token name `{}` is given twice",
                        t.name
                    )));
                }
                if u.digest == t.digest {
                    return Err(AuthError::Config(format!(
                        "tokens `{}` and `{}` are the same secret",
                        u.name, t.name
                    )));
                }
            }
        }
        Ok(AdminAuth { tokens })
    }

    /// Parse `name:token[:tenant],...` (see [`AdminAuth`]); empty entries are
    /// skipped, so an empty string means no tokens.
    pub fn parse(spec: &str) -> Result<AdminAuth, AuthError> {
        let mut tokens = Vec::new();
        for (i, entry) in spec.split(',').map(str::trim).enumerate() {
            if entry.is_empty() {
                continue;
            }
            let parts: Vec<&str> = entry.split(':').collect();
            let token = match parts.as_slice() {
                [name, token] => AdminToken::new(name, token, "*")?,
                [name, token, tenant] => AdminToken::new(name, token, tenant)?,
                _ => {
                    // Not echoed: a lone value may well be a secret.
                    return Err(AuthError::Config(format!(
                        "entry {} has {} `:`-separated part(s), not `name:token[:tenant]`",
                        i + 1,
                        parts.len()
                    )));
                }
            };
            tokens.push(token);
        }
        AdminAuth::new(tokens)
    }

    /// Whether no token is configured (the endpoint is then not served).
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The configured tokens.
    pub fn tokens(&self) -> &[AdminToken] {
        &self.tokens
    }

    /// Names of tokens shorter than [`RECOMMENDED_TOKEN_CHARS`].
    pub fn weak_tokens(&self) -> Vec<&str> {
        self.tokens
            .iter()
            .filter(|t| t.short)
            .map(|t| t.name.as_str())
            .collect()
    }

    /// The token an `Authorization: Bearer <token>` header names.
    /// Errors: [`AuthError::Unauthenticated`] when it is missing, not a
    /// bearer token, or matches no configured token.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<&AdminToken, AuthError> {
        let presented = bearer(headers)?.ok_or_else(|| {
            AuthError::Unauthenticated(
                "missing bearer token: send `Authorization: Bearer <token>`".into(),
            )
        })?;
        self.find(presented)
            .ok_or_else(|| AuthError::Unauthenticated("invalid bearer token".into()))
    }

    /// The token named `name`, if one is configured.
    pub fn by_name(&self, name: &str) -> Option<&AdminToken> {
        self.tokens.iter().find(|t| t.name == name)
    }

    /// The token whose secret is `presented`, comparing with every token
    /// in constant time.
    pub fn find(&self, presented: &str) -> Option<&AdminToken> {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = None;
        for t in &self.tokens {
            // No early exit: the time taken does not depend on which token
            // (if any) matches, nor on how many bytes match.
            if super::key::constant_time_eq(&t.digest, &digest) && found.is_none() {
                found = Some(t);
            }
        }
        found
    }
}

/// The credential of an `Authorization: Bearer <credential>` header, `None`
/// without the header. Errors: [`AuthError::Unauthenticated`] when the
/// header is not valid text or not of the `Bearer` scheme.
pub fn bearer(headers: &HeaderMap) -> Result<Option<&str>, AuthError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    let value = value
        .to_str()
        .map_err(|_| AuthError::Unauthenticated("invalid bearer token".into()))?;
    match value.trim().split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => Ok(Some(token.trim())),
        _ => Err(AuthError::Unauthenticated(
            "the Authorization header is not `Bearer <token>`".into(),
        )),
    }
}

impl FromStr for AdminAuth {
    type Err = AuthError;

    fn from_str(s: &str) -> Result<AdminAuth, AuthError> {
        AdminAuth::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(value).expect("header"),
        );
        h
    }

    #[test]
    fn token_config_parses_names_tokens_and_tenants() {
        let auth = AdminAuth::parse(" ops:0123456789abcdef , bot:short:acme ,").expect("parse");
        assert_eq!(auth.tokens().len(), 2);
        assert_eq!(
            (auth.tokens()[0].name(), auth.tokens()[0].tenant()),
            ("ops", "*")
        );
        assert_eq!(
            (auth.tokens()[1].name(), auth.tokens()[1].tenant()),
            ("bot", "acme")
        );
        assert_eq!(auth.weak_tokens(), vec!["bot"]);
        assert!(AdminAuth::parse("").expect("empty").is_empty());
        assert!(
            !format!("{auth:?}").contains("0123456789abcdef"),
            "Debug redacts"
        );
    }

    #[test]
    fn token_config_errors_are_precise_and_never_echo_secrets() {
        for (spec, needle) in [
            ("s3cr3t-value", "entry 1 has 1 `:`-separated part(s)"),
            ("ops:a:b:c", "not `name:token[:tenant]`"),
            ("op s:tok", "token name"),
            ("ops:", "must be non-empty"),
            ("ops:tok:", "tenant of token `ops`"),
            ("a:tok,a:tok2", "given twice"),
            ("a:tok,b:tok", "same secret"),
        ] {
            let err = AdminAuth::parse(spec).expect_err(spec).to_string();
            assert!(err.contains(needle), "{spec}: {err}");
            assert!(!err.contains("tok2") && !err.contains("s3cr3t"), "{err}");
        }
    }

    #[test]
    fn bearer_tokens_authenticate_by_digest() {
        let auth = AdminAuth::parse("ops:secret-1,bot:secret-2:acme").expect("parse");
        assert_eq!(
            auth.authenticate(&headers("Bearer secret-2"))
                .expect("ok")
                .name(),
            "bot"
        );
        assert_eq!(
            auth.authenticate(&headers("bearer  secret-1"))
                .expect("ok")
                .name(),
            "ops"
        );
        for bad in [
            "Bearer secret-3",
            "Basic c2VjcmV0LTE=",
            "secret-1",
            "Bearer ",
        ] {
            assert!(
                matches!(
                    auth.authenticate(&headers(bad)),
                    Err(AuthError::Unauthenticated(_))
                ),
                "{bad}"
            );
        }
        assert!(
            matches!(auth.authenticate(&HeaderMap::new()), Err(AuthError::Unauthenticated(m)) if m.starts_with("missing"))
        );
        assert!(auth.tokens()[1].allows("acme") && !auth.tokens()[1].allows("other"));
        assert!(auth.tokens()[0].allows("anyone"));
    }

    #[test]
    fn a_star_token_is_an_admin_and_a_tenant_token_an_operator() {
        let auth = AdminAuth::parse("ops:secret-1,bot:secret-2:acme").expect("parse");
        let ops = auth.tokens()[0].principal();
        assert_eq!((ops.role, ops.tenants.clone()), (Role::Admin, Tenants::All));
        let bot = auth.tokens()[1].principal();
        assert_eq!(
            (bot.role, bot.tenants.clone(), bot.credential.as_str()),
            (
                Role::Operator,
                Tenants::Only(vec!["acme".into()]),
                "token:bot"
            )
        );
    }
}
