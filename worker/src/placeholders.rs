//! `{{config.NAME}}` placeholders: the worker's one resolver, for HTTP tool
//! headers and `auth_config` credentials ([`crate::http_tool`]) and for MCP
//! server settings and per-call headers ([`crate::mcp::config`]).
//!
//! A tools file, a stored definition and a task spec hold only the
//! placeholder; the value comes from this worker's configuration
//! ([`ConfigValues`]) right before the request is built, and is never
//! logged nor put into an error message (errors name the placeholder).
//!
//! `{{_secret.KEY}}` (the run's secret vault, `SECRET_ACCESS`) is resolved
//! by the same pass ([`resolve_with_secrets`]) in a tool's headers (and,
//! in [`crate::http_tool`], its body template) from the values the engine
//! handed out at dispatch ([`SecretValues`]); a key without a value becomes
//! the empty string, never the placeholder. One pass: a value is never
//! scanned for placeholders again, so a vaulted value that looks like
//! `{{config.X}}` stays text.

use std::collections::BTreeMap;
use std::fmt;

use belay_proto::wire::{
    TemplatePiece, config_placeholder_name, secret_placeholder_name, split_placeholders,
};

/// Prefix of the environment variables that give placeholder values:
/// `BELAY_TOOL_CONFIG_CRM_TOKEN=…` is the value of `{{config.CRM_TOKEN}}`.
pub const ENV_PREFIX: &str = "BELAY_TOOL_CONFIG_";

/// Values of `{{config.NAME}}` placeholders, by NAME. Secrets: `Debug`
/// prints the names only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ConfigValues(BTreeMap<String, String>);

impl fmt::Debug for ConfigValues {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl ConfigValues {
    /// The values in `map`.
    pub fn new(map: BTreeMap<String, String>) -> Self {
        Self(map)
    }

    /// The `BELAY_TOOL_CONFIG_<NAME>` variables among `vars` (NAME as
    /// written, case kept); others are ignored.
    pub fn from_env_vars(vars: impl IntoIterator<Item = (String, String)>) -> Self {
        Self(
            vars.into_iter()
                .filter_map(|(key, value)| {
                    let name = key.strip_prefix(ENV_PREFIX)?;
                    (!name.is_empty()).then(|| (name.to_owned(), value))
                })
                .collect(),
        )
    }

    /// The `BELAY_TOOL_CONFIG_<NAME>` variables of this process's
    /// environment (a variable that is not Unicode is skipped).
    pub fn from_env() -> Self {
        Self::from_env_vars(
            std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))),
        )
    }

    /// These values, plus those of `other` whose names are not here (this
    /// set wins).
    #[must_use]
    pub fn or(mut self, other: &BTreeMap<String, String>) -> Self {
        for (name, value) in other {
            self.0.entry(name.clone()).or_insert_with(|| value.clone());
        }
        self
    }

    /// The value of `{{config.NAME}}`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// Whether no value is configured.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Values of `{{_secret.KEY}}` placeholders, by KEY: what the engine handed
/// out at a dispatch (`DispatchToolCallResponse.secrets`). Secrets: `Debug`
/// prints the keys only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretValues(BTreeMap<String, String>);

impl fmt::Debug for SecretValues {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl SecretValues {
    /// The values in `map`.
    pub fn new(map: BTreeMap<String, String>) -> Self {
        Self(map)
    }

    /// The value of `{{_secret.KEY}}`, if the engine gave one.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// Whether no value was given.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The values, for [`redact_values_as`].
    pub fn values(&self) -> Vec<String> {
        self.0.values().cloned().collect()
    }
}

/// Why a text's placeholders cannot be resolved. Neither variant carries a
/// configured value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlaceholderError {
    /// `{{config.NAME}}` has no value on this worker.
    #[error("placeholder {{{{config.{0}}}}} has no value on this worker")]
    Missing(String),
    /// A `{{…}}` other than `{{config.NAME}}`, or a `{{` not closed.
    #[error("placeholder `{0}` is not supported (only {{{{config.NAME}}}})")]
    Unsupported(String),
}

/// `text` with every `{{config.NAME}}` replaced by `lookup(NAME)`;
/// whitespace inside the braces is allowed (`{{ config.NAME }}`).
///
/// # Errors
/// [`PlaceholderError::Missing`] for a name `lookup` does not know,
/// [`PlaceholderError::Unsupported`] for any other placeholder.
pub fn resolve<'v>(
    text: &str,
    lookup: impl Fn(&str) -> Option<&'v str>,
) -> Result<String, PlaceholderError> {
    resolve_inner(text, lookup, None)
}

/// [`resolve`], where `{{_secret.KEY}}` also resolves: to `secrets`'s value
/// of KEY, or to the empty string when it has none (fail closed: the
/// placeholder itself is never sent).
///
/// # Errors
/// As [`resolve`], for `{{config.NAME}}` and any other placeholder.
pub fn resolve_with_secrets<'v>(
    text: &str,
    lookup: impl Fn(&str) -> Option<&'v str>,
    secrets: &SecretValues,
) -> Result<String, PlaceholderError> {
    resolve_inner(text, lookup, Some(secrets))
}

