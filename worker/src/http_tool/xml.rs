//! XML bodies and answers of HTTP tools (`body_type: xml`).
//!
//! Request (JSON → XML), [`encode`]: the JSON value becomes the content of
//! one root element, named by `xml_root:` or, by default, the tool's name.
//! An object's members become child elements in key order (the order of
//! the arguments as the engine stored them: sorted); an array member
//! repeats its element once per item (`{"tag": ["a", "b"]}` →
//! `<tag>a</tag><tag>b</tag>`); an array directly inside an array wraps
//! each item in `<item>`; `null` members and items are left out (as form
//! bodies leave them out); a string is the element's text, a number or
//! boolean its JSON text. A member name that is not an XML name
//! (`[A-Za-z_][A-Za-z0-9_.-]*`) or text XML 1.0 cannot carry (control
//! characters) is refused before dispatch. No attributes, no namespaces:
//! a tool that needs them writes a `body_template:`, which is XML whose
//! placeholders are replaced by the argument as text, XML-escaped, and is
//! checked to be well-formed before dispatch ([`check_well_formed`]).
//!
//! Answer (XML → JSON), [`decode`]: a 2xx answer whose `Content-Type` is
//! XML (`application/xml`, `text/xml`, `…+xml`), of any HTTP tool, becomes
//! the JSON value of its root element (the root's name is dropped, as the
//! request's root is the tool's): an element with neither attributes nor
//! child elements is its text (a string: XML has no numbers); any other is
//! an object of its attributes (`"@name"`), its child elements (a name
//! that repeats gives an array, in document order) and its text when it is
//! not only whitespace (`"#text"`). Comments and processing instructions
//! are dropped; CDATA is text. An answer that is not well-formed, declares
//! a DOCTYPE, names an entity other than XML's five, or nests deeper than
//! [`MAX_DEPTH`] stays what it was before: its text, as a JSON string.

use std::fmt::Write as _;

use quick_xml::Reader;
use quick_xml::escape::{escape, resolve_predefined_entity};
use quick_xml::events::Event;
use serde_json::{Map, Value};

/// Deepest element nesting written or read (as JSON values are kept
/// within 100 levels in events).
pub const MAX_DEPTH: usize = 64;

/// Whether `content_type` (a `Content-Type` header value) is XML.
pub fn is_xml_content_type(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/xml" || essence == "text/xml" || essence.ends_with("+xml")
}

/// Whether `name` is an element name [`encode`] writes.
pub fn is_element_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// The first character of `text` that XML 1.0 cannot carry, if any.
fn invalid_char(text: &str) -> Option<char> {
    text.chars().find(|&c| {
        (c < ' ' && !matches!(c, '\t' | '\n' | '\r')) || c == '\u{FFFE}' || c == '\u{FFFF}'
    })
}

/// `value` as an XML document whose root element is `root`. `Err` says
/// which member cannot be written.
pub fn encode(root: &str, value: &Value) -> Result<Vec<u8>, String> {
    if !is_element_name(root) {
        return Err(format!("the XML root `{root}` is not an element name"));
    }
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>");
    element(&mut out, root, value, root, 0)?;
    Ok(out.into_bytes())
}

