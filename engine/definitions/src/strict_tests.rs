//! Unit tests of the strict-mode schema rewrite and the null stripping.

#![allow(clippy::unwrap_used)]

use serde_json::{Value, json};

use super::{StrictSchemaError, strip_optional_nulls, to_strict};

fn refused(schema: Value) -> StrictSchemaError {
    to_strict("search", &schema).unwrap_err()
}

#[test]
fn optional_parameters_become_required_and_nullable_and_every_object_is_closed() {
    let schema = json!({
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "What to find"},
            "limit": {"type": "number", "default": 20},
            "since": {"type": "string", "format": "date"},
            "filter": {
                "type": "object",
                "properties": {
                    "tag": {"type": "string"},
                    "kind": {"enum": ["a", "b"]}
                },
                "required": ["tag"],
                "additionalProperties": false
            },
            "ids": {"type": "array", "items": {"type": "number"}}
        },
        "required": ["query", "ids"],
        "additionalProperties": false
    });
    let strict = to_strict("search", &schema).unwrap();
    assert_eq!(
        strict,
        json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to find"},
                "limit": {"type": ["number", "null"], "description": "(default: 20)"},
                "since": {"type": ["string", "null"], "format": "date"},
                "filter": {
                    "type": ["object", "null"],
                    "properties": {
                        "tag": {"type": "string"},
                        "kind": {"enum": ["a", "b", null]}
                    },
                    "required": ["kind", "tag"],
                    "additionalProperties": false
                },
                "ids": {"type": "array", "items": {"type": "number"}}
            },
            "required": ["filter", "ids", "limit", "query", "since"],
            "additionalProperties": false
        })
    );
}

#[test]
fn a_default_is_added_to_the_description_and_a_const_becomes_a_nullable_enum() {
    let schema = json!({
        "type": "object",
        "properties": {
            "unit": {"type": "string", "description": "Unit", "default": "kg"},
            "v": {"const": 1},
            "either": {"anyOf": [{"type": "string"}, {"type": "number"}]}
        },
        "additionalProperties": false
    });
    let strict = to_strict("t", &schema).unwrap();
    assert_eq!(
        strict["properties"]["unit"],
        json!({"type": ["string", "null"], "description": "Unit (default: \"kg\")"})
    );
    assert_eq!(strict["properties"]["v"], json!({"enum": [1, null]}));
    assert_eq!(
        strict["properties"]["either"],
        json!({"anyOf": [{"type": "string"}, {"type": "number"}, {"type": "null"}]})
    );
}

#[test]
fn schemas_strict_mode_cannot_express_are_refused_with_the_pointer_of_the_keyword() {
    let e = refused(json!({
        "type": "object",
        "properties": {"meta": {"type": "object"}},
        "required": ["meta"],
        "additionalProperties": false
    }));
    assert_eq!(e.tool, "search");
    assert_eq!(e.pointer, "/properties/meta");
    assert_eq!(
        e.to_string(),
        "tool `search` cannot use `strict: true`: its schema at `/properties/meta` is an object without declared fields (any JSON object); strict mode needs its fields declared"
    );

    let e = refused(json!({
        "type": "object",
        "properties": {"n": {"type": "number", "minimum": 1}},
        "additionalProperties": false
    }));
    assert_eq!(e.pointer, "/properties/n/minimum");
    assert!(e.reason.contains("`minimum`"), "{}", e.reason);

    let e = refused(json!({
        "type": "object",
        "properties": {"a/b": {"type": "array", "items": {"type": "string", "pattern": "x+"}}},
        "additionalProperties": false
    }));
    assert_eq!(e.pointer, "/properties/a~1b/items/pattern");

    let e = refused(json!({
        "type": "object",
        "properties": {"x": {"type": "string"}},
        "additionalProperties": true
    }));
    assert_eq!(e.pointer, "/additionalProperties");

    let e = refused(json!({
        "type": "object",
        "properties": {"x": {"title": "Hotel"}},
        "additionalProperties": false
    }));
    assert_eq!(e.pointer, "/properties/x");
    assert!(e.reason.contains("no `type`"), "{}", e.reason);

    let e = refused(json!({
        "type": "object",
        "properties": {"x": {"type": "string", "format": "regex"}},
        "additionalProperties": false
    }));
    assert_eq!(e.pointer, "/properties/x/format");

    let e = refused(json!({
        "type": "object",
        "properties": {"xs": {"type": "array"}},
        "additionalProperties": false
    }));
    assert_eq!(e.pointer, "/properties/xs");

    let e = refused(json!({"type": "object", "properties": {"x": true}}));
    assert_eq!(e.pointer, "/properties/x");

    let e = refused(json!({"type": "string"}));
    assert_eq!(e.pointer, "/type");
}

