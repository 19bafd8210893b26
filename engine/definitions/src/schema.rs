//! JSON Schema checks: compiling a schema (is it a valid schema at all?) and
//! validating a value against one, with remote `$ref` fetching refused.

use serde_json::Value;

/// Longest message kept per violation. jsonschema quotes the offending
/// instance in its messages; a 64 KiB argument must not come back as a
/// 64 KiB error that is then fed to the model.
const MAX_MESSAGE_CHARS: usize = 300;

/// Refuses every external schema. The `jsonschema` dependency is built
/// without its HTTP and file resolvers, but Cargo unifies features across a
/// workspace: if any crate turned them back on, a definition could make the
/// engine fetch arbitrary URLs (SSRF). Installing our own retriever closes
/// that hole whatever the feature set.
struct NoRetrieve;

impl jsonschema::Retrieve for NoRetrieve {
    fn retrieve(
        &self,
        uri: &jsonschema::Uri<String>,
    ) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        Err(format!("external schema `{}` is not allowed", uri.as_str()).into())
    }
}

/// Compile `schema`, checking it against its meta-schema.
///
/// Formats (`date`, `email`, ...) are asserted, not just annotated: a
/// `date` parameter given `"next tuesday"` should be refused back to the
/// model rather than reach the tool.
pub(super) fn compile(schema: &Value) -> Result<jsonschema::Validator, String> {
    jsonschema::options()
        .with_retriever(NoRetrieve)
        .should_validate_formats(true)
        .build(schema)
        .map_err(|e| cap(&e.to_string()))
}

/// Most compiled validators kept; when full the cache starts over.
const MAX_CACHED_VALIDATORS: usize = 1024;

/// A compiled validator for `schema`, from a process-wide cache keyed by the
/// schema's JSON text. Compiling is far costlier than validating (it walks
/// and indexes the whole schema), and every tool call validates against one
/// of a handful of pinned schemas. Pure memoisation: the validator depends
/// only on the text.
fn cached(schema: &Value) -> Result<std::sync::Arc<jsonschema::Validator>, String> {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock, PoisonError};
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<jsonschema::Validator>>>> = OnceLock::new();
    let key = schema.to_string();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(v) = cache
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&key)
    {
        return Ok(Arc::clone(v));
    }
    let validator = Arc::new(compile(schema)?);
    let mut map = cache.lock().unwrap_or_else(PoisonError::into_inner);
    if map.len() >= MAX_CACHED_VALIDATORS {
        map.clear();
    }
    map.insert(key, Arc::clone(&validator));
    Ok(validator)
}

/// See [`super::validate_json`].
pub(super) fn validate_json(schema: &Value, value: &Value) -> Result<(), Vec<String>> {
    let validator = cached(schema).map_err(|e| vec![format!("invalid schema: {e}")])?;
    let errors: Vec<String> = validator
        .iter_errors(value)
        .map(|e| {
            let pointer = e.instance_path().as_str();
            // The root's JSON pointer is the empty string; `/` reads better in
            // a message that a model or an operator has to act on.
            let pointer = if pointer.is_empty() { "/" } else { pointer };
            format!("{pointer}: {}", cap(&e.to_string()))
        })
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Truncate `message` to [`MAX_MESSAGE_CHARS`] characters (never inside a
/// UTF-8 sequence).
fn cap(message: &str) -> String {
    match message.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((at, _)) => format!("{}...", &message[..at]),
        None => message.to_string(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn valid_value_passes() {
        let schema = json!({"type": "object", "required": ["email"],
            "properties": {"email": {"type": "string"}}});
        assert_eq!(validate_json(&schema, &json!({"email": "a@b.c"})), Ok(()));
    }

    #[test]
    fn every_violation_is_listed_with_its_pointer() {
        let schema = json!({
            "type": "object",
            "properties": {"n": {"type": "number"}, "tags": {"type": "array", "items": {"type": "string"}}},
            "required": ["email"],
            "additionalProperties": false
        });
        let errors =
            validate_json(&schema, &json!({"n": "x", "tags": ["a", 3], "zz": 1})).unwrap_err();
        assert_eq!(errors.len(), 4, "{errors:?}");
        assert!(
            errors.contains(&"/n: \"x\" is not of type \"number\"".to_string()),
            "{errors:?}"
        );
        assert!(
            errors.contains(&"/tags/1: 3 is not of type \"string\"".to_string()),
            "{errors:?}"
        );
        assert!(
            errors.contains(&"/: \"email\" is a required property".to_string()),
            "{errors:?}"
        );
        assert!(
            errors
                .iter()
                .any(|e| e
                    .starts_with("/: Additional properties are not allowed ('zz' was unexpected)")),
            "{errors:?}"
        );
    }

    #[test]
    fn date_format_is_asserted() {
        let schema = json!({"type": "string", "format": "date"});
        assert_eq!(validate_json(&schema, &json!("2026-03-01")), Ok(()));
        assert_eq!(
            validate_json(&schema, &json!("next tuesday")).unwrap_err(),
            vec!["/: \"next tuesday\" is not a \"date\"".to_string()]
        );
    }

    #[test]
    fn invalid_schema_is_reported_not_panicked() {
        let errors = validate_json(&json!({"type": "nonsense"}), &json!(1)).unwrap_err();
        assert_eq!(errors.len(), 1);
        assert!(errors[0].starts_with("invalid schema: "), "{errors:?}");
    }

    #[test]
    fn remote_refs_are_refused() {
        let schema = json!({"$ref": "https://example.com/schema.json"});
        let err = compile(&schema).err().unwrap();
        assert!(err.contains("https://example.com/schema.json"), "{err}");
        let schema = json!({"$ref": "file:///etc/passwd"});
        assert!(compile(&schema).is_err());
        // A custom meta-schema would have to be fetched: refused, not panicked.
        let schema = json!({"$schema": "https://example.com/my-meta", "type": "object"});
        assert!(compile(&schema).is_err());
    }

    #[test]
    fn long_messages_are_capped() {
        let big = "x".repeat(10_000);
        let errors = validate_json(&json!({"type": "number"}), &json!(big)).unwrap_err();
        assert!(
            errors[0].len() < MAX_MESSAGE_CHARS + 10,
            "{}",
            errors[0].len()
        );
        assert!(errors[0].ends_with("..."));
        assert_eq!(
            cap("é".repeat(400).as_str()).chars().count(),
            MAX_MESSAGE_CHARS + 3
        );
    }
}