/// Writes `<name>` with `value`'s content; `path` names it in errors.
fn element(
    out: &mut String,
    name: &str,
    value: &Value,
    path: &str,
    depth: usize,
) -> Result<(), String> {
    if depth >= MAX_DEPTH {
        return Err(format!(
            "`{path}` is nested more than {MAX_DEPTH} levels deep"
        ));
    }
    match value {
        Value::Null => {
            let _ = write!(out, "<{name}/>");
        }
        Value::Object(map) => {
            let _ = write!(out, "<{name}>");
            for (key, member) in map {
                let member_path = format!("{path}/{key}");
                if !is_element_name(key) {
                    return Err(format!(
                        "`{member_path}`: `{key}` is not an XML element name (a letter or `_`, then letters, digits, `_`, `-`, `.`)"
                    ));
                }
                match member {
                    Value::Null => {}
                    Value::Array(items) => {
                        for item in items.iter().filter(|i| !i.is_null()) {
                            element(out, key, item, &member_path, depth + 1)?;
                        }
                    }
                    other => element(out, key, other, &member_path, depth + 1)?,
                }
            }
            let _ = write!(out, "</{name}>");
        }
        Value::Array(items) => {
            let _ = write!(out, "<{name}>");
            for item in items.iter().filter(|i| !i.is_null()) {
                element(out, "item", item, &format!("{path}/item"), depth + 1)?;
            }
            let _ = write!(out, "</{name}>");
        }
        scalar => {
            let text = match scalar {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            if let Some(c) = invalid_char(&text) {
                return Err(format!(
                    "`{path}` holds the character U+{:04X}, which XML 1.0 cannot carry",
                    u32::from(c)
                ));
            }
            let _ = write!(out, "<{name}>{}</{name}>", escape(text.as_str()));
        }
    }
    Ok(())
}

/// `Err` says why `text` (a filled XML template) is not one well-formed
/// element.
pub fn check_well_formed(text: &str) -> Result<(), String> {
    if let Some(c) = invalid_char(text) {
        return Err(format!(
            "it holds the character U+{:04X}, which XML 1.0 cannot carry",
            u32::from(c)
        ));
    }
    parse(text).map(|_| ())
}

/// An XML answer as JSON (see the module docs); `None` when it is not one
/// well-formed document this reads.
pub fn decode(bytes: &[u8]) -> Option<Value> {
    let text = std::str::from_utf8(bytes).ok()?;
    parse(text).ok()
}

/// One element being read.
struct Frame {
    name: String,
    attributes: Map<String, Value>,
    children: Vec<(String, Value)>,
    text: String,
}

impl Frame {
    fn value(self) -> Value {
        if self.attributes.is_empty() && self.children.is_empty() {
            return Value::String(self.text);
        }
        let mut map = self.attributes;
        let mut grouped: Map<String, Value> = Map::new();
        for (name, value) in self.children {
            match grouped.get_mut(&name) {
                Some(Value::Array(items)) => items.push(value),
                _ => {
                    grouped.insert(name, Value::Array(vec![value]));
                }
            }
        }
        for (name, values) in grouped {
            // A name seen once is a value, not a one-item array.
            let value = match values {
                Value::Array(mut items) if items.len() == 1 => items.pop().unwrap_or(Value::Null),
                other => other,
            };
            map.insert(name, value);
        }
        let text = self.text.trim();
        if !text.is_empty() {
            map.insert("#text".into(), Value::String(text.to_owned()));
        }
        Value::Object(map)
    }
}

/// The root element's value, or why `text` is not a document this reads.
fn parse(text: &str) -> Result<Value, String> {
    let mut reader = Reader::from_str(text);
    reader.config_mut().check_end_names = true;
    let mut stack: Vec<Frame> = Vec::new();
    let mut root: Option<Value> = None;
    let ill = |e: &dyn std::fmt::Display| format!("it is not well-formed XML: {e}");
    loop {
        let event = reader.read_event().map_err(|e| ill(&e))?;
        match event {
            Event::Start(start) => {
                let frame = open(&start, &stack, root.is_some())?;
                stack.push(frame);
            }
            Event::Empty(start) => {
                let frame = open(&start, &stack, root.is_some())?;
                close(frame, &mut stack, &mut root);
            }
            Event::End(_) => {
                let frame = stack.pop().ok_or("an end tag closes nothing")?;
                close(frame, &mut stack, &mut root);
            }
            Event::Text(t) => push_text(&mut stack, &t.xml10_content())?,
            Event::CData(c) => push_text(&mut stack, &c.into_inner())?,
            Event::GeneralRef(r) => {
                let resolved = if r.is_char_ref() {
                    r.resolve_char_ref()
                        .map_err(|e| ill(&e))?
                        .map(String::from)
                        .ok_or("an empty character reference")?
                } else {
                    let name: &str = &r;
                    resolve_predefined_entity(name)
                        .ok_or_else(|| {
                            format!(
                                "it names the entity `&{name};`, which is not one of XML's five"
                            )
                        })?
                        .to_owned()
                };
                push_text(&mut stack, &resolved)?;
            }
            Event::DocType(_) => return Err("it declares a DOCTYPE".into()),
            Event::Comment(_) | Event::Decl(_) | Event::PI(_) => {}
            Event::Eof => break,
        }
    }
    if !stack.is_empty() {
        return Err("an element is not closed".into());
    }
    root.ok_or_else(|| "it has no root element".into())
}

/// The frame of the element `start` opens.
fn open(
    start: &quick_xml::events::BytesStart<'_>,
    stack: &[Frame],
    had_root: bool,
) -> Result<Frame, String> {
    let ill = |e: &dyn std::fmt::Display| format!("it is not well-formed XML: {e}");
    if had_root {
        return Err("it has more than one root element".into());
    }
    if stack.len() >= MAX_DEPTH {
        return Err(format!("it nests more than {MAX_DEPTH} elements deep"));
    }
    let mut attributes = Map::new();
    for attribute in start.attributes() {
        let attribute = attribute.map_err(|e| ill(&e))?;
        let value = attribute
            .normalized_value(quick_xml::XmlVersion::Implicit1_0)
            .map_err(|e| ill(&e))?;
        let key: &str = attribute.key.as_ref();
        attributes.insert(format!("@{key}"), Value::String(value.into_owned()));
    }
    let qname = start.name();
    let name: &str = qname.as_ref();
    Ok(Frame {
        name: name.to_owned(),
        attributes,
        children: Vec::new(),
        text: String::new(),
    })
}

fn close(frame: Frame, stack: &mut [Frame], root: &mut Option<Value>) {
    let name = frame.name.clone();
    let value = frame.value();
    match stack.last_mut() {
        Some(parent) => parent.children.push((name, value)),
        None => *root = Some(value),
    }
}

fn push_text(stack: &mut [Frame], text: &str) -> Result<(), String> {
    match stack.last_mut() {
        Some(frame) => {
            frame.text.push_str(text);
            Ok(())
        }
        None if text.trim().is_empty() => Ok(()),
        None => Err("it has text outside its root element".into()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_becomes_elements_under_the_root() {
        let body = encode(
            "submit",
            &json!({"amount": 12.5, "note": "a < b & \"c\"", "tags": ["x", null, "y"], "skip": null,
                    "customer": {"id": 7, "vip": true}, "matrix": [[1, 2]]}),
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(body).unwrap(),
            concat!(
                r#"<?xml version="1.0" encoding="UTF-8"?><submit><amount>12.5</amount>"#,
                "<customer><id>7</id><vip>true</vip></customer>",
                "<matrix><item>1</item><item>2</item></matrix>",
                "<note>a &lt; b &amp; &quot;c&quot;</note><tags>x</tags><tags>y</tags></submit>"
            )
        );
        assert_eq!(
            encode("r", &json!({"1a": 1})).unwrap_err(),
            "`r/1a`: `1a` is not an XML element name (a letter or `_`, then letters, digits, `_`, `-`, `.`)"
        );
        assert_eq!(
            encode("r", &json!({"a": "bell\u{7}"})).unwrap_err(),
            "`r/a` holds the character U+0007, which XML 1.0 cannot carry"
        );
    }

    #[test]
    fn xml_answers_become_json() {
        let answer = br#"<?xml version="1.0"?>
<!-- a comment -->
<response status="ok">
  <ref>R-1</ref>
  <item>a &amp; b</item>
  <item><![CDATA[<raw>]]></item>
  <empty/>
  <note lang="en">hi &#233;</note>
</response>"#;
        assert_eq!(
            decode(answer).unwrap(),
            json!({"@status": "ok", "ref": "R-1", "item": ["a & b", "<raw>"], "empty": "",
                   "note": {"@lang": "en", "#text": "hi é"}})
        );
        assert_eq!(decode(b"<a>1</a>").unwrap(), json!("1"));
        for bad in [
            &b"<a><b></a>"[..],
            b"<a>",
            b"<a/><b/>",
            b"<!DOCTYPE a [<!ENTITY x \"y\">]><a>&x;</a>",
            b"<a>&nbsp;</a>",
            b"not xml",
        ] {
            assert_eq!(decode(bad), None, "{}", String::from_utf8_lossy(bad));
        }
        let deep = format!(
            "{}{}",
            "<a>".repeat(MAX_DEPTH + 1),
            "</a>".repeat(MAX_DEPTH + 1)
        );
        assert_eq!(decode(deep.as_bytes()), None);
        assert!(check_well_formed("<o><a>1</a></o>").is_ok());
        assert!(check_well_formed("<o><a>1</o>").is_err());
    }

    #[test]
    fn content_types() {
        for xml in [
            "application/xml",
            "text/xml; charset=utf-8",
            "application/soap+xml",
        ] {
            assert!(is_xml_content_type(xml), "{xml}");
        }
        for other in ["application/json", "text/plain", "application/xml-dtd"] {
            assert!(!is_xml_content_type(other), "{other}");
        }
    }
}