#[test]
fn nulls_of_optional_parameters_are_stripped_and_others_kept() {
    let schema = json!({
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "limit": {"type": "number", "default": 20},
            "maybe": {"type": ["string", "null"]},
            "filter": {
                "type": "object",
                "properties": {"tag": {"type": "string"}, "kind": {"type": "string"}},
                "required": ["tag"],
                "additionalProperties": false
            },
            "rows": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"a": {"type": "string"}},
                    "required": [],
                    "additionalProperties": false
                }
            }
        },
        "required": ["query"],
        "additionalProperties": false
    });
    let mut args = json!({
        "query": null,
        "limit": null,
        "maybe": null,
        "filter": {"tag": null, "kind": null},
        "rows": [{"a": null}, {"a": "x"}]
    });
    strip_optional_nulls(&schema, &mut args);
    // `query` and `filter.tag` are required: a null there is the model's
    // mistake, left for check 2 to refuse. `maybe` takes null itself.
    assert_eq!(
        args,
        json!({
            "query": null,
            "maybe": null,
            "filter": {"tag": null},
            "rows": [{}, {"a": "x"}]
        })
    );
}

/// `strict: true` in a `.tools.abl` file: the stored tool keeps its own
/// schemas and gets the strict model schema (hidden parameters left out);
/// a schema strict mode cannot express is refused at the `strict:` value,
/// naming the tool and the pointer.
#[test]
fn strict_in_a_tools_file_stores_the_strict_schema_or_is_refused_where_it_is_written() {
    let file = |extra: &str, params: &str| {
        format!(
            "TOOLS:\n  search(query: string, limit?: number = 20{params}) -> string\n    type: http\n    endpoint: /s\n    permission: p\n    repeat_safety: idempotent\n{extra}"
        )
    };
    let parse = |text: &str| crate::abl::parse_tools_file("t.tools.abl", text);

    let out = parse(&file("    strict: true\n", ", tenant: string"));
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    let out = parse(&file(
        "    strict: true\n    parameters:\n      tenant:\n        hidden: true\n        default: acme\n",
        ", tenant: string",
    ));
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    let tool = &out.tools[0];
    assert_eq!(
        tool.strict_schema,
        Some(json!({
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": ["number", "null"], "description": "(default: 20)"}
            },
            "required": ["limit", "query"],
            "additionalProperties": false
        }))
    );
    // The tool's own schema keeps the hidden parameter; the model's does not.
    assert!(tool.input_schema["properties"].get("tenant").is_some());

    let out = parse(&file("    strict: false\n", ""));
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    assert_eq!(out.tools[0].strict_schema, None);
    let out = parse(&file("", ""));
    assert_eq!(out.tools[0].strict_schema, None);

    let out = parse(&file("    strict: true\n", ", meta?: object"));
    let errors: Vec<String> = out.errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        errors,
        vec![
            "t.tools.abl:7:13: tool `search` cannot use `strict: true`: its schema at `/properties/meta` is an object without declared fields (any JSON object); strict mode needs its fields declared"
        ]
    );
    assert!(out.tools.is_empty());

    let out = parse(&file("    strict: yes\n", ""));
    let errors: Vec<String> = out.errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        errors,
        vec!["t.tools.abl:7:13: unknown strict `yes` (expected `true` or `false`)"]
    );
}
