//! Property tests of the signature parser (`signature.rs`), of the JSON
//! Schema built from signatures (`signature.rs`, checked with `schema.rs`)
//! and of whole `.tools.abl` files (`abl.rs`).
//!
//! Declarations are generated as syntax trees, rendered to text and parsed
//! back: the parse must equal the tree (round trip), and rendering the
//! parse gives the same text. The schema properties compile every
//! generated schema and validate values generated from the declaration
//! (they must pass) and the same values with one part broken (they must
//! not). The runs are deterministic: a fixed seed, no persisted failures
//! (a failure found here gets an example test next to the code it fixes).

#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use serde_json::{Map, Number, Value, json};

use super::abl::parse_tools_file;
use super::schema::{compile, validate_json};
use super::signature::{
    Direction, Field, Prim, Signature, TypeExpr, input_schema, parse_field_decl, parse_signature,
    type_schema,
};

/// Fixed seed and case count: the same inputs on every run and machine.
fn config(cases: u32) -> Config {
    Config {
        cases,
        rng_seed: RngSeed::Fixed(0x00be_1a70_0004),
        failure_persistence: None,
        ..Config::default()
    }
}

// ---------------------------------------------------------------- strategies

/// A parameter or field name (snake_case, as tool names are).
fn ident() -> impl Strategy<Value = String> {
    "[a-z_][a-z0-9_]{0,7}"
}

/// A named (PascalCase) type, allowed in return types only.
fn named_type() -> impl Strategy<Value = TypeExpr> {
    "[A-Z][A-Za-z0-9_]{0,6}".prop_map(|name| TypeExpr::Named { name, column: 0 })
}

fn prim() -> impl Strategy<Value = TypeExpr> {
    prop_oneof![
        Just(Prim::String),
        Just(Prim::Number),
        Just(Prim::Boolean),
        Just(Prim::Date),
        Just(Prim::Object),
    ]
    .prop_map(TypeExpr::Prim)
}

/// Give the fields unique names (a generated name plus its index when it
/// is taken), as the parser demands.
fn unique(mut fields: Vec<Field>) -> Vec<Field> {
    let mut seen = std::collections::BTreeSet::new();
    for (i, f) in fields.iter_mut().enumerate() {
        if !seen.insert(f.name.clone()) {
            f.name = format!("{}_{i}", f.name);
            seen.insert(f.name.clone());
        }
    }
    fields
}

fn field(name: String, optional: bool, ty: TypeExpr, default: Option<Value>) -> Field {
    Field {
        name,
        column: 0,
        optional,
        ty,
        default,
        description: None,
    }
}

/// A type expression: built-ins, `{fields}` (fields optional or not, no
/// defaults), `type[]` at any depth, and named types where `named`.
fn type_expr(named: bool) -> impl Strategy<Value = TypeExpr> {
    let leaf = if named {
        prop_oneof![4 => prim(), 1 => named_type()].boxed()
    } else {
        prim().boxed()
    };
    leaf.prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            inner.clone().prop_map(|t| TypeExpr::Array(Box::new(t))),
            prop::collection::vec((ident(), any::<bool>(), inner), 0..4).prop_map(|fs| {
                TypeExpr::Object(unique(
                    fs.into_iter()
                        .map(|(n, o, t)| field(n, o, t, None))
                        .collect(),
                ))
            }),
        ]
    })
}

/// A `YYYY-MM-DD` date that exists (leap days included).
fn date() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u32..=9999, 1u32..=12, 1u32..=28).prop_map(|(y, m, d)| format!("{y:04}-{m:02}-{d:02}")),
        (0u32..=2499)
            .prop_map(|q| format!("{:04}-02-29", q * 4))
            .prop_filter("a leap year", |s| {
                let y: u32 = s[..4].parse().unwrap_or(1);
                !y.is_multiple_of(100) || y.is_multiple_of(400)
            }),
    ]
}

/// Any finite JSON number: small and extreme integers, floats.
fn number() -> impl Strategy<Value = Number> {
    prop_oneof![
        (-1000i64..1000).prop_map(Number::from),
        any::<i64>().prop_map(Number::from),
        any::<u64>().prop_map(Number::from),
        any::<f64>().prop_filter_map("finite", Number::from_f64),
    ]
}

