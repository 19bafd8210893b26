//! `body_schema:` with `use_body_schema: true`: the JSON value a request
//! body is made from is authored from the schema, then checked against it,
//! before the call is dispatched.
//!
//! Authored: each top-level property the schema declares with a `default`
//! and the value lacks is added with that default (so a tool's body can
//! carry constants the model never supplies, as the input schema's
//! defaults do for the arguments). Checked: the value must then satisfy
//! the schema (JSON Schema 2020-12 unless it says otherwise, formats
//! asserted, no remote `$ref`). The value is the JSON body (arguments or
//! filled template), or the object a form or XML body is encoded from.
//! A body that does not satisfy it is [`HttpToolError::BodySchema`]:
//! refused before dispatch, nothing sent, and not repeated (the same
//! arguments make the same body); the message lists each violation with
//! its JSON pointer.

use serde_json::Value;

use super::HttpToolError;
use crate::mcp::schema::{compile, validate};

/// `value` with `schema`'s top-level defaults filled in, if it satisfies
/// `schema`.
pub(super) fn author_and_check(schema: &Value, value: Value) -> Result<Value, HttpToolError> {
    let value = with_defaults(schema, value);
    let validator = compile(schema).map_err(|e| {
        HttpToolError::Config(format!(
            "the tool's `body_schema` is not a valid JSON Schema: {e}"
        ))
    })?;
    validate(&validator, &value).map_err(HttpToolError::BodySchema)?;
    Ok(value)
}

/// Absent top-level properties that `schema` gives a `default`, filled in.
fn with_defaults(schema: &Value, mut value: Value) -> Value {
    let (Value::Object(map), Some(props)) = (
        &mut value,
        schema.get("properties").and_then(Value::as_object),
    ) else {
        return value;
    };
    for (name, prop) in props {
        if !map.contains_key(name)
            && let Some(default) = prop.get("default")
        {
            map.insert(name.clone(), default.clone());
        }
    }
    value
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_are_filled_then_the_body_is_checked() {
        let schema = json!({"type": "object", "required": ["amount", "currency"],
            "properties": {"amount": {"type": "number", "minimum": 0},
                           "currency": {"type": "string", "default": "EUR"}},
            "additionalProperties": false});
        assert_eq!(
            author_and_check(&schema, json!({"amount": 3})).unwrap(),
            json!({"amount": 3, "currency": "EUR"})
        );
        let err = author_and_check(&schema, json!({"amount": -1, "x": 1})).unwrap_err();
        assert_eq!(err.class(), belay_proto::v1::FailureClass::Rejected);
        let message = err.to_string();
        assert!(
            message.contains("/amount: -1 is less than the minimum of 0"),
            "{message}"
        );
        assert!(message.contains("nothing was sent"), "{message}");
    }
}
