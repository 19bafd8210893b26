//! Strict mode (`strict: true` on a tool): the tool's model schema rewritten
//! into the subset of JSON Schema that both providers constrain generation
//! to, and the arguments a strict model sends read back into the tool's own
//! shape.
//!
//! The subset is the intersection of OpenAI's Structured Outputs rules for
//! function calling and Anthropic's strict tool use ("JSON Schema
//! limitations" of both providers' docs):
//! - every object lists each of its properties in `required` and says
//!   `additionalProperties: false`; a property the tool does not require
//!   becomes nullable (`"type": ["string", "null"]`, `null` added to an
//!   `enum`, `{"type": "null"}` added to an `anyOf`), so the model says
//!   "not given" with `null`;
//! - keywords kept: `type`, `properties`, `required`,
//!   `additionalProperties` (only `false`), `items`, `enum`, `const`,
//!   `anyOf`, `description`, `title`, and `format` with the formats both
//!   accept; `default` is not a constraint either provider takes, so it is
//!   dropped and said in the description instead (`(default: 20)`);
//! - anything else (`minimum`, `minLength`, `pattern`, `oneOf`, `$ref`, a
//!   free-form object, a schema without a `type`, …) cannot be made strict:
//!   [`to_strict`] refuses it with a [`StrictSchemaError`] naming the JSON
//!   pointer of the offending keyword, so the author hears it when the
//!   definition is registered, never a provider's 400 at run time.
//!
//! [`strip_optional_nulls`] undoes the nullable rewrite on the way back:
//! a `null` the model sent for a property the tool does not require is
//! removed (so the default applies, or the parameter is absent, as for a
//! model that left it out) before check 2 validates the arguments against
//! the tool's own schema.
//!
//! Pure code: no I/O.

use serde_json::{Map, Value};

/// Formats both providers accept in strict mode (OpenAI's and Anthropic's
/// lists intersected).
const STRICT_FORMATS: &[&str] = &[
    "date",
    "date-time",
    "time",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uuid",
    "uri",
];

/// Why a tool's schema cannot be made strict: the tool, the JSON pointer
/// (RFC 6901) of the offending keyword in the tool's model schema, and what
/// is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tool `{tool}` cannot use `strict: true`: its schema at `{pointer}` {reason}")]
pub struct StrictSchemaError {
    /// The tool's name.
    pub tool: String,
    /// JSON pointer of the offending keyword (or of the schema that lacks
    /// one), e.g. `/properties/limit/minimum`.
    pub pointer: String,
    /// What is wrong and, where there is one, what to do instead.
    pub reason: String,
}

/// The strict form of `schema`, the model schema of tool `tool` (see the
/// module doc for the rules). The root must be an object schema.
pub fn to_strict(tool: &str, schema: &Value) -> Result<Value, StrictSchemaError> {
    let fail = |pointer: &str, reason: String| StrictSchemaError {
        tool: tool.to_owned(),
        pointer: if pointer.is_empty() {
            "/".to_owned()
        } else {
            pointer.to_owned()
        },
        reason,
    };
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        return Err(fail(
            "/type",
            "is not `\"object\"`: a tool's arguments are an object".into(),
        ));
    }
    convert(schema, "").map_err(|(pointer, reason)| fail(&pointer, reason))
}