/// Text for string defaults: anything, quotes, escapes and non-ASCII included.
fn text() -> impl Strategy<Value = String> {
    prop_oneof!["[ -~]{0,12}", "[\"'\\\\\n\t\r/#a-z]{0,8}", any::<String>(),]
}

/// A top-level parameter: `name: type`, `name?: type`, and defaults for
/// the types that take them (with or without `?`).
fn param() -> impl Strategy<Value = Field> {
    let plain =
        (ident(), any::<bool>(), type_expr(false)).prop_map(|(n, o, t)| field(n, o, t, None));
    let defaulted = (
        ident(),
        any::<bool>(),
        prop_oneof![
            text().prop_map(|s| (Prim::String, Value::String(s))),
            number().prop_map(|n| (Prim::Number, Value::Number(n))),
            any::<bool>().prop_map(|b| (Prim::Boolean, Value::Bool(b))),
            date().prop_map(|d| (Prim::Date, Value::String(d))),
        ]
        .prop_map(|(p, v)| (TypeExpr::Prim(p), v)),
    )
        .prop_map(|(n, o, (t, v))| field(n, o, t, Some(v)));
    // Array and object defaults: JSON-like literals of the type.
    let structured = (
        ident(),
        any::<bool>(),
        prop_oneof![
            prop::collection::vec(text(), 0..3).prop_map(|v| (
                TypeExpr::Array(Box::new(TypeExpr::Prim(Prim::String))),
                Value::Array(v.into_iter().map(Value::String).collect())
            )),
            prop::collection::vec(number(), 0..3).prop_map(|v| (
                TypeExpr::Array(Box::new(TypeExpr::Prim(Prim::Number))),
                Value::Array(v.into_iter().map(Value::Number).collect())
            )),
            (number(), prop::option::of(text())).prop_map(|(n, label)| {
                let mut map = serde_json::Map::new();
                map.insert("n".into(), Value::Number(n));
                if let Some(label) = label {
                    map.insert("label".into(), Value::String(label));
                }
                (
                    TypeExpr::Object(vec![
                        field("n".into(), false, TypeExpr::Prim(Prim::Number), None),
                        field("label".into(), true, TypeExpr::Prim(Prim::String), None),
                    ]),
                    Value::Object(map),
                )
            }),
        ],
    )
        .prop_map(|(n, o, (t, v))| field(n, o, t, Some(v)));
    let defaulted = prop_oneof![3 => defaulted, 1 => structured];
    prop_oneof![3 => plain, 1 => defaulted]
}

fn params() -> impl Strategy<Value = Vec<Field>> {
    prop::collection::vec(param(), 0..6).prop_map(unique)
}

fn signature() -> impl Strategy<Value = Signature> {
    ("[a-z][a-z0-9_]{0,11}", params(), type_expr(true)).prop_map(|(name, params, returns)| {
        Signature {
            name,
            name_column: 0,
            params,
            returns,
        }
    })
}

/// How the text is laid out: the parser must not care.
#[derive(Debug, Clone, Copy)]
struct Style {
    /// Spaces around punctuation.
    spaced: bool,
    /// A trailing comma in lists.
    trailing_comma: bool,
    /// Strings in single quotes when they can be.
    single_quotes: bool,
}

fn style() -> impl Strategy<Value = Style> {
    (any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(spaced, trailing_comma, single)| {
        Style {
            spaced,
            trailing_comma,
            single_quotes: single,
        }
    })
}

const CANONICAL: Style = Style {
    spaced: true,
    trailing_comma: false,
    single_quotes: false,
};

// ----------------------------------------------------------------- rendering

fn render_type(ty: &TypeExpr, s: Style) -> String {
    match ty {
        TypeExpr::Prim(p) => match p {
            Prim::String => "string",
            Prim::Number => "number",
            Prim::Boolean => "boolean",
            Prim::Date => "date",
            Prim::Object => "object",
        }
        .to_string(),
        TypeExpr::Object(fields) => {
            let inner = render_list(fields, s);
            if s.spaced && !fields.is_empty() {
                format!("{{ {inner} }}")
            } else {
                format!("{{{inner}}}")
            }
        }
        TypeExpr::Array(inner) => format!("{}[]", render_type(inner, s)),
        TypeExpr::Named { name, .. } => name.clone(),
    }
}

