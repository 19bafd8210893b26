//! From a tool as an MCP server lists it to a pinned Belay definition: schema
//! checks, refusals with a reason, the definition hash, and the compiled
//! validators used at call time.
//!
//! What Belay can represent (anything else is a [`SchemaRefusal`]):
//! - an input schema and an output schema that are JSON objects with
//!   `"type": "object"` (the MCP rule), at most [`MAX_SCHEMA_BYTES`] bytes and
//!   [`MAX_SCHEMA_DEPTH`] levels deep;
//! - `$ref` / `$dynamicRef` / `$recursiveRef` only to the same document
//!   (`#…`): a remote reference would make validation fetch URLs;
//! - `$schema`, when given, one of drafts 4, 6, 7, 2019-09 and 2020-12;
//! - a schema that `jsonschema` compiles (with no retriever and formats
//!   asserted, as the engine does).
//!
//! The definition hash is `sha256:` + the hex SHA-256 of the canonical JSON
//! (object keys sorted, no whitespace) of
//! `{"annotations", "description", "inputSchema", "name", "outputSchema"}`,
//! absent fields as `null`. `annotations` holds the hints as Belay reads them
//! (`title`, `readOnlyHint`, `destructiveHint`, `idempotentHint`,
//! `openWorldHint`, absent ones left out). A tool whose hash changes is a
//! different tool: the engine refuses it until an operator accepts it.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::McpToolDefinition;
use super::ToolHints;

/// Largest schema (input or output) accepted, in bytes of compact JSON.
pub const MAX_SCHEMA_BYTES: usize = 256 * 1024;
/// Deepest schema accepted, in nesting levels of JSON objects and arrays.
pub const MAX_SCHEMA_DEPTH: usize = 64;
/// Longest tool name accepted, in bytes.
pub const MAX_TOOL_NAME_BYTES: usize = 128;

/// `$schema` values Belay validates with (with and without the trailing `#`,
/// `http` or `https`).
const KNOWN_DIALECTS: &[&str] = &[
    "json-schema.org/draft-04/schema",
    "json-schema.org/draft-06/schema",
    "json-schema.org/draft-07/schema",
    "json-schema.org/draft/2019-09/schema",
    "json-schema.org/draft/2020-12/schema",
];

/// Which of a tool's two schemas a refusal is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SchemaSide {
    /// `inputSchema`: the arguments.
    Input,
    /// `outputSchema`: the `structuredContent`.
    Output,
}

impl fmt::Display for SchemaSide {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Input => "input schema",
            Self::Output => "output schema",
        })
    }
}

/// Why a listed tool cannot become a Belay tool. The tool is kept out of the
/// catalog and every call to it is refused before anything is sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SchemaRefusal {
    /// The name is empty, longer than [`MAX_TOOL_NAME_BYTES`], or has control
    /// characters.
    #[error("tool name is not usable: {reason}")]
    InvalidName {
        /// Why.
        reason: String,
    },
    /// The schema's `type` is not `"object"` (or is missing).
    #[error("{side} must have \"type\": \"object\", found {found}")]
    NotAnObject {
        /// Which schema.
        side: SchemaSide,
        /// What was found instead, e.g. `"type": "string"` or `no type`.
        found: String,
    },
    /// A `$ref` (or `$dynamicRef`, `$recursiveRef`) outside the document.
    #[error("{side} refers to an external schema `{reference}`; only `#…` references are allowed")]
    RemoteRef {
        /// Which schema.
        side: SchemaSide,
        /// The reference.
        reference: String,
    },
    /// `$schema` names a dialect Belay does not validate with.
    #[error("{side} uses the JSON Schema dialect `{uri}`, which Belay does not support")]
    UnsupportedDialect {
        /// Which schema.
        side: SchemaSide,
        /// The `$schema` value.
        uri: String,
    },
    /// The schema is larger than [`MAX_SCHEMA_BYTES`].
    #[error("{side} is {bytes} bytes, more than the {limit} allowed")]
    TooLarge {
        /// Which schema.
        side: SchemaSide,
        /// Its size in compact JSON, in bytes.
        bytes: usize,
        /// The limit, in bytes.
        limit: usize,
    },
    /// The schema nests deeper than [`MAX_SCHEMA_DEPTH`].
    #[error("{side} nests deeper than {limit} levels")]
    TooDeep {
        /// Which schema.
        side: SchemaSide,
        /// The limit, in levels.
        limit: usize,
    },
    /// `jsonschema` refuses to compile it (invalid keyword value, unresolvable
    /// local `$ref`, …).
    #[error("{side} is not a valid JSON Schema: {message}")]
    Invalid {
        /// Which schema.
        side: SchemaSide,
        /// The compiler's message, capped.
        message: String,
    },
}