fn resolve_inner<'v>(
    text: &str,
    lookup: impl Fn(&str) -> Option<&'v str>,
    secrets: Option<&SecretValues>,
) -> Result<String, PlaceholderError> {
    let pieces = split_placeholders(text)
        .map_err(|at| PlaceholderError::Unsupported(text[at..].chars().take(64).collect()))?;
    let mut out = String::with_capacity(text.len());
    for piece in pieces {
        match piece {
            TemplatePiece::Text(t) => out.push_str(t),
            TemplatePiece::Placeholder { inner, .. } => {
                if let (Some(secrets), Some(key)) = (secrets, secret_placeholder_name(inner)) {
                    out.push_str(secrets.get(key).unwrap_or_default());
                    continue;
                }
                let name = config_placeholder_name(inner)
                    .ok_or_else(|| PlaceholderError::Unsupported(format!("{{{{{inner}}}}}")))?;
                let value =
                    lookup(name).ok_or_else(|| PlaceholderError::Missing(name.to_owned()))?;
                out.push_str(value);
            }
        }
    }
    Ok(out)
}

/// `arguments` with the value of each `source: config` parameter named in
/// `params` (`ToolCallSpec::config_params`) put in place of its
/// `{{config.NAME}}` placeholder. Only these arguments are resolved, so a
/// placeholder the model wrote into any other argument stays text. An
/// argument that is absent (an optional parameter with no value) is left
/// out. Returns the values put in, for [`redact_values`] to keep them out
/// of what the tool answers.
///
/// # Errors
/// [`PlaceholderError::Missing`] for a name `values` does not hold,
/// [`PlaceholderError::Unsupported`] for an argument that is not exactly one
/// `{{config.NAME}}` placeholder. Neither carries a value.
pub fn resolve_arguments(
    arguments: &mut serde_json::Value,
    params: &[String],
    values: &ConfigValues,
) -> Result<Vec<String>, PlaceholderError> {
    let mut filled = Vec::new();
    for param in params {
        let Some(slot) = arguments.get_mut(param.as_str()) else {
            continue;
        };
        let serde_json::Value::String(text) = &*slot else {
            return Err(PlaceholderError::Unsupported(format!("argument `{param}`")));
        };
        let name = match split_placeholders(text).as_deref() {
            Ok([TemplatePiece::Placeholder { inner, .. }]) => config_placeholder_name(inner)
                .ok_or_else(|| PlaceholderError::Unsupported(format!("argument `{param}`")))?,
            _ => return Err(PlaceholderError::Unsupported(format!("argument `{param}`"))),
        };
        let value = values
            .get(name)
            .ok_or_else(|| PlaceholderError::Missing(name.to_owned()))?;
        *slot = serde_json::Value::String(value.to_owned());
        filled.push(value.to_owned());
    }
    Ok(filled)
}

/// Shortest configuration value [`redact_values`] looks for, chars: a
/// shorter one (`1`, `eu`) would blank out ordinary text of every answer.
pub const MIN_REDACTED_CHARS: usize = 4;

/// `text` (a tool's answer as JSON text, or an error message) with every
/// occurrence of each of `secrets` (the `source: config` values this worker
/// put into the call) replaced by `[REDACTED:config]`: a tool that echoes
/// its request must not carry a configured secret into the run's events or
/// to the model. Both the raw and the JSON-escaped form of a value are
/// found, so JSON text stays valid. Values shorter than
/// [`MIN_REDACTED_CHARS`] are left alone.
pub fn redact_values(text: &str, secrets: &[String]) -> String {
    redact_values_as(text, secrets, "config")
}

/// [`redact_values`] with `[REDACTED:<label>]` as the replacement: `secret`
/// for the vault values a call was given, `vaulted` for those a producer's
/// result held elsewhere than at its `RESULT_SECRETS` paths.
pub fn redact_values_as(text: &str, secrets: &[String], label: &str) -> String {
    let marker = format!("[REDACTED:{label}]");
    let mut out = text.to_owned();
    for secret in secrets {
        if secret.chars().count() < MIN_REDACTED_CHARS {
            continue;
        }
        let escaped = serde_json::to_string(secret).unwrap_or_default();
        let escaped = escaped
            .strip_prefix('"')
            .and_then(|e| e.strip_suffix('"'))
            .unwrap_or(secret);
        for form in [escaped, secret.as_str()] {
            if out.contains(form) {
                out = out.replace(form, &marker);
            }
        }
    }
    out
}