fn render_list(fields: &[Field], s: Style) -> String {
    let sep = if s.spaced { ", " } else { "," };
    let mut out = fields
        .iter()
        .map(|f| render_field(f, s))
        .collect::<Vec<_>>()
        .join(sep);
    if s.trailing_comma && !fields.is_empty() {
        out.push(',');
    }
    out
}

fn render_field(f: &Field, s: Style) -> String {
    let q = if f.optional { "?" } else { "" };
    let colon = if s.spaced { ": " } else { ":" };
    let mut out = format!("{}{q}{colon}{}", f.name, render_type(&f.ty, s));
    if let Some(d) = &f.default {
        out.push_str(if s.spaced { " = " } else { "=" });
        out.push_str(&render_value(d, s));
    }
    out
}

fn render_value(v: &Value, s: Style) -> String {
    match v {
        Value::String(text) if s.single_quotes && !text.contains(['\n', '\r']) => {
            format!("'{}'", text.replace('\'', "''"))
        }
        Value::String(text) => {
            let mut out = String::from("\"");
            for c in text.chars() {
                match c {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    c => out.push(c),
                }
            }
            out.push('"');
            out
        }
        Value::Array(items) => {
            let sep = if s.spaced { ", " } else { "," };
            let items: Vec<String> = items.iter().map(|v| render_value(v, s)).collect();
            format!("[{}]", items.join(sep))
        }
        Value::Object(map) => {
            let (sep, colon) = if s.spaced { (", ", ": ") } else { (",", ":") };
            let fields: Vec<String> = map
                .iter()
                .map(|(k, v)| {
                    // A key may be bare (a name) or quoted.
                    let key = if s.single_quotes {
                        k.clone()
                    } else {
                        render_value(&Value::String(k.clone()), s)
                    };
                    format!("{key}{colon}{}", render_value(v, s))
                })
                .collect();
            format!("{{{}}}", fields.join(sep))
        }
        other => other.to_string(),
    }
}

fn render_signature(sig: &Signature, s: Style) -> String {
    let arrow = if s.spaced { " -> " } else { "->" };
    format!(
        "{}({}){arrow}{}",
        sig.name,
        render_list(&sig.params, s),
        render_type(&sig.returns, s)
    )
}

/// The tree without positions, which generated trees do not know.
fn strip_type(ty: &TypeExpr) -> TypeExpr {
    match ty {
        TypeExpr::Object(fields) => TypeExpr::Object(fields.iter().map(strip_field).collect()),
        TypeExpr::Array(inner) => TypeExpr::Array(Box::new(strip_type(inner))),
        TypeExpr::Named { name, .. } => TypeExpr::Named {
            name: name.clone(),
            column: 0,
        },
        TypeExpr::Prim(p) => TypeExpr::Prim(*p),
    }
}

fn strip_field(f: &Field) -> Field {
    Field {
        column: 0,
        ty: strip_type(&f.ty),
        ..f.clone()
    }
}

fn strip(sig: &Signature) -> Signature {
    Signature {
        name: sig.name.clone(),
        name_column: 0,
        params: sig.params.iter().map(strip_field).collect(),
        returns: strip_type(&sig.returns),
    }
}

