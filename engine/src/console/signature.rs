//! A tool's signature as `.tools.abl` writes it, read back from the JSON
//! Schemas a definition stores: `name(a: string, b?: number = 1) -> {id: string}`.
//! (Parameters come in the stored schema's order, which is by name.)

use serde_json::Value;

/// Deepest nesting rendered; deeper types are shown as `…`.
const MAX_DEPTH: usize = 6;

/// The type a JSON Schema describes, in the signature syntax.
pub(crate) fn type_text(schema: &Value) -> String {
    type_at(schema, 0)
}

fn type_at(schema: &Value, depth: usize) -> String {
    if depth > MAX_DEPTH {
        return "…".into();
    }
    if let Some(values) = schema["enum"].as_array() {
        return values
            .iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join(" | ");
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(options) = schema[key].as_array() {
            return options
                .iter()
                .map(|o| type_at(o, depth + 1))
                .collect::<Vec<_>>()
                .join(" | ");
        }
    }
    match &schema["type"] {
        Value::String(t) if t == "array" => format!("{}[]", type_at(&schema["items"], depth + 1)),
        Value::String(t) if t == "object" => object_text(schema, depth),
        Value::String(t) => t.clone(),
        Value::Array(types) => types
            .iter()
            .map(|t| t.as_str().unwrap_or("?"))
            .collect::<Vec<_>>()
            .join(" | "),
        _ if schema.get("properties").is_some() => object_text(schema, depth),
        _ => "any".into(),
    }
}

/// The fields of an object schema: `(name, optional, type, default)`.
fn fields(schema: &Value, depth: usize) -> Vec<(String, bool, String, Option<String>)> {
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    schema["properties"]
        .as_object()
        .map(|props| {
            props
                .iter()
                .map(|(name, s)| {
                    (
                        name.clone(),
                        !required.contains(&name.as_str()),
                        type_at(s, depth + 1),
                        s.get("default").map(Value::to_string),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn object_text(schema: &Value, depth: usize) -> String {
    let inner: Vec<String> = fields(schema, depth)
        .into_iter()
        .map(|(n, opt, t, _)| format!("{n}{}: {t}", if opt { "?" } else { "" }))
        .collect();
    if inner.is_empty() {
        "object".into()
    } else {
        format!("{{{}}}", inner.join(", "))
    }
}

/// The whole signature of a tool.
pub(crate) fn signature(name: &str, input: &Value, output: &Value) -> String {
    let params: Vec<String> = fields(input, 0)
        .into_iter()
        .map(|(n, opt, t, default)| {
            let default = default.map(|d| format!(" = {d}")).unwrap_or_default();
            let opt = if opt && default.is_empty() { "?" } else { "" };
            format!("{n}{opt}: {t}{default}")
        })
        .collect();
    format!("{name}({}) -> {}", params.join(", "), type_text(output))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn schemas_read_back_as_signatures() {
        let input = json!({"type": "object", "required": ["email", "name"], "properties": {
            "email": {"type": "string"}, "name": {"type": "string"},
            "plan": {"type": "string", "default": "starter"},
            "files": {"type": "array", "items": {"type": "string"}},
            "mode": {"enum": ["a", "b"]}}});
        let output = json!({"type": "object", "required": ["account_id"], "properties": {"account_id": {"type": "string"}}});
        assert_eq!(
            signature("create_account", &input, &output),
            r#"create_account(email: string, files?: string[], mode?: "a" | "b", name: string, plan: string = "starter") -> {account_id: string}"#
        );
        assert_eq!(type_text(&json!({})), "any");
    }
}
