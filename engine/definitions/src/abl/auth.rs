//! `auth:` with `auth_config:`, of an HTTP tool or of the file's
//! defaults, checked against the seed's "Auth configuration" table into an
//! `HttpAuth`. A credential is always a `{{config.NAME}}` placeholder.

use std::collections::BTreeMap;

use belay_proto::wire::{HttpAuth, TemplatePiece, split_placeholders};

use super::DEFAULT_API_KEY_HEADER;
use super::headers::{
    check_config_placeholders, check_header_placeholders, is_header_name, read_headers,
};
use super::lines::{Block, Cx, block_only, entry_kv, first_time, scalar};
use super::props::Props;

/// The `auth:` and `auth_config:` of `props`, or `fallback` (the file's)
/// when neither is written.
pub(super) fn props_auth(
    props: &Props<'_>,
    fallback: Option<&HttpAuth>,
    cx: &mut Cx<'_>,
) -> Option<HttpAuth> {
    match (&props.auth, props.auth_config) {
        (Some(auth), config) => build_auth(auth, config, cx),
        (None, Some(config)) => {
            cx.error(
                config.line.no,
                config.line.col(),
                "`auth_config:` needs an `auth:` beside it (a tool's does not extend the file's `auth:`)",
            );
            None
        }
        (None, None) => fallback.cloned(),
    }
}

/// `auth:` with its `auth_config:` block, checked against the seed's
/// "Auth configuration" table. Credentials (`token`, `key`,
/// `client_secret`) must be `{{config.NAME}}` placeholders, so a tools file,
/// a stored definition and a task spec never hold one. `None` after an error.
fn build_auth(
    (kind, aline, acol): &(String, u32, u32),
    config: Option<&Block>,
    cx: &mut Cx<'_>,
) -> Option<HttpAuth> {
    let (aline, acol) = (*aline, *acol);
    let allowed: &[&'static str] = match kind.as_str() {
        "none" => &[],
        "bearer" => &["token"],
        "api_key" => &["header_name", "key"],
        "oauth2_client" => &["token_url", "client_id", "client_secret", "scopes"],
        "custom" => &["custom_headers"],
        "oauth2_user" => {
            cx.error(
                aline,
                acol,
                "`auth: oauth2_user` is not supported: a Belay run has no end user to authorize; use `oauth2_client`",
            );
            return None;
        }
        "saml" => {
            cx.error(
                aline,
                acol,
                "`auth: saml` is not supported (the seed itself does not resolve it at run time)",
            );
            return None;
        }
        other => {
            cx.error(
                aline,
                acol,
                format!(
                    "unknown auth `{other}` (expected `none`, `bearer`, `api_key`, `oauth2_client` or `custom`)"
                ),
            );
            return None;
        }
    };
    let errors_before = cx.out.errors.len();
    let mut config_values = AuthConfig::default();
    if let Some(block) = config {
        if kind == "none" {
            cx.error(
                block.line.no,
                block.line.col(),
                "`auth: none` takes no `auth_config:`",
            );
        }
        read_auth_config(block, kind, allowed, &mut config_values, cx);
    }
    let mut need = |key: &str, cx: &mut Cx<'_>| match config_values.values.remove(key) {
        Some(v) => Some(v),
        None => {
            let example = if matches!(key, "token" | "key" | "client_secret") {
                format!(" (e.g. `{key}: \"{{{{config.NAME}}}}\"`)")
            } else {
                String::new()
            };
            cx.error(
                aline,
                acol,
                format!("`auth: {kind}` needs `{key}:` in `auth_config:`{example}"),
            );
            None
        }
    };
    let auth = match kind.as_str() {
        "bearer" => need("token", cx).map(|token| HttpAuth::Bearer { token }),
        "api_key" => need("key", cx).map(|key| HttpAuth::ApiKey {
            header_name: config_values
                .values
                .remove("header_name")
                .unwrap_or_else(|| DEFAULT_API_KEY_HEADER.to_owned()),
            key,
        }),
        "oauth2_client" => {
            let token_url = need("token_url", cx);
            let client_id = need("client_id", cx);
            let client_secret = need("client_secret", cx);
            match (token_url, client_id, client_secret) {
                (Some(token_url), Some(client_id), Some(client_secret)) => {
                    Some(HttpAuth::Oauth2Client {
                        token_url,
                        client_id,
                        client_secret,
                        scopes: config_values.values.remove("scopes").unwrap_or_default(),
                    })
                }
                _ => None,
            }
        }
        "custom" => match config_values.custom_headers {
            Some(headers) if !headers.is_empty() => Some(HttpAuth::Custom { headers }),
            _ => {
                cx.error(
                    aline,
                    acol,
                    "`auth: custom` needs `custom_headers:` in `auth_config:` (an indented block of `Header-Name: value` lines)",
                );
                None
            }
        },
        _ => Some(HttpAuth::None),
    };
    auth.filter(|_| cx.out.errors.len() == errors_before)
}