/// Every recorded column points at the name it is recorded for.
fn check_columns(text: &str, first_column: u32, sig: &Signature) -> Result<(), TestCaseError> {
    let chars: Vec<char> = text.chars().collect();
    let at = |column: u32, name: &str| -> Result<(), TestCaseError> {
        let start = (column - first_column) as usize;
        let found: String = chars
            .iter()
            .skip(start)
            .take(name.chars().count())
            .collect();
        prop_assert_eq!(found, name, "column {} of {:?}", column, text);
        Ok(())
    };
    fn walk_type(
        ty: &TypeExpr,
        at: &dyn Fn(u32, &str) -> Result<(), TestCaseError>,
    ) -> Result<(), TestCaseError> {
        match ty {
            TypeExpr::Object(fields) => fields.iter().try_for_each(|f| walk_field(f, at)),
            TypeExpr::Array(inner) => walk_type(inner, at),
            TypeExpr::Named { name, column } => at(*column, name),
            TypeExpr::Prim(_) => Ok(()),
        }
    }
    fn walk_field(
        f: &Field,
        at: &dyn Fn(u32, &str) -> Result<(), TestCaseError>,
    ) -> Result<(), TestCaseError> {
        at(f.column, &f.name)?;
        walk_type(&f.ty, at)
    }
    at(sig.name_column, &sig.name)?;
    sig.params.iter().try_for_each(|f| walk_field(f, &at))?;
    walk_type(&sig.returns, &at)
}

// ------------------------------------------------------------------ values

/// A JSON value of any shape (for `object` and named types).
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-100i64..100).prop_map(Value::from),
        "[a-z]{0,4}".prop_map(Value::String),
    ];
    leaf.prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{1,3}", inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A value that fits `ty`: every required field present, optional ones
/// sometimes, and in results (`open`) sometimes an undeclared one too.
fn value_of(ty: &TypeExpr, open: bool) -> BoxedStrategy<Value> {
    match ty {
        TypeExpr::Prim(Prim::String) => any::<String>().prop_map(Value::String).boxed(),
        TypeExpr::Prim(Prim::Number) => number().prop_map(Value::Number).boxed(),
        TypeExpr::Prim(Prim::Boolean) => any::<bool>().prop_map(Value::Bool).boxed(),
        TypeExpr::Prim(Prim::Date) => date().prop_map(Value::String).boxed(),
        TypeExpr::Prim(Prim::Object) => prop::collection::btree_map("[a-z]{1,3}", any_json(), 0..3)
            .prop_map(|m| Value::Object(m.into_iter().collect()))
            .boxed(),
        TypeExpr::Named { .. } => any_json().boxed(),
        TypeExpr::Array(inner) => prop::collection::vec(value_of(inner, open), 0..3)
            .prop_map(Value::Array)
            .boxed(),
        TypeExpr::Object(fields) => object_of(fields, open),
    }
}

fn object_of(fields: &[Field], open: bool) -> BoxedStrategy<Value> {
    let parts: Vec<BoxedStrategy<Option<(String, Value)>>> = fields
        .iter()
        .map(|f| {
            let name = f.name.clone();
            let value = value_of(&f.ty, open).prop_map(move |v| Some((name.clone(), v)));
            if f.required() {
                value.boxed()
            } else {
                prop_oneof![Just(None), value].boxed()
            }
        })
        .collect();
    let extra = if open {
        prop::option::of(any_json()).boxed()
    } else {
        Just(None).boxed()
    };
    (parts, extra)
        .prop_map(|(parts, extra)| {
            let mut map: Map<String, Value> = parts.into_iter().flatten().collect();
            if let Some(v) = extra {
                // `~` is no identifier character: never a declared field.
                map.insert("~extra".into(), v);
            }
            Value::Object(map)
        })
        .boxed()
}

/// A value that `ty` refuses.
fn wrong_for(ty: &TypeExpr) -> Value {
    match ty {
        TypeExpr::Prim(Prim::String | Prim::Date) => json!(7),
        TypeExpr::Prim(Prim::Number) => json!("7"),
        TypeExpr::Prim(Prim::Boolean) => json!("true"),
        TypeExpr::Prim(Prim::Object) | TypeExpr::Object(_) => json!(["x"]),
        TypeExpr::Array(_) => json!({"0": "x"}),
        // Constrains nothing: nothing is wrong for it.
        TypeExpr::Named { .. } => Value::Null,
    }
}