/// Whether `text` holds a `{{` (a value to resolve, and to treat as secret).
pub fn has_placeholder(text: &str) -> bool {
    text.contains("{{")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn values_come_from_prefixed_variables_and_the_first_source_wins() {
        let values = ConfigValues::from_env_vars([
            ("BELAY_TOOL_CONFIG_TOKEN".to_owned(), "env".to_owned()),
            ("BELAY_TOOL_CONFIG_".to_owned(), "nameless".to_owned()),
            ("PATH".to_owned(), "/bin".to_owned()),
        ])
        .or(&BTreeMap::from([
            ("TOKEN".to_owned(), "file".to_owned()),
            ("OTHER".to_owned(), "file".to_owned()),
        ]));
        assert_eq!(values.get("TOKEN"), Some("env"));
        assert_eq!(values.get("OTHER"), Some("file"));
        assert_eq!(values.get("PATH"), None);
        assert_eq!(format!("{values:?}"), r#"{"OTHER", "TOKEN"}"#);
    }

    #[test]
    fn resolve_names_the_placeholder_not_a_value() {
        let values = ConfigValues::new(BTreeMap::from([("T".to_owned(), "s3cret".to_owned())]));
        let lookup = |n: &str| values.get(n);
        assert_eq!(
            resolve("Bearer {{ config.T }}", lookup).unwrap(),
            "Bearer s3cret"
        );
        let err = resolve("{{config.T}} {{config.NOPE}}", lookup).unwrap_err();
        assert_eq!(err, PlaceholderError::Missing("NOPE".into()));
        assert!(!err.to_string().contains("s3cret"));
        assert!(matches!(
            resolve("{{env.X}}", lookup),
            Err(PlaceholderError::Unsupported(_))
        ));
        assert!(matches!(
            resolve("{{config.T", lookup),
            Err(PlaceholderError::Unsupported(_))
        ));
    }

    #[test]
    fn vault_references_resolve_in_one_pass_and_unresolved_ones_are_empty() {
        let values = ConfigValues::new(BTreeMap::from([("T".to_owned(), "s3cret".to_owned())]));
        let lookup = |n: &str| values.get(n);
        let secrets = SecretValues::new(BTreeMap::from([
            ("otp".to_owned(), "123456".to_owned()),
            ("sneaky".to_owned(), "{{config.T}}".to_owned()),
        ]));
        assert_eq!(
            resolve_with_secrets("{{config.T}}/{{ _secret.otp }}", lookup, &secrets).unwrap(),
            "s3cret/123456"
        );
        // Absent: empty, never the placeholder.
        assert_eq!(
            resolve_with_secrets("[{{_secret.gone}}]", lookup, &secrets).unwrap(),
            "[]"
        );
        // A value is not scanned again: no configured value leaks through it.
        assert_eq!(
            resolve_with_secrets("{{_secret.sneaky}}", lookup, &secrets).unwrap(),
            "{{config.T}}"
        );
        // Without the vault (auth settings), a reference is refused.
        assert!(matches!(
            resolve("{{_secret.otp}}", lookup),
            Err(PlaceholderError::Unsupported(_))
        ));
        assert_eq!(format!("{secrets:?}"), r#"{"otp", "sneaky"}"#);
        assert_eq!(
            redact_values_as("echo 123456", &secrets.values(), "secret"),
            "echo [REDACTED:secret]"
        );
    }

    #[test]
    fn resolve_arguments_fills_only_the_named_config_parameters() {
        let values = ConfigValues::new(BTreeMap::from([("K".to_owned(), "s3cret".to_owned())]));
        let mut args = serde_json::json!({
            "key": "{{config.K}}",
            "note": "{{config.K}}",
            "n": 1,
        });
        let filled =
            resolve_arguments(&mut args, &["key".into(), "absent".into()], &values).unwrap();
        assert_eq!(filled, vec!["s3cret".to_owned()]);
        // A placeholder the model wrote into another argument stays text.
        assert_eq!(
            args,
            serde_json::json!({"key": "s3cret", "note": "{{config.K}}", "n": 1})
        );
        let mut args = serde_json::json!({"key": "{{config.NOPE}}"});
        let err = resolve_arguments(&mut args, &["key".into()], &values).unwrap_err();
        assert_eq!(err, PlaceholderError::Missing("NOPE".into()));
        for bad in [
            serde_json::json!({"key": "x {{config.K}}"}),
            serde_json::json!({"key": 5}),
        ] {
            let mut args = bad;
            assert!(matches!(
                resolve_arguments(&mut args, &["key".into()], &values),
                Err(PlaceholderError::Unsupported(_))
            ));
        }
    }

    #[test]
    fn configured_values_echoed_back_are_redacted_and_json_stays_valid() {
        let secrets = vec!["s3cr\"et-key".to_owned(), "eu".to_owned()];
        let answer = serde_json::json!({"echo": {"key": "s3cr\"et-key", "zone": "eu"}}).to_string();
        let out = redact_values(&answer, &secrets);
        let parsed: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            parsed,
            serde_json::json!({"echo": {"key": "[REDACTED:config]", "zone": "eu"}})
        );
        assert_eq!(
            redact_values("upstream said: bad key s3cr\"et-key", &secrets),
            "upstream said: bad key [REDACTED:config]"
        );
    }
}