/// What an `auth_config:` block holds.
#[derive(Default)]
struct AuthConfig {
    /// Scalar entries by key, each checked.
    values: BTreeMap<&'static str, String>,
    /// `custom_headers:`.
    custom_headers: Option<BTreeMap<String, String>>,
}

/// Keys of the seed's "Auth configuration" table that Belay reads, plus
/// `token` (bearer) and `key` (api_key), which carry the credential.
const AUTH_CONFIG_KEYS: &[&str] = &[
    "token",
    "key",
    "header_name",
    "token_url",
    "client_id",
    "client_secret",
    "scopes",
    "custom_headers",
];

/// Reads an `auth_config:` block for `auth: kind`, which takes the keys in
/// `allowed`.
fn read_auth_config(
    block: &Block,
    kind: &str,
    allowed: &[&'static str],
    out: &mut AuthConfig,
    cx: &mut Cx<'_>,
) {
    let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
    for entry in &block.children {
        let line = &entry.line;
        let Some(kv) = entry_kv(line, "`property: value` in `auth_config:`", cx) else {
            continue;
        };
        if !first_time(
            &mut seen,
            &kv,
            line.no,
            &format!("`{}` in `auth_config:`", kv.key),
            cx,
        ) {
            continue;
        }
        let Some(key) = allowed.iter().find(|k| **k == kv.key).copied() else {
            let message = if kv.key == "provider" {
                "`provider` is not supported: it names an identity provider for `oauth2_user` or `saml`, which Belay does not run".to_owned()
            } else if AUTH_CONFIG_KEYS.contains(&kv.key) {
                let takes: Vec<String> = allowed.iter().map(|k| format!("`{k}`")).collect();
                let takes = if takes.is_empty() {
                    "nothing".to_owned()
                } else {
                    takes.join(", ")
                };
                format!(
                    "`{}` does not apply to `auth: {kind}` (it takes {takes})",
                    kv.key
                )
            } else {
                format!("unknown property `{}` in `auth_config:`", kv.key)
            };
            cx.error(line.no, kv.key_col, message);
            continue;
        };
        if key == "custom_headers" {
            if block_only(entry, &kv, cx) {
                out.custom_headers = Some(read_headers(entry, cx));
                check_header_placeholders(entry, false, cx);
            }
            continue;
        }
        let Some(value) = scalar(entry, &kv, cx) else {
            continue;
        };
        match check_auth_value(key, &value) {
            Some(message) => cx.error(line.no, kv.value_col, message),
            None => {
                out.values.insert(key, value);
            }
        }
    }
}

/// What is wrong with the `auth_config` value `value` of `key`, if anything.
fn check_auth_value(key: &str, value: &str) -> Option<String> {
    let secret = matches!(key, "token" | "key" | "client_secret");
    if secret || key == "client_id" {
        if let Some(message) = check_config_placeholders(value) {
            return Some(format!("`{key}`: {message}"));
        }
        let has_placeholder = split_placeholders(value).is_ok_and(|p| {
            p.iter()
                .any(|p| matches!(p, TemplatePiece::Placeholder { .. }))
        });
        if secret && !has_placeholder {
            return Some(format!(
                "`{key}` must be a `{{{{config.NAME}}}}` placeholder, resolved by the worker: a tools file never holds a credential"
            ));
        }
        if value.chars().any(|c| c == '\r' || c == '\n' || c == '\0') {
            return Some(format!("`{key}` must not contain line breaks or NUL"));
        }
        return None;
    }
    if value.contains("{{") {
        return Some(format!(
            "`{key}` takes no placeholder (only `token`, `key`, `client_id` and `client_secret` do)"
        ));
    }
    match key {
        "header_name" if !is_header_name(value) => {
            Some(format!("`{value}` is not a valid header name"))
        }
        "token_url"
            if !(value.starts_with("https://") || value.starts_with("http://"))
                || value.chars().any(|c| c.is_whitespace() || c.is_control()) =>
        {
            Some(format!(
                "`token_url` must be an absolute http(s) URL, not `{value}`"
            ))
        }
        "scopes"
            if value
                .chars()
                .any(|c| c.is_control() || c == '"' || c == '\\') =>
        {
            Some("`scopes` are scope names separated by spaces".to_owned())
        }
        _ => None,
    }
}
