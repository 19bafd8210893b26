//! The `TYPES:` section of a `.tools.abl` file: named types a file defines
//! for its tools' signatures (a Belay addition; the seed writes `-> Hotel[]`
//! but never says where `Hotel` is defined).
//!
//! ```text
//! TYPES:
//!   Hotel: {name: string, price: number, rating?: number, rooms: Room[]}
//!   Room: {beds: number, view?: string}
//! ```
//!
//! Each line is `Name: type`, the name PascalCase (`[A-Z][A-Za-z0-9_]*`),
//! the type in signature syntax; a type may use the others, in any order,
//! but not itself, directly or through others. Every use of a defined name
//! in the file's signatures and `parameters:` blocks is replaced by the
//! definition, so its JSON Schema is concrete: results are checked against
//! it, and a defined type may be a parameter's. The section may come before
//! or after `TOOLS:`; names are the file's own (a `file:` import brings
//! tools, whose types are already expanded).

use std::collections::{BTreeMap, BTreeSet};

use super::lines::{Block, Cx, head};
use crate::signature::{TypeExpr, expand_named, named_refs, parse_type_decl};

/// Most named types one file may define.
const MAX_TYPES: usize = 256;

/// The expanded types of a `TYPES:` block; every problem is an error of
/// `cx` at its line and column, and a type with one is left out.
pub(super) fn read_types(block: &Block, cx: &mut Cx<'_>) -> BTreeMap<String, TypeExpr> {
    // name → (type as written, line, column of the name)
    let mut written: BTreeMap<String, (TypeExpr, u32, u32)> = BTreeMap::new();
    for child in &block.children {
        let line = &child.line;
        if let Some(first) = child.children.first() {
            cx.error(
                first.line.no,
                first.line.col(),
                "a named type is one line, `Name: type`; write an object type as `{field: type, ...}`",
            );
        }
        let Some((name, rest)) = line.text.split_once(':') else {
            cx.error(
                line.no,
                line.col(),
                format!("expected `Name: type`, found `{}`", head(&line.text)),
            );
            continue;
        };
        let name = name.trim_end();
        let valid = name.chars().next().is_some_and(|c| c.is_ascii_uppercase())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            cx.error(
                line.no,
                line.col(),
                format!("type name `{name}` must be PascalCase: an upper-case letter, then letters, digits and `_`"),
            );
            continue;
        }
        if let Some((_, first, _)) = written.get(name) {
            cx.error(
                line.no,
                line.col(),
                format!("type `{name}` is defined twice (first on line {first})"),
            );
            continue;
        }
        if written.len() >= MAX_TYPES {
            cx.error(
                line.no,
                line.col(),
                format!("a file defines at most {MAX_TYPES} named types"),
            );
            break;
        }
        let offset = line.text.len() - rest.len();
        let column = line
            .col()
            .saturating_add(u32::try_from(offset).unwrap_or(u32::MAX));
        match parse_type_decl(rest, column) {
            Ok(ty) => {
                written.insert(name.to_owned(), (ty, line.no, line.col()));
            }
            Err(e) => cx.error(line.no, e.column, e.message),
        }
    }
    if block.children.is_empty() {
        cx.error(
            block.line.no,
            block.line.col(),
            "`TYPES:` takes an indented block of `Name: type` lines",
        );
    }

    // Expand in dependency order; a name used but not defined here is an
    // error (opaque names are for the seed's signatures, not for
    // definitions), as is a cycle.
    let mut done: BTreeMap<String, TypeExpr> = BTreeMap::new();
    let mut failed: BTreeSet<String> = BTreeSet::new();
    let names: Vec<String> = written.keys().cloned().collect();
    for name in names {
        let mut path = Vec::new();
        expand(&name, &written, &mut done, &mut failed, &mut path, cx);
    }
    done
}