/// One schema and everything under it; `Err((pointer, reason))`.
fn convert(schema: &Value, at: &str) -> Result<Value, (String, String)> {
    let Value::Object(map) = schema else {
        return Err((
            at.to_owned(),
            "is a boolean schema, which accepts anything; declare the value's type".into(),
        ));
    };
    let mut out = Map::new();
    let mut default_note = None;
    for (key, value) in map {
        let here = format!("{at}/{}", escape(key));
        match key.as_str() {
            "type" | "enum" | "const" | "description" | "title" | "required" => {
                out.insert(key.clone(), value.clone());
            }
            "format" => match value.as_str() {
                Some(f) if STRICT_FORMATS.contains(&f) => {
                    out.insert(key.clone(), value.clone());
                }
                _ => {
                    return Err((
                        here,
                        format!(
                            "uses `format: {value}`, which strict mode does not take (it takes {})",
                            STRICT_FORMATS.join(", ")
                        ),
                    ));
                }
            },
            "default" => default_note = Some(value.to_string()),
            "additionalProperties" => {
                if value != &Value::Bool(false) {
                    return Err((
                        here,
                        "allows properties it does not declare; strict mode needs every object closed (`additionalProperties: false`): declare the fields".into(),
                    ));
                }
            }
            "properties" | "items" | "anyOf" => {}
            other => {
                return Err((
                    here,
                    format!(
                        "uses `{other}`, which strict mode does not support (it keeps type, properties, required, items, enum, const, anyOf, description, title and format)"
                    ),
                ));
            }
        }
    }
    let types: Vec<&str> = match map.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        Some(_) => {
            return Err((
                format!("{at}/type"),
                "is not a type name or a list of them".into(),
            ));
        }
        None if map.contains_key("enum")
            || map.contains_key("const")
            || map.contains_key("anyOf") =>
        {
            Vec::new()
        }
        None => {
            return Err((
                at.to_owned(),
                "has no `type`: strict mode needs every value's type declared".into(),
            ));
        }
    };
    if types.contains(&"object") {
        let Some(Value::Object(props)) = map.get("properties") else {
            return Err((
                at.to_owned(),
                "is an object without declared fields (any JSON object); strict mode needs its fields declared".into(),
            ));
        };
        let required: Vec<&str> = map
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut new_props = Map::new();
        for (name, prop) in props {
            let here = format!("{at}/properties/{}", escape(name));
            let mut strict = convert(prop, &here)?;
            if !required.contains(&name.as_str()) {
                make_nullable(&mut strict);
            }
            new_props.insert(name.clone(), strict);
        }
        let all: Vec<Value> = props.keys().cloned().map(Value::String).collect();
        out.insert("properties".into(), Value::Object(new_props));
        out.insert("required".into(), Value::Array(all));
        out.insert("additionalProperties".into(), Value::Bool(false));
    } else if map.contains_key("properties") {
        return Err((
            format!("{at}/properties"),
            "is set on a schema whose `type` is not `object`".into(),
        ));
    }
    if types.contains(&"array") {
        let Some(items) = map.get("items") else {
            return Err((
                at.to_owned(),
                "is an array without `items`; strict mode needs the item type declared".into(),
            ));
        };
        out.insert("items".into(), convert(items, &format!("{at}/items"))?);
    } else if map.contains_key("items") {
        return Err((
            format!("{at}/items"),
            "is set on a schema whose `type` is not `array`".into(),
        ));
    }
    if let Some(any_of) = map.get("anyOf") {
        let Value::Array(options) = any_of else {
            return Err((format!("{at}/anyOf"), "is not a list of schemas".into()));
        };
        let converted = options
            .iter()
            .enumerate()
            .map(|(i, o)| convert(o, &format!("{at}/anyOf/{i}")))
            .collect::<Result<Vec<_>, _>>()?;
        out.insert("anyOf".into(), Value::Array(converted));
    }
    if let Some(default) = default_note {
        let text = match out.get("description").and_then(Value::as_str) {
            Some(d) if !d.is_empty() => format!("{d} (default: {default})"),
            _ => format!("(default: {default})"),
        };
        out.insert("description".into(), Value::String(text));
    }
    Ok(Value::Object(out))
}

/// Make a converted schema also accept `null`.
fn make_nullable(schema: &mut Value) {
    let Value::Object(map) = schema else {
        return;
    };
    match map.get_mut("type") {
        Some(Value::String(t)) if t != "null" => {
            let t = std::mem::take(t);
            map.insert("type".into(), Value::Array(vec![t.into(), "null".into()]));
        }
        Some(Value::Array(ts)) if !ts.iter().any(|t| t == "null") => ts.push("null".into()),
        _ => {}
    }
    if let Some(Value::Array(values)) = map.get_mut("enum")
        && !values.contains(&Value::Null)
    {
        values.push(Value::Null);
    }
    if let Some(Value::Array(options)) = map.get_mut("anyOf")
        && !options
            .iter()
            .any(|o| o.get("type") == Some(&"null".into()))
    {
        options.push(serde_json::json!({"type": "null"}));
    }
    if let Some(constant) = map.remove("const") {
        // `const` allows one value; a nullable constant is a choice of two.
        map.insert("enum".into(), Value::Array(vec![constant, Value::Null]));
    }
}

/// RFC 6901 escaping of one pointer segment.
fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

/// Removes, from `args` as a strict model sent them, every `null` given for
/// a property that `schema` (the tool's own model schema, not the strict
/// one) does not require and whose schema does not itself accept `null`,
/// in nested objects and array items too. What is left is what a model
/// without strict mode would have sent for the same intent; check 2 then
/// validates it against `schema`.
pub fn strip_optional_nulls(schema: &Value, args: &mut Value) {
    match args {
        Value::Object(map) => {
            let Some(props) = schema.get("properties").and_then(Value::as_object) else {
                return;
            };
            let required: Vec<&str> = schema
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            map.retain(|name, value| {
                !(value.is_null()
                    && !required.contains(&name.as_str())
                    && props.get(name).is_some_and(|p| !accepts_null(p)))
            });
            for (name, value) in map.iter_mut() {
                if let Some(prop) = props.get(name) {
                    strip_optional_nulls(prop, value);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for item in items {
                    strip_optional_nulls(item_schema, item);
                }
            }
        }
        _ => {}
    }
}

/// Whether a schema (of the tool's own, non-strict kind) declares `null`
/// as a value it takes.
fn accepts_null(schema: &Value) -> bool {
    match schema.get("type") {
        Some(Value::String(t)) => t == "null",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "null"),
        _ => {
            schema
                .get("enum")
                .and_then(Value::as_array)
                .is_some_and(|e| e.contains(&Value::Null))
                || schema.get("const") == Some(&Value::Null)
        }
    }
}

#[cfg(test)]
#[path = "strict_tests.rs"]
mod tests;