/// Break `value` (which fits `ty`) at one place, picked with `pick`:
/// replace a part with a value of the wrong type. `None` when nothing in
/// it can be wrong (a named type, an empty array of them).
fn break_value(ty: &TypeExpr, value: &Value, pick: usize) -> Option<Value> {
    let here = (!matches!(ty, TypeExpr::Named { .. })).then(|| wrong_for(ty));
    let deeper = match (ty, value) {
        (TypeExpr::Array(inner), Value::Array(items)) if !items.is_empty() => {
            let i = pick % items.len();
            break_value(inner, &items[i], pick / 2).map(|broken| {
                let mut items = items.clone();
                items[i] = broken;
                Value::Array(items)
            })
        }
        (TypeExpr::Object(fields), Value::Object(map)) => {
            let present: Vec<&Field> = fields
                .iter()
                .filter(|f| map.contains_key(&f.name))
                .collect();
            if present.is_empty() {
                None
            } else {
                let f = present[pick % present.len()];
                break_value(&f.ty, &map[&f.name], pick / 2).map(|broken| {
                    let mut map = map.clone();
                    map.insert(f.name.clone(), broken);
                    Value::Object(map)
                })
            }
        }
        _ => None,
    };
    if pick.is_multiple_of(3) {
        here.or(deeper)
    } else {
        deeper.or(here)
    }
}

fn args_type(params: &[Field]) -> TypeExpr {
    TypeExpr::Object(params.to_vec())
}

// -------------------------------------------------------------- properties

proptest! {
    #![proptest_config(config(512))]

    /// Generated declarations survive text and back, columns included.
    #[test]
    fn signatures_round_trip(sig in signature(), s in style(), first in 1u32..40) {
        let text = render_signature(&sig, s);
        let parsed = parse_signature(&text, first)
            .map_err(|e| TestCaseError::fail(format!("{text:?}: {}: {}", e.column, e.message)))?;
        check_columns(&text, first, &parsed)?;
        prop_assert_eq!(strip(&parsed), strip(&sig), "{:?}", text);
        // Rendering the parse gives the canonical text of the declaration.
        prop_assert_eq!(
            render_signature(&parsed, CANONICAL),
            render_signature(&sig, CANONICAL)
        );
    }

    /// A `parameters:` field line parses to the field it was rendered from.
    #[test]
    fn field_declarations_round_trip(f in param(), s in style()) {
        let text = render_field(&f, s);
        let parsed = parse_field_decl(&text, 1)
            .map_err(|e| TestCaseError::fail(format!("{text:?}: {}: {}", e.column, e.message)))?;
        prop_assert_eq!(strip_field(&parsed), strip_field(&f));
        prop_assert_eq!(parsed.column, 1);
    }

    /// Whatever the text, the parser answers (a signature or an error with a
    /// column inside the line or just after it) and never panics.
    #[test]
    fn any_text_gets_an_answer(
        text in prop_oneof![
            any::<String>(),
            // Signature tokens in any order.
            prop::collection::vec(
                prop_oneof![
                    Just("("), Just(")"), Just("{"), Just("}"), Just("[]"), Just("["), Just("]"),
                    Just(","), Just(":"), Just("?"), Just("="), Just("->"), Just("-"), Just(" "),
                    Just("a"), Just("string"), Just("object"), Just("Hotel"), Just("1e"),
                    Just("9223372036854775808"), Just("\""), Just("'"), Just("\\"), Just("true"),
                ],
                0..40,
            ).prop_map(|parts| parts.concat()),
        ],
    ) {
        let len = u32::try_from(text.chars().count()).unwrap_or(u32::MAX);
        if let Err(e) = parse_signature(&text, 1) {
            prop_assert!(e.column >= 1 && e.column <= len + 1, "{:?}: {}", text, e.column);
        }
        if let Err(e) = parse_field_decl(&text, 1) {
            prop_assert!(e.column >= 1 && e.column <= len + 1, "{:?}: {}", text, e.column);
        }
    }

    /// The input schema is a valid JSON Schema; `required` is exactly the
    /// parameters without `?` and without a default, in order; every
    /// parameter is a property and nothing else is allowed.
    #[test]
    fn input_schemas_are_valid_and_require_exactly_the_required(params in params()) {
        let schema = input_schema(&params);
        prop_assert!(compile(&schema).is_ok(), "{}", schema);
        let required: Vec<&str> = params
            .iter()
            .filter(|p| !p.optional && p.default.is_none())
            .map(|p| p.name.as_str())
            .collect();
        prop_assert_eq!(&schema["required"], &json!(required));
        let names: Vec<&String> = params.iter().map(|p| &p.name).collect();
        let properties: Vec<&String> = schema["properties"].as_object().unwrap().keys().collect();
        let mut sorted = names.clone();
        sorted.sort();
        let mut props_sorted = properties.clone();
        props_sorted.sort();
        prop_assert_eq!(props_sorted, sorted);
        prop_assert_eq!(&schema["additionalProperties"], &json!(false));
        for p in &params {
            prop_assert_eq!(schema["properties"][&p.name].get("default"), p.default.as_ref());
        }
    }

    /// Arguments that fit the declaration validate; the same arguments
    /// with one part of the wrong type, with a required parameter left
    /// out, or with an undeclared one added, do not.
    #[test]
    fn fitting_arguments_validate_and_broken_ones_do_not(
        (params, args, pick) in params().prop_flat_map(|ps| {
            let args = object_of(&ps, false);
            (Just(ps), args, any::<usize>())
        })
    ) {
        let schema = input_schema(&params);
        prop_assert_eq!(validate_json(&schema, &args), Ok(()), "{}", args);
        if let Some(broken) = break_value(&args_type(&params), &args, pick) {
            prop_assert!(validate_json(&schema, &broken).is_err(), "{} passed {}", broken, schema);
        }
        if let Some(p) = params.iter().find(|p| p.required()) {
            let mut missing = args.clone();
            missing.as_object_mut().unwrap().remove(&p.name);
            prop_assert!(validate_json(&schema, &missing).is_err());
        }
        let mut extra = args.clone();
        extra.as_object_mut().unwrap().insert("~undeclared".into(), json!(1));
        prop_assert!(validate_json(&schema, &extra).is_err());
    }

    /// Results that fit the return type validate (undeclared fields
    /// included: results are open); a part of the wrong type does not.
    #[test]
    fn fitting_results_validate_and_mistyped_ones_do_not(
        (ty, result, pick) in type_expr(true).prop_flat_map(|t| {
            let v = value_of(&t, true);
            (Just(t), v, any::<usize>())
        })
    ) {
        let schema = type_schema(&ty, Direction::Output);
        prop_assert!(compile(&schema).is_ok(), "{}", schema);
        prop_assert_eq!(validate_json(&schema, &result), Ok(()), "{}", result);
        if let Some(broken) = break_value(&ty, &result, pick) {
            prop_assert!(validate_json(&schema, &broken).is_err(), "{} passed {}", broken, schema);
        }
    }
}