/// A tool as listed by a server, before mapping: the rmcp-free shape the
/// client hands to [`map_tool`].
#[derive(Debug, Clone, PartialEq)]
pub struct RawTool {
    /// Name on the server.
    pub name: String,
    /// Display title.
    pub title: Option<String>,
    /// Description (untrusted text).
    pub description: Option<String>,
    /// `inputSchema`, as listed.
    pub input_schema: Value,
    /// `outputSchema`, as listed.
    pub output_schema: Option<Value>,
    /// `annotations`, as Belay reads them (see the module docs).
    pub annotations: Option<Value>,
}

/// A mapped tool with its compiled validators.
pub(crate) struct CompiledTool {
    pub(crate) definition: McpToolDefinition,
    pub(crate) input: jsonschema::Validator,
    pub(crate) output: Option<jsonschema::Validator>,
}

/// `sha256:<hex>` of the canonical definition document (see the module docs).
pub fn definition_hash(tool: &RawTool) -> String {
    let doc = serde_json::json!({
        "annotations": tool.annotations.clone().unwrap_or(Value::Null),
        "description": tool.description.clone().map(Value::String).unwrap_or(Value::Null),
        "inputSchema": tool.input_schema,
        "name": tool.name,
        "outputSchema": tool.output_schema.clone().unwrap_or(Value::Null),
    });
    let mut canonical = String::new();
    write_canonical(&doc, &mut canonical);
    format!(
        "sha256:{}",
        hex::encode(Sha256::digest(canonical.as_bytes()))
    )
}

/// Canonical JSON: keys sorted by their UTF-8 bytes, no whitespace, strings
/// and numbers as serde_json writes them. Independent of whether serde_json
/// keeps insertion order.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String((*key).clone()).to_string());
                out.push(':');
                if let Some(v) = map.get(*key) {
                    write_canonical(v, out);
                }
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// [`map_tool`] without the validators: the pinned definition of a listed
/// tool, or why it cannot be one (with the hash of what was refused). Pure;
/// for the fuzz target of MCP messages and for tests.
pub fn check_tool(tool: &RawTool) -> Result<McpToolDefinition, (String, SchemaRefusal)> {
    map_tool(tool).map(|compiled| compiled.definition)
}

/// Maps a listed tool to a pinned definition, or says why it cannot be one.
/// `Err` carries the hash too, so an operator can see which definition was
/// refused.
pub(crate) fn map_tool(tool: &RawTool) -> Result<CompiledTool, (String, SchemaRefusal)> {
    let hash = definition_hash(tool);
    let compile = || -> Result<CompiledTool, SchemaRefusal> {
        check_name(&tool.name)?;
        let input = check_schema(SchemaSide::Input, &tool.input_schema)?;
        let output = match &tool.output_schema {
            Some(schema) => Some(check_schema(SchemaSide::Output, schema)?),
            None => None,
        };
        Ok(CompiledTool {
            definition: McpToolDefinition {
                name: tool.name.clone(),
                title: tool.title.clone(),
                description: tool.description.clone(),
                input_schema: tool.input_schema.clone(),
                output_schema: tool.output_schema.clone(),
                hints: ToolHints::from_annotations(tool.annotations.as_ref()),
                definition_hash: hash.clone(),
            },
            input,
            output,
        })
    };
    compile().map_err(|refusal| (hash.clone(), refusal))
}

fn check_name(name: &str) -> Result<(), SchemaRefusal> {
    let reason = if name.is_empty() {
        "empty"
    } else if name.len() > MAX_TOOL_NAME_BYTES {
        "longer than 128 bytes"
    } else if name.chars().any(char::is_control) {
        "contains control characters"
    } else {
        return Ok(());
    };
    Err(SchemaRefusal::InvalidName {
        reason: reason.to_owned(),
    })
}