/// Expand `name` (and what it uses) into `done`; `path` holds the names
/// being expanded, to find cycles.
fn expand(
    name: &str,
    written: &BTreeMap<String, (TypeExpr, u32, u32)>,
    done: &mut BTreeMap<String, TypeExpr>,
    failed: &mut BTreeSet<String>,
    path: &mut Vec<String>,
    cx: &mut Cx<'_>,
) -> bool {
    if done.contains_key(name) {
        return true;
    }
    if failed.contains(name) {
        return false;
    }
    let Some((ty, line, column)) = written.get(name) else {
        return false;
    };
    path.push(name.to_owned());
    let mut refs = Vec::new();
    named_refs(ty, &mut refs);
    let mut ok = true;
    for (used, used_col) in refs {
        if let Some(at) = path.iter().position(|p| *p == used) {
            let cycle: Vec<&str> = path[at..]
                .iter()
                .map(String::as_str)
                .chain([used.as_str()])
                .collect();
            cx.error(
                *line,
                used_col,
                format!("named types form a cycle: {}", cycle.join(" → ")),
            );
            ok = false;
        } else if !written.contains_key(&used) {
            cx.error(
                *line,
                used_col,
                format!("unknown type `{used}`: not defined in this file's `TYPES:` section"),
            );
            ok = false;
        } else if !expand(&used, written, done, failed, path, cx) {
            ok = false;
        }
    }
    path.pop();
    if ok {
        let mut expanded = ty.clone();
        match expand_named(&mut expanded, done) {
            Ok(()) => {
                done.insert(name.to_owned(), expanded);
                return true;
            }
            Err(e) => {
                cx.error(*line, *column, format!("type `{name}`: {}", e.message));
            }
        }
    }
    failed.insert(name.to_owned());
    false
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::super::parse_tools_file;

    const FILE: &str = "t.tools.abl";

    fn errors(content: &str) -> Vec<String> {
        parse_tools_file(FILE, content)
            .errors
            .iter()
            .map(|e| format!("{}:{}: {}", e.line, e.column, e.message))
            .collect()
    }

    const TOOL: &str = "    type: http\n    endpoint: \"http://h.test/x\"\n    method: POST\n    permission: p\n    repeat_safety: idempotent\n";

    #[test]
    fn named_types_give_concrete_schemas_in_returns_and_parameters() {
        let content = format!(
            "TOOLS:\n  search_hotels(city: string, near?: Place) -> Hotel[]\n{TOOL}\nTYPES:\n  Hotel: {{name: string, price: number, rooms: Room[], place?: Place}}\n  Room: {{beds: number}}\n  Place: {{lat: number, lon: number}}\n"
        );
        let out = parse_tools_file(FILE, &content);
        assert_eq!(out.errors, vec![]);
        let tool = &out.tools[0];
        let place = json!({
            "type": "object",
            "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
            "required": ["lat", "lon"],
        });
        assert_eq!(
            tool.input_schema["properties"]["near"]["required"],
            place["required"]
        );
        assert_eq!(
            tool.input_schema["properties"]["near"]["additionalProperties"],
            false
        );
        let hotel = &tool.output_schema["items"];
        assert_eq!(hotel["required"], json!(["name", "price", "rooms"]));
        assert_eq!(
            hotel["properties"]["rooms"]["items"]["properties"]["beds"],
            json!({"type": "number"})
        );
        assert_eq!(
            hotel["properties"]["place"]["properties"],
            place["properties"]
        );
        // Results are checked against it now.
        let good = json!([{"name": "A", "price": 1, "rooms": [{"beds": 2}]}]);
        let bad = json!([{"name": "A", "price": "cheap", "rooms": []}]);
        assert!(crate::validate_json(&tool.output_schema, &good).is_ok());
        assert!(crate::validate_json(&tool.output_schema, &bad).is_err());

        // Undefined names stay opaque in returns (the seed's own examples).
        let out = parse_tools_file(
            FILE,
            &format!("TOOLS:\n  get_hotel(id: string) -> Hotel\n{TOOL}"),
        );
        assert_eq!(out.errors, vec![]);
        assert_eq!(out.tools[0].output_schema, json!({"title": "Hotel"}));
    }

    #[test]
    fn bad_type_sections_are_refused_where_they_are_written() {
        let content = format!(
            "TYPES:\n  Hotel: {{rooms: Room[]}}\n  Room: {{hotel: Hotel}}\n  lower: string\n  Dup: string\n  Dup: number\n  Bad: {{x: strin}}\n  Missing: {{x: Nowhere}}\n  NoColon\n  Block: object\n    x: string\nTOOLS:\n  t(a: string) -> string\n{TOOL}TYPES:\n  X: string\n"
        );
        assert_eq!(
            errors(&content),
            vec![
                "4:3: type name `lower` must be PascalCase: an upper-case letter, then letters, digits and `_`",
                "6:3: type `Dup` is defined twice (first on line 5)",
                "7:12: unknown type `strin` (expected string, number, boolean, date, object, or `type[]`)",
                "9:3: expected `Name: type`, found `NoColon`",
                "11:5: a named type is one line, `Name: type`; write an object type as `{field: type, ...}`",
                "3:17: named types form a cycle: Hotel → Room → Hotel",
                "8:16: unknown type `Nowhere`: not defined in this file's `TYPES:` section",
                "19:1: a second `TYPES:` section; a file has one",
            ]
        );
    }

    #[test]
    fn a_default_of_a_named_type_is_checked_against_its_definition() {
        let errs = errors(&format!(
            "TYPES:\n  Room: {{beds: number}}\nTOOLS:\n  t(r: Room = {{beds: \"a\"}}, s: Room = {{beds: 1}}) -> object\n{TOOL}"
        ));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].starts_with(
                "4:5: parameter `r`: default {\"beds\":\"a\"} does not match type `object`: "
            ),
            "{errs:?}"
        );
    }

    #[test]
    fn types_that_grow_exponentially_are_refused() {
        let mut content = String::from("TYPES:\n  T0: {a: number}\n");
        for i in 1..20 {
            content.push_str(&format!("  T{i}: {{a: T{}, b: T{}}}\n", i - 1, i - 1));
        }
        content.push_str(&format!("TOOLS:\n  t(a: string) -> T19\n{TOOL}"));
        let errs = errors(&content);
        assert!(
            errs.iter().any(|e| e.contains("more than 4096 parts")),
            "{errs:#?}"
        );
    }
}