/// A tool of a generated file: its signature and description.
fn tool() -> impl Strategy<Value = (Signature, String)> {
    // `.tools.abl` descriptions are one line.
    (signature(), "[ -~]{0,20}").prop_map(|(mut sig, d)| {
        // Named types are for results only.
        for p in &mut sig.params {
            p.ty = strip_type(&p.ty);
        }
        (sig, d)
    })
}

fn tools_file() -> impl Strategy<Value = Vec<(Signature, String)>> {
    prop::collection::vec(tool(), 1..5).prop_map(|mut tools| {
        for (i, (sig, _)) in tools.iter_mut().enumerate() {
            sig.name = format!("{}_{i}", sig.name);
        }
        tools
    })
}

proptest! {
    #![proptest_config(config(128))]

    /// Whole `.tools.abl` files of generated tools parse back into those
    /// tools, with the schemas of their signatures.
    #[test]
    fn tools_files_round_trip(tools in tools_file(), s in style()) {
        let mut text = String::from("# generated\nTOOLS:\n");
        for (sig, description) in &tools {
            text.push_str(&format!(
                "  {}\n    description: {}\n    type: http\n    endpoint: \"/x\"\n    method: POST\n    permission: p.write\n    repeat_safety: never\n\n",
                render_signature(sig, s),
                render_value(&Value::String(description.clone()), s),
            ));
        }
        let out = parse_tools_file("t.tools.abl", &text);
        let errors: Vec<String> = out.errors.iter().map(ToString::to_string).collect();
        prop_assert!(errors.is_empty(), "{:?}\n{}", errors, text);
        prop_assert_eq!(out.tools.len(), tools.len());
        for ((sig, description), def) in tools.iter().zip(&out.tools) {
            prop_assert_eq!(&def.name, &sig.name);
            prop_assert_eq!(&def.description, description);
            prop_assert_eq!(&def.input_schema, &input_schema(&sig.params));
            prop_assert_eq!(&def.output_schema, &type_schema(&sig.returns, Direction::Output));
        }
    }
}