/// Checks one schema against the rules of the module docs and compiles it.
fn check_schema(side: SchemaSide, schema: &Value) -> Result<jsonschema::Validator, SchemaRefusal> {
    let bytes = serde_json::to_vec(schema).map(|v| v.len()).unwrap_or(0);
    if bytes > MAX_SCHEMA_BYTES {
        return Err(SchemaRefusal::TooLarge {
            side,
            bytes,
            limit: MAX_SCHEMA_BYTES,
        });
    }
    if depth(schema) > MAX_SCHEMA_DEPTH {
        return Err(SchemaRefusal::TooDeep {
            side,
            limit: MAX_SCHEMA_DEPTH,
        });
    }
    match schema.get("type") {
        Some(Value::String(t)) if t == "object" => {}
        Some(other) => {
            return Err(SchemaRefusal::NotAnObject {
                side,
                found: format!("\"type\": {other}"),
            });
        }
        None => {
            let found = if schema.is_object() {
                "no type".to_owned()
            } else {
                format!("a JSON {}", json_kind(schema))
            };
            return Err(SchemaRefusal::NotAnObject { side, found });
        }
    }
    if let Some(dialect) = schema.get("$schema") {
        let uri = dialect.as_str().unwrap_or_default();
        let bare = uri
            .trim_start_matches("https://")
            .trim_start_matches("http://")
            .trim_end_matches('#');
        if !KNOWN_DIALECTS.contains(&bare) {
            return Err(SchemaRefusal::UnsupportedDialect {
                side,
                uri: dialect.to_string(),
            });
        }
    }
    if let Some(reference) = first_remote_ref(schema) {
        return Err(SchemaRefusal::RemoteRef { side, reference });
    }
    compile(schema).map_err(|message| SchemaRefusal::Invalid { side, message })
}

/// Compiles a schema with no retriever (a remote `$ref` fails instead of
/// being fetched, whatever jsonschema features another crate enables) and
/// formats asserted.
pub(crate) fn compile(schema: &Value) -> Result<jsonschema::Validator, String> {
    jsonschema::options()
        .with_retriever(NoRetrieve)
        .should_validate_formats(true)
        .build(schema)
        .map_err(|e| cap(&e.to_string()))
}

/// Validates `value`; `Err` lists up to 10 violations as `pointer: message`.
pub(crate) fn validate(validator: &jsonschema::Validator, value: &Value) -> Result<(), String> {
    let errors: Vec<String> = validator
        .iter_errors(value)
        .take(10)
        .map(|e| {
            let pointer = e.instance_path().as_str();
            let pointer = if pointer.is_empty() { "/" } else { pointer };
            format!("{pointer}: {}", cap(&e.to_string()))
        })
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

struct NoRetrieve;

impl jsonschema::Retrieve for NoRetrieve {
    fn retrieve(
        &self,
        uri: &jsonschema::Uri<String>,
    ) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        Err(format!("external schema `{}` is not allowed", uri.as_str()).into())
    }
}

fn first_remote_ref(value: &Value) -> Option<String> {
    match value {
        Value::Object(map) => {
            for key in ["$ref", "$dynamicRef", "$recursiveRef"] {
                if let Some(Value::String(r)) = map.get(key)
                    && !r.starts_with('#')
                {
                    return Some(r.clone());
                }
            }
            map.values().find_map(first_remote_ref)
        }
        Value::Array(items) => items.iter().find_map(first_remote_ref),
        _ => None,
    }
}