// ------------------------------------------------------------- strict mode

/// The JSON pointers of the free-form `object`s (no declared fields) in
/// `ty` at `at`, which strict mode cannot express.
fn free_objects(ty: &TypeExpr, at: &str, found: &mut Vec<String>) {
    match ty {
        TypeExpr::Prim(Prim::Object) => found.push(at.to_owned()),
        TypeExpr::Array(inner) => free_objects(inner, &format!("{at}/items"), found),
        TypeExpr::Object(fields) => {
            for f in fields {
                free_objects(&f.ty, &format!("{at}/properties/{}", f.name), found);
            }
        }
        _ => {}
    }
}

/// `value` (which fits `ty`) as a strict model sends it: every optional
/// field it leaves out given as `null`.
fn with_nulls(ty: &TypeExpr, value: &Value) -> Value {
    match (ty, value) {
        (TypeExpr::Array(inner), Value::Array(items)) => {
            Value::Array(items.iter().map(|i| with_nulls(inner, i)).collect())
        }
        (TypeExpr::Object(fields), Value::Object(map)) => {
            let mut out = Map::new();
            for f in fields {
                match map.get(&f.name) {
                    Some(v) => out.insert(f.name.clone(), with_nulls(&f.ty, v)),
                    None => out.insert(f.name.clone(), Value::Null),
                };
            }
            Value::Object(out)
        }
        _ => value.clone(),
    }
}

/// Every object schema in a strict schema is closed and requires all of
/// its properties.
fn all_closed_and_required(schema: &Value) -> bool {
    let here = match schema.get("properties").and_then(Value::as_object) {
        Some(props) => {
            let names: Vec<Value> = props.keys().cloned().map(Value::String).collect();
            schema.get("additionalProperties") == Some(&Value::Bool(false))
                && schema.get("required") == Some(&Value::Array(names))
                && props.values().all(all_closed_and_required)
        }
        None => true,
    };
    here && schema.get("items").is_none_or(all_closed_and_required)
        && schema.get("default").is_none()
}

proptest! {
    #![proptest_config(config(512))]
    /// Strict mode: a signature without free-form objects becomes a strict
    /// schema (valid, every object closed with every property required, no
    /// `default`); arguments that fit the tool, with each left-out optional
    /// field sent as `null`, fit the strict schema, and stripping those
    /// nulls gives back exactly the tool's arguments, which still validate
    /// against the tool's own schema. A signature with a free-form object
    /// is refused, naming the pointer of one of them.
    #[test]
    fn strict_schemas_accept_what_the_tool_accepts_with_nulls_for_the_optional(
        (params, args) in params().prop_flat_map(|ps| {
            let args = object_of(&ps, false);
            (Just(ps), args)
        })
    ) {
        let schema = input_schema(&params);
        let ty = args_type(&params);
        let mut free = Vec::new();
        free_objects(&ty, "", &mut free);
        match (super::strict::to_strict("t", &schema), free.is_empty()) {
            (Err(e), false) => {
                prop_assert!(free.contains(&e.pointer), "{} not in {:?}", e.pointer, free);
                prop_assert_eq!(e.tool, "t");
            }
            (Ok(strict), true) => {
                prop_assert!(compile(&strict).is_ok(), "{}", strict);
                prop_assert!(all_closed_and_required(&strict), "{}", strict);
                let mut sent = with_nulls(&ty, &args);
                prop_assert_eq!(validate_json(&strict, &sent), Ok(()), "{} vs {}", sent, strict);
                super::strict::strip_optional_nulls(&schema, &mut sent);
                prop_assert_eq!(&sent, &args);
                prop_assert_eq!(validate_json(&schema, &sent), Ok(()));
            }
            (got, _) => prop_assert!(false, "to_strict gave {:?}, free objects at {:?}", got, free),
        }
    }
}