fn depth(value: &Value) -> usize {
    // Iterative, so a hostile 10 000-level schema cannot overflow the stack.
    let mut max = 0;
    let mut stack = vec![(value, 1usize)];
    while let Some((v, d)) = stack.pop() {
        match v {
            Value::Object(map) => {
                max = max.max(d);
                stack.extend(map.values().map(|c| (c, d + 1)));
            }
            Value::Array(items) => {
                max = max.max(d);
                stack.extend(items.iter().map(|c| (c, d + 1)));
            }
            _ => {}
        }
    }
    max
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Caps a compiler or validator message at 300 characters.
fn cap(message: &str) -> String {
    match message.char_indices().nth(300) {
        Some((at, _)) => format!("{}...", &message[..at]),
        None => message.to_owned(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn raw(input: Value, output: Option<Value>) -> RawTool {
        RawTool {
            name: "t".into(),
            title: None,
            description: Some("d".into()),
            input_schema: input,
            output_schema: output,
            annotations: Some(json!({"readOnlyHint": true})),
        }
    }

    fn refusal(tool: &RawTool) -> SchemaRefusal {
        match map_tool(tool) {
            Ok(_) => panic!("expected a refusal"),
            Err((_, r)) => r,
        }
    }

    #[test]
    fn maps_an_object_schema_and_reads_hints() {
        let tool = raw(
            json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}),
            Some(json!({"type": "object", "properties": {"n": {"type": "number"}}})),
        );
        let compiled = map_tool(&tool).ok().unwrap();
        assert_eq!(compiled.definition.hints.read_only, Some(true));
        assert!(compiled.definition.definition_hash.starts_with("sha256:"));
        assert!(validate(&compiled.input, &json!({"a": "x"})).is_ok());
        let err = validate(&compiled.input, &json!({"a": 1})).unwrap_err();
        assert!(err.starts_with("/a:"), "{err}");
    }

    #[test]
    fn hash_is_canonical_and_sensitive() {
        let a = raw(
            json!({"type": "object", "properties": {"x": {}, "y": {}}}),
            None,
        );
        let b = raw(
            serde_json::from_str(r#"{"properties": {"y": {}, "x": {}}, "type": "object"}"#)
                .unwrap(),
            None,
        );
        assert_eq!(definition_hash(&a), definition_hash(&b));
        let mut c = a.clone();
        c.description = Some("changed".into());
        assert_ne!(definition_hash(&a), definition_hash(&c));
        let mut d = a.clone();
        d.annotations = Some(json!({"readOnlyHint": false}));
        assert_ne!(definition_hash(&a), definition_hash(&d));
        assert_eq!(
            canonical_json(&json!({"b": [1, {"d": "é\n", "c": null}], "a": true})),
            r#"{"a":true,"b":[1,{"c":null,"d":"é\n"}]}"#
        );
    }

    #[test]
    fn refuses_what_it_cannot_represent() {
        assert!(matches!(
            refusal(&raw(json!({"type": "string"}), None)),
            SchemaRefusal::NotAnObject { side: SchemaSide::Input, found } if found.contains("string")
        ));
        assert!(matches!(
            refusal(&raw(json!({"properties": {}}), None)),
            SchemaRefusal::NotAnObject { found, .. } if found == "no type"
        ));
        assert!(matches!(
            refusal(&raw(
                json!({"type": "object"}),
                Some(json!({"type": "array"}))
            )),
            SchemaRefusal::NotAnObject {
                side: SchemaSide::Output,
                ..
            }
        ));
        assert_eq!(
            refusal(&raw(
                json!({"type": "object", "properties": {"a": {"$ref": "https://evil.example/s.json"}}}),
                None
            )),
            SchemaRefusal::RemoteRef {
                side: SchemaSide::Input,
                reference: "https://evil.example/s.json".into()
            }
        );
        assert!(matches!(
            refusal(&raw(
                json!({"type": "object", "$schema": "http://example.com/my-dialect"}),
                None
            )),
            SchemaRefusal::UnsupportedDialect { .. }
        ));
        assert!(matches!(
            refusal(&raw(
                json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}),
                None
            )),
            SchemaRefusal::Invalid { .. }
        ));
        assert!(matches!(
            refusal(&raw(json!({"type": "object", "minProperties": "x"}), None)),
            SchemaRefusal::Invalid { .. }
        ));
        let mut deep = json!({"type": "object"});
        for _ in 0..100 {
            deep = json!({"type": "object", "properties": {"x": deep}});
        }
        assert!(matches!(
            refusal(&raw(deep, None)),
            SchemaRefusal::TooDeep { .. }
        ));
        let mut unnamed = raw(json!({"type": "object"}), None);
        unnamed.name = String::new();
        assert!(matches!(
            refusal(&unnamed),
            SchemaRefusal::InvalidName { .. }
        ));
        // Local references and the known dialects are fine.
        assert!(
            map_tool(&raw(
                json!({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
                       "definitions": {"s": {"type": "string"}},
                       "properties": {"a": {"$ref": "#/definitions/s"}}}),
                None
            ))
            .is_ok()
        );
    }
}
