//! The typed signature language of `.tools.abl`: `name(params) -> ReturnType`,
//! parameter declarations (`name?: type = default`) and type expressions, and
//! the JSON Schema they become.
//!
//! Works on one line of text at a time; columns are 1-based character
//! positions in that line.

use serde_json::{Map, Number, Value, json};

/// Deepest nesting of `{`/`[]` in one type expression (and of nested field
/// blocks in `parameters:`). Far beyond any real tool, and it keeps a
/// hostile line of ten thousand `{` from overflowing the stack.
pub(super) const MAX_TYPE_DEPTH: usize = 32;

/// A problem at a column of the parsed text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SigError {
    /// 1-based column.
    pub column: u32,
    /// What is wrong.
    pub message: String,
}

fn err<T>(column: u32, message: impl Into<String>) -> Result<T, SigError> {
    Err(SigError {
        column,
        message: message.into(),
    })
}

/// The built-in types of the seed's "Parameter types" table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Prim {
    String,
    Number,
    Boolean,
    Date,
    /// `object` without declared fields: any JSON object.
    Object,
}

impl Prim {
    fn name(self) -> &'static str {
        match self {
            Prim::String => "string",
            Prim::Number => "number",
            Prim::Boolean => "boolean",
            Prim::Date => "date",
            Prim::Object => "object",
        }
    }
}

/// A type expression.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum TypeExpr {
    /// A built-in type.
    Prim(Prim),
    /// `{field: type, ...}`, or `object` whose fields a `parameters:` block declared.
    Object(Vec<Field>),
    /// `type[]`.
    Array(Box<TypeExpr>),
    /// A PascalCase name such as `Hotel` (seed: `-> Hotel[]`). One the
    /// file's `TYPES:` section defines is replaced by its definition
    /// ([`expand_named`]); an undefined one (the seed never defines its
    /// own) stays opaque: allowed only in return types.
    Named {
        /// The name as written.
        name: String,
        /// Column of the name.
        column: u32,
    },
}

impl TypeExpr {
    /// Whether nested fields may be declared for this type in a
    /// `parameters:` block (`object` and `object[]`, at any array depth).
    pub(super) fn is_plain_object(&self) -> bool {
        match self {
            TypeExpr::Prim(Prim::Object) => true,
            TypeExpr::Array(inner) => inner.is_plain_object(),
            _ => false,
        }
    }

    /// The object fields nested fields go into, turning a plain `object`
    /// (or the items of `object[]`) into a declared object on first use.
    pub(super) fn object_fields_mut(&mut self) -> Option<&mut Vec<Field>> {
        match self {
            TypeExpr::Prim(Prim::Object) => {
                *self = TypeExpr::Object(Vec::new());
                self.object_fields_mut()
            }
            TypeExpr::Object(fields) => Some(fields),
            TypeExpr::Array(inner) => inner.object_fields_mut(),
            _ => None,
        }
    }

    /// Human spelling, for messages.
    pub(super) fn describe(&self) -> String {
        match self {
            TypeExpr::Prim(p) => p.name().to_string(),
            TypeExpr::Object(_) => "object".to_string(),
            TypeExpr::Array(inner) => format!("{}[]", inner.describe()),
            TypeExpr::Named { name, .. } => name.clone(),
        }
    }
}

/// A parameter, or a field of an object type.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Field {
    /// Name as written.
    pub name: String,
    /// Column of the name.
    pub column: u32,
    /// Marked with `?`.
    pub optional: bool,
    /// Its type.
    pub ty: TypeExpr,
    /// `= default`, already checked against `ty`.
    pub default: Option<Value>,
    /// From a `description:` in the `parameters:` block.
    pub description: Option<String>,
}

impl Field {
    /// Required unless marked `?` or given a default (seed, "Parameter syntax").
    pub(super) fn required(&self) -> bool {
        !self.optional && self.default.is_none()
    }
}

/// A parsed `name(params) -> ReturnType` line.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Signature {
    /// Tool name.
    pub name: String,
    /// Column of the name.
    pub name_column: u32,
    /// Parameters in order.
    pub params: Vec<Field>,
    /// The return type.
    pub returns: TypeExpr,
}

/// Parse a signature line. `first_column` is the column of `text`'s first character.
pub(super) fn parse_signature(text: &str, first_column: u32) -> Result<Signature, SigError> {
    let mut p = Parser::new(text, first_column)?;
    let (name, name_column) = p.ident("a tool name")?;
    p.expect(&Tok::LParen, "`(` after the tool name")?;
    let mut params: Vec<Field> = Vec::new();
    if !p.eat(&Tok::RParen) {
        loop {
            let field = p.field(true, 0)?;
            if params.iter().any(|f| f.name == field.name) {
                return err(
                    field.column,
                    format!("duplicate parameter `{}`", field.name),
                );
            }
            params.push(field);
            if p.eat(&Tok::RParen) {
                break;
            }
            p.expect(&Tok::Comma, "`,` or `)` in the parameter list")?;
            // A trailing comma before `)` is accepted.
            if p.eat(&Tok::RParen) {
                break;
            }
        }
    }
    p.expect(&Tok::Arrow, "`-> ReturnType` after the parameters")?;
    let returns = p.ty(0)?;
    p.end("after the return type")?;
    Ok(Signature {
        name,
        name_column,
        params,
        returns,
    })
}

/// Parse `name?: type = default`, the form of a nested field line in a
/// `parameters:` block.
pub(super) fn parse_field_decl(text: &str, first_column: u32) -> Result<Field, SigError> {
    let mut p = Parser::new(text, first_column)?;
    let field = p.field(true, 0)?;
    p.end("after the field")?;
    Ok(field)
}

/// Parse a whole type expression (the right-hand side of a `TYPES:` line).
pub(super) fn parse_type_decl(text: &str, first_column: u32) -> Result<TypeExpr, SigError> {
    let mut p = Parser::new(text, first_column)?;
    let ty = p.ty(0)?;
    p.end("after the type")?;
    Ok(ty)
}

/// Most type nodes (fields, arrays, primitives) a type may expand to once
/// its named types are substituted: named types that use each other twice
/// over grow exponentially.
pub(super) const MAX_TYPE_NODES: usize = 4096;

/// Substitute the named types of `ty` that `types` defines (each already
/// expanded) into it. A name `types` lacks stays [`TypeExpr::Named`].
/// Errors: the expansion is deeper than [`MAX_TYPE_DEPTH`] or larger than
/// [`MAX_TYPE_NODES`] (at the column of the name that made it so).
pub(super) fn expand_named(
    ty: &mut TypeExpr,
    types: &std::collections::BTreeMap<String, TypeExpr>,
) -> Result<(), SigError> {
    fn walk(
        ty: &mut TypeExpr,
        types: &std::collections::BTreeMap<String, TypeExpr>,
        depth: usize,
        nodes: &mut usize,
        at: u32,
    ) -> Result<(), SigError> {
        *nodes += 1;
        if depth > MAX_TYPE_DEPTH {
            return err(
                at,
                "type is nested too deeply once its named types are expanded",
            );
        }
        if *nodes > MAX_TYPE_NODES {
            return err(
                at,
                format!(
                    "type expands to more than {MAX_TYPE_NODES} parts once its named types are expanded"
                ),
            );
        }
        match ty {
            TypeExpr::Named { name, column } => {
                if let Some(def) = types.get(name.as_str()) {
                    let column = *column;
                    *ty = def.clone();
                    // Count (and bound) what was substituted.
                    *nodes -= 1;
                    walk(ty, &std::collections::BTreeMap::new(), depth, nodes, column)?;
                }
                Ok(())
            }
            TypeExpr::Array(inner) => walk(inner, types, depth + 1, nodes, at),
            TypeExpr::Object(fields) => fields
                .iter_mut()
                .try_for_each(|f| walk(&mut f.ty, types, depth + 1, nodes, f.column)),
            TypeExpr::Prim(_) => Ok(()),
        }
    }
    let mut nodes = 0;
    walk(ty, types, 0, &mut nodes, 1)
}

/// The named types `ty` refers to, with their columns, in order.
pub(super) fn named_refs(ty: &TypeExpr, out: &mut Vec<(String, u32)>) {
    match ty {
        TypeExpr::Named { name, column } => out.push((name.clone(), *column)),
        TypeExpr::Array(inner) => named_refs(inner, out),
        TypeExpr::Object(fields) => fields.iter().for_each(|f| named_refs(&f.ty, out)),
        TypeExpr::Prim(_) => {}
    }
}

/// Reject what is valid in a return type but not in a parameter: named
/// types not defined in the file's `TYPES:` section (the seed never defines
/// its own), so the model could not know what to send.
pub(super) fn check_input_type(ty: &TypeExpr) -> Result<(), SigError> {
    match ty {
        TypeExpr::Named { name, column } => err(
            *column,
            format!(
                "named type `{name}` is not defined in this file's `TYPES:` section, so it is not allowed in parameters; define it there, or use `object` and declare its fields"
            ),
        ),
        TypeExpr::Array(inner) => check_input_type(inner),
        TypeExpr::Object(fields) => fields.iter().try_for_each(|f| check_input_type(&f.ty)),
        TypeExpr::Prim(_) => Ok(()),
    }
}

/// Whether a schema is for arguments (closed objects) or results (open objects).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Direction {
    /// Arguments: undeclared properties are refused.
    Input,
    /// Results: tools may return more than they declare.
    Output,
}

/// JSON Schema of the arguments object of `params`.
pub(super) fn input_schema(params: &[Field]) -> Value {
    object_schema(params, Direction::Input)
}

/// JSON Schema of a type.
pub(super) fn type_schema(ty: &TypeExpr, direction: Direction) -> Value {
    match ty {
        TypeExpr::Prim(Prim::Date) => json!({"type": "string", "format": "date"}),
        TypeExpr::Prim(p) => json!({"type": p.name()}),
        TypeExpr::Object(fields) => object_schema(fields, direction),
        TypeExpr::Array(inner) => json!({"type": "array", "items": type_schema(inner, direction)}),
        // Unknown shape: constrain nothing, but keep the name for readers.
        TypeExpr::Named { name, .. } => json!({"title": name}),
    }
}

fn object_schema(fields: &[Field], direction: Direction) -> Value {
    let mut properties = Map::new();
    let mut required = Vec::new();
    for f in fields {
        let mut schema = type_schema(&f.ty, direction);
        if let Value::Object(map) = &mut schema {
            if let Some(d) = &f.description {
                map.insert("description".into(), Value::String(d.clone()));
            }
            if let Some(d) = &f.default {
                map.insert("default".into(), d.clone());
            }
        }
        properties.insert(f.name.clone(), schema);
        if f.required() {
            required.push(Value::String(f.name.clone()));
        }
    }
    json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": direction == Direction::Output,
    })
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    Num(Number),
    LParen,
    RParen,
    LBrace,
    RBrace,
    LBracket,
    RBracket,
    Comma,
    Colon,
    Question,
    Equals,
    Arrow,
    Minus,
}

impl Tok {
    fn show(&self) -> String {
        match self {
            Tok::Ident(s) => format!("`{s}`"),
            Tok::Str(s) => format!("string \"{s}\""),
            Tok::Num(n) => format!("`{n}`"),
            Tok::LParen => "`(`".into(),
            Tok::RParen => "`)`".into(),
            Tok::LBrace => "`{`".into(),
            Tok::RBrace => "`}`".into(),
            Tok::LBracket => "`[`".into(),
            Tok::RBracket => "`]`".into(),
            Tok::Comma => "`,`".into(),
            Tok::Colon => "`:`".into(),
            Tok::Question => "`?`".into(),
            Tok::Equals => "`=`".into(),
            Tok::Arrow => "`->`".into(),
            Tok::Minus => "`-`".into(),
        }
    }
}

fn lex(text: &str, first_column: u32) -> Result<(Vec<(Tok, u32)>, u32), SigError> {
    let chars: Vec<char> = text.chars().collect();
    let col = |i: usize| first_column.saturating_add(u32::try_from(i).unwrap_or(u32::MAX));
    let mut toks = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let start = i;
        let simple = match c {
            '(' => Some(Tok::LParen),
            ')' => Some(Tok::RParen),
            '{' => Some(Tok::LBrace),
            '}' => Some(Tok::RBrace),
            '[' => Some(Tok::LBracket),
            ']' => Some(Tok::RBracket),
            ',' => Some(Tok::Comma),
            ':' => Some(Tok::Colon),
            '?' => Some(Tok::Question),
            '=' => Some(Tok::Equals),
            _ => None,
        };
        if let Some(t) = simple {
            toks.push((t, col(i)));
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '-' && chars.get(i + 1) == Some(&'>') {
            toks.push((Tok::Arrow, col(i)));
            i += 2;
        } else if c == '-' {
            toks.push((Tok::Minus, col(i)));
            i += 1;
        } else if c.is_ascii_alphabetic() || c == '_' {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            toks.push((Tok::Ident(chars[start..i].iter().collect()), col(start)));
        } else if c.is_ascii_digit() {
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric()
                    || chars[i] == '.'
                    || chars[i] == '+'
                    || chars[i] == '-')
            {
                // `1e-3` needs the sign after `e`; elsewhere `-` ends the number.
                if (chars[i] == '+' || chars[i] == '-') && !matches!(chars[i - 1], 'e' | 'E') {
                    break;
                }
                i += 1;
            }
            let s: String = chars[start..i].iter().collect();
            let n = parse_number(&s).ok_or(SigError {
                column: col(start),
                message: format!("`{s}` is not a number"),
            })?;
            toks.push((Tok::Num(n), col(start)));
        } else if c == '"' || c == '\'' {
            let (s, next) = lex_string(&chars, i).map_err(|(at, m)| SigError {
                column: col(at),
                message: m,
            })?;
            toks.push((Tok::Str(s), col(start)));
            i = next;
        } else {
            return err(col(i), format!("unexpected character `{c}`"));
        }
    }
    Ok((toks, col(chars.len())))
}

fn parse_number(s: &str) -> Option<Number> {
    if let Ok(i) = s.parse::<i64>() {
        return Some(Number::from(i));
    }
    // Above `i64::MAX`: exact as u64 rather than rounded to a float (found
    // by `prop_tests::signatures_round_trip`).
    if let Ok(u) = s.parse::<u64>() {
        return Some(Number::from(u));
    }
    // Rust's float parser accepts `inf` and `NaN`; the lexer only lets
    // digit-led text through, and from_f64 refuses non-finite values anyway.
    s.parse::<f64>().ok().and_then(Number::from_f64)
}

/// Lex a quoted string starting at `chars[start]`, returning it and the index
/// after the closing quote. Double quotes take JSON-like escapes; single
/// quotes take `''` for a quote, as in YAML.
pub(super) fn lex_string(chars: &[char], start: usize) -> Result<(String, usize), (usize, String)> {
    let quote = chars[start];
    let mut out = String::new();
    let mut i = start + 1;
    while i < chars.len() {
        let c = chars[i];
        if c == quote {
            if quote == '\'' && chars.get(i + 1) == Some(&'\'') {
                out.push('\'');
                i += 2;
                continue;
            }
            return Ok((out, i + 1));
        }
        if c == '\\' && quote == '"' {
            let escaped = match chars.get(i + 1) {
                Some('"') => '"',
                Some('\\') => '\\',
                Some('/') => '/',
                Some('n') => '\n',
                Some('t') => '\t',
                Some('r') => '\r',
                Some(other) => return Err((i, format!("unknown escape `\\{other}` in string"))),
                None => break,
            };
            out.push(escaped);
            i += 2;
            continue;
        }
        out.push(c);
        i += 1;
    }
    Err((start, "unterminated string".to_string()))
}

struct Parser {
    toks: Vec<(Tok, u32)>,
    pos: usize,
    end_column: u32,
}

impl Parser {
    fn new(text: &str, first_column: u32) -> Result<Self, SigError> {
        let (toks, end_column) = lex(text, first_column)?;
        Ok(Parser {
            toks,
            pos: 0,
            end_column,
        })
    }

    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|(t, _)| t)
    }

    fn column(&self) -> u32 {
        self.toks.get(self.pos).map_or(self.end_column, |(_, c)| *c)
    }

    fn eat(&mut self, t: &Tok) -> bool {
        if self.peek() == Some(t) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn found(&self) -> String {
        self.peek()
            .map_or("the end of the line".to_string(), Tok::show)
    }

    fn expect(&mut self, t: &Tok, what: &str) -> Result<(), SigError> {
        if self.eat(t) {
            Ok(())
        } else {
            err(
                self.column(),
                format!("expected {what}, found {}", self.found()),
            )
        }
    }

    fn ident(&mut self, what: &str) -> Result<(String, u32), SigError> {
        let column = self.column();
        match self.peek() {
            Some(Tok::Ident(s)) => {
                let s = s.clone();
                self.pos += 1;
                Ok((s, column))
            }
            _ => err(column, format!("expected {what}, found {}", self.found())),
        }
    }

    fn end(&self, context: &str) -> Result<(), SigError> {
        match self.peek() {
            None => Ok(()),
            Some(t) => err(self.column(), format!("unexpected {} {context}", t.show())),
        }
    }

    /// `name ['?'] ':' type ['=' literal]`; defaults only where `allow_default`.
    fn field(&mut self, allow_default: bool, depth: usize) -> Result<Field, SigError> {
        let (name, column) = self.ident("a parameter name")?;
        let optional = self.eat(&Tok::Question);
        self.expect(&Tok::Colon, &format!("`:` and a type after `{name}`"))?;
        let ty = self.ty(depth)?;
        let mut default = None;
        if allow_default && self.peek() == Some(&Tok::Equals) {
            self.pos += 1;
            let at = self.column();
            let value = self.literal(0)?;
            check_default(&ty, &value, at)?;
            default = Some(value);
        }
        Ok(Field {
            name,
            column,
            optional,
            ty,
            default,
            description: None,
        })
    }

    /// A default value: a number, a quoted string, `true`, `false`, or, for
    /// array and object types, a JSON-like array `[v, ...]` or object
    /// `{key: v, ...}` of those (keys are names or quoted strings; `null`
    /// only inside one). Nested at most [`MAX_TYPE_DEPTH`] deep.
    fn literal(&mut self, depth: usize) -> Result<Value, SigError> {
        let column = self.column();
        if depth > MAX_TYPE_DEPTH {
            return err(column, "default value is nested too deeply");
        }
        let negative = self.eat(&Tok::Minus);
        let value = match self.peek() {
            Some(Tok::Num(n)) => {
                let n = n.clone();
                if negative {
                    negate(&n)
                } else {
                    Value::Number(n)
                }
            }
            Some(Tok::Str(s)) if !negative => Value::String(s.clone()),
            Some(Tok::Ident(s)) if !negative && s == "true" => Value::Bool(true),
            Some(Tok::Ident(s)) if !negative && s == "false" => Value::Bool(false),
            Some(Tok::Ident(s)) if !negative && depth > 0 && s == "null" => Value::Null,
            Some(Tok::LBracket) if !negative => {
                self.pos += 1;
                let mut items = Vec::new();
                while !self.eat(&Tok::RBracket) {
                    items.push(self.literal(depth + 1)?);
                    if !self.eat(&Tok::Comma) {
                        self.expect(&Tok::RBracket, "`,` or `]` in the default array")?;
                        break;
                    }
                }
                return Ok(Value::Array(items));
            }
            Some(Tok::LBrace) if !negative => {
                self.pos += 1;
                let mut map = Map::new();
                while !self.eat(&Tok::RBrace) {
                    let key_column = self.column();
                    let key = match self.peek() {
                        Some(Tok::Ident(k) | Tok::Str(k)) => k.clone(),
                        _ => {
                            return err(
                                key_column,
                                format!(
                                    "expected a key (a name or a quoted string) in the default object, found {}",
                                    self.found()
                                ),
                            );
                        }
                    };
                    self.pos += 1;
                    if map.contains_key(&key) {
                        return err(
                            key_column,
                            format!("key `{key}` is repeated in the default object"),
                        );
                    }
                    self.expect(
                        &Tok::Colon,
                        &format!("`:` after `{key}` in the default object"),
                    )?;
                    let v = self.literal(depth + 1)?;
                    map.insert(key, v);
                    if !self.eat(&Tok::Comma) {
                        self.expect(&Tok::RBrace, "`,` or `}` in the default object")?;
                        break;
                    }
                }
                return Ok(Value::Object(map));
            }
            _ => {
                return err(
                    column,
                    format!(
                        "expected a default value (a number, a quoted string, `true`, `false`, `[...]` or `{{...}}`), found {}",
                        self.found()
                    ),
                );
            }
        };
        self.pos += 1;
        Ok(value)
    }

    /// `base ('[' ']')*`
    fn ty(&mut self, depth: usize) -> Result<TypeExpr, SigError> {
        if depth > MAX_TYPE_DEPTH {
            return err(self.column(), "type is nested too deeply");
        }
        let column = self.column();
        let mut ty = match self.peek() {
            Some(Tok::LBrace) => {
                self.pos += 1;
                TypeExpr::Object(self.object_fields(depth + 1)?)
            }
            Some(Tok::Ident(name)) => {
                let name = name.clone();
                self.pos += 1;
                prim_or_named(&name, column)?
            }
            _ => return err(column, format!("expected a type, found {}", self.found())),
        };
        while self.peek() == Some(&Tok::LBracket) {
            self.pos += 1;
            self.expect(&Tok::RBracket, "`]` after `[`")?;
            ty = TypeExpr::Array(Box::new(ty));
        }
        Ok(ty)
    }

    /// Fields of `{...}` after the `{`, through the `}`.
    fn object_fields(&mut self, depth: usize) -> Result<Vec<Field>, SigError> {
        let mut fields: Vec<Field> = Vec::new();
        if self.eat(&Tok::RBrace) {
            return Ok(fields);
        }
        loop {
            // Inline object fields take no defaults: in a return type a
            // default means nothing, and parameters use `parameters:` for detail.
            let f = self.field(false, depth)?;
            if fields.iter().any(|g| g.name == f.name) {
                return err(f.column, format!("duplicate field `{}`", f.name));
            }
            fields.push(f);
            if self.eat(&Tok::RBrace) {
                return Ok(fields);
            }
            self.expect(&Tok::Comma, "`,` or `}` in the object type")?;
            if self.eat(&Tok::RBrace) {
                return Ok(fields);
            }
        }
    }
}

fn negate(n: &Number) -> Value {
    // `-9223372036854775808` is `i64::MIN`: its digits are a u64.
    let exact = match n.as_i64() {
        Some(i) => i.checked_neg(),
        None => n.as_u64().and_then(|u| 0i64.checked_sub_unsigned(u)),
    };
    if let Some(i) = exact {
        Value::Number(Number::from(i))
    } else {
        n.as_f64()
            .and_then(|f| Number::from_f64(-f))
            .map_or(Value::Null, Value::Number)
    }
}

fn prim_or_named(name: &str, column: u32) -> Result<TypeExpr, SigError> {
    Ok(TypeExpr::Prim(match name {
        "string" => Prim::String,
        "number" => Prim::Number,
        "boolean" => Prim::Boolean,
        "date" => Prim::Date,
        "object" => Prim::Object,
        // Common spellings from other languages get a pointed hint.
        "integer" | "int" | "float" | "double" => {
            return err(column, format!("unknown type `{name}`; use `number`"));
        }
        "bool" => return err(column, "unknown type `bool`; use `boolean`"),
        "str" => return err(column, "unknown type `str`; use `string`"),
        _ if name.starts_with(|c: char| c.is_ascii_uppercase()) => {
            return Ok(TypeExpr::Named {
                name: name.to_string(),
                column,
            });
        }
        _ => {
            return err(
                column,
                format!(
                    "unknown type `{name}` (expected string, number, boolean, date, object, or `type[]`)"
                ),
            );
        }
    }))
}

/// Whether `value` is a valid default of `ty` (a date must be a real one;
/// anything else must satisfy the type's input schema); the error is at
/// `column`. Run again once named types are expanded ([`expand_named`]).
pub(super) fn check_default(ty: &TypeExpr, value: &Value, column: u32) -> Result<(), SigError> {
    if let (TypeExpr::Prim(Prim::Date), Value::String(s)) = (ty, value)
        && !is_date(s)
    {
        return err(
            column,
            format!("default \"{s}\" is not a date (YYYY-MM-DD)"),
        );
    }
    // Any other type: the default must be a value of it, judged by the
    // type's own input schema (so an object default has every required
    // field and no undeclared one, and array items are of the item type).
    match super::schema::validate_json(&type_schema(ty, Direction::Input), value) {
        Ok(()) => Ok(()),
        Err(errors) => err(
            column,
            format!(
                "default {value} does not match type `{}`: {}",
                ty.describe(),
                errors.join("; ")
            ),
        ),
    }
}

/// `YYYY-MM-DD` with a real month and day (JSON Schema `date`, RFC 3339 full-date).
pub(super) fn is_date(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return false;
    }
    let digits = |r: std::ops::Range<usize>| -> Option<u32> {
        let part = s.get(r)?;
        if part.bytes().all(|c| c.is_ascii_digit()) {
            part.parse().ok()
        } else {
            None
        }
    };
    let (Some(y), Some(m), Some(d)) = (digits(0..4), digits(5..7), digits(8..10)) else {
        return false;
    };
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let days = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days).contains(&d)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn sig(text: &str) -> Signature {
        parse_signature(text, 1).unwrap()
    }

    fn sig_err(text: &str) -> (u32, String) {
        let e = parse_signature(text, 1).unwrap_err();
        (e.column, e.message)
    }

    #[test]
    fn parameter_forms_and_input_schema() {
        let s = sig(
            r#"t(a: string, b?: number, c: boolean = true, d: date = "2026-03-01", e: number = -2.5, f: string = "USD", g?: number = 10) -> string"#,
        );
        assert_eq!(s.name, "t");
        assert_eq!(
            input_schema(&s.params),
            json!({
                "type": "object",
                "properties": {
                    "a": {"type": "string"},
                    "b": {"type": "number"},
                    "c": {"type": "boolean", "default": true},
                    "d": {"type": "string", "format": "date", "default": "2026-03-01"},
                    "e": {"type": "number", "default": -2.5},
                    "f": {"type": "string", "default": "USD"},
                    "g": {"type": "number", "default": 10}
                },
                "required": ["a"],
                "additionalProperties": false
            })
        );
        assert_eq!(
            type_schema(&s.returns, Direction::Output),
            json!({"type": "string"})
        );
    }

    #[test]
    fn arrays_objects_and_named_types() {
        let s = sig(
            "bulk_lookup(ids: string[], matrix: number[][], meta: object, rows: object[]) -> Hotel[]",
        );
        assert_eq!(
            input_schema(&s.params)["properties"],
            json!({
                "ids": {"type": "array", "items": {"type": "string"}},
                "matrix": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
                "meta": {"type": "object"},
                "rows": {"type": "array", "items": {"type": "object"}}
            })
        );
        assert_eq!(
            type_schema(&s.returns, Direction::Output),
            json!({"type": "array", "items": {"title": "Hotel"}})
        );
    }

    #[test]
    fn seed_return_type_forms() {
        let s = sig(
            "search_hotels(destination: string, checkin: date, checkout: date) -> {hotels: {id: string, name: string, price: number, rating: number}[], total: number}",
        );
        let hotel = json!({
            "type": "object",
            "properties": {
                "id": {"type": "string"}, "name": {"type": "string"},
                "price": {"type": "number"}, "rating": {"type": "number"}
            },
            "required": ["id", "name", "price", "rating"],
            "additionalProperties": true
        });
        assert_eq!(
            type_schema(&s.returns, Direction::Output),
            json!({
                "type": "object",
                "properties": {"hotels": {"type": "array", "items": hotel}, "total": {"type": "number"}},
                "required": ["hotels", "total"],
                "additionalProperties": true
            })
        );
        let s = sig("f() -> {user: {name: string, age: number}, error?: string}");
        assert_eq!(
            type_schema(&s.returns, Direction::Output),
            json!({
                "type": "object",
                "properties": {
                    "user": {
                        "type": "object",
                        "properties": {"name": {"type": "string"}, "age": {"type": "number"}},
                        "required": ["name", "age"],
                        "additionalProperties": true
                    },
                    "error": {"type": "string"}
                },
                "required": ["user"],
                "additionalProperties": true
            })
        );
        assert!(s.params.is_empty());
        let s = sig("f() -> {id: string, title: string}[]");
        assert_eq!(
            type_schema(&s.returns, Direction::Output)["type"],
            json!("array")
        );
        let s = sig("f() -> {}");
        assert_eq!(
            type_schema(&s.returns, Direction::Output),
            json!({"type": "object", "properties": {}, "required": [], "additionalProperties": true})
        );
    }

    #[test]
    fn inline_object_parameters_are_closed() {
        let s = sig("f(addr: {street: string, zip?: string}) -> boolean");
        assert_eq!(
            input_schema(&s.params)["properties"]["addr"],
            json!({
                "type": "object",
                "properties": {"street": {"type": "string"}, "zip": {"type": "string"}},
                "required": ["street"],
                "additionalProperties": false
            })
        );
    }

    #[test]
    fn trailing_commas_and_spacing_are_tolerated() {
        let s = sig("f( a : string , b:number, )->{x:string,}");
        assert_eq!(s.params.len(), 2);
        assert_eq!(s.params[1].name, "b");
    }

    #[test]
    fn signature_errors_point_at_the_column() {
        assert_eq!(
            sig_err("f(a string) -> x"),
            (
                5,
                "expected `:` and a type after `a`, found `string`".into()
            )
        );
        assert_eq!(sig_err("f(a: strin) -> string").0, 6);
        assert!(
            sig_err("f(a: strin) -> string")
                .1
                .starts_with("unknown type `strin`")
        );
        assert_eq!(
            sig_err("f(a: integer) -> string"),
            (6, "unknown type `integer`; use `number`".into())
        );
        assert_eq!(
            sig_err("f(a: string)"),
            (
                13,
                "expected `-> ReturnType` after the parameters, found the end of the line".into()
            )
        );
        assert_eq!(
            sig_err("f(a: string, a: number) -> string"),
            (14, "duplicate parameter `a`".into())
        );
        assert_eq!(
            sig_err("f() -> {a: string, a: number}"),
            (20, "duplicate field `a`".into())
        );
        let (column, message) = sig_err("f(a: number = \"x\") -> string");
        assert_eq!(column, 15);
        assert!(
            message.starts_with("default \"x\" does not match type `number`: "),
            "{message}"
        );
        assert_eq!(
            sig_err("f(a: date = \"2026-02-30\") -> string"),
            (
                13,
                "default \"2026-02-30\" is not a date (YYYY-MM-DD)".into()
            )
        );
        let (column, message) = sig_err("f(a: string[] = \"x\") -> string");
        assert_eq!(column, 17);
        assert!(
            message.starts_with("default \"x\" does not match type `string[]`: "),
            "{message}"
        );
        assert_eq!(sig_err("f(a: string = maybe) -> string").0, 15);
        assert_eq!(
            sig_err("f() -> string extra"),
            (15, "unexpected `extra` after the return type".into())
        );
        assert_eq!(
            sig_err("f(a: string = \"x) -> string"),
            (15, "unterminated string".into())
        );
        assert_eq!(
            sig_err("f(a: string = \"\\q\") -> string"),
            (16, "unknown escape `\\q` in string".into())
        );
        assert_eq!(
            sig_err("f(a: @) -> string"),
            (6, "unexpected character `@`".into())
        );
        assert_eq!(
            sig_err("f(a: string[) -> string"),
            (13, "expected `]` after `[`, found `)`".into())
        );
        assert_eq!(
            sig_err("f(a: {x: string) -> string"),
            (
                16,
                "expected `,` or `}` in the object type, found `)`".into()
            )
        );
        assert_eq!(
            sig_err("f(a: 1x) -> string"),
            (6, "`1x` is not a number".into())
        );
    }

    #[test]
    fn array_and_object_defaults_are_json_like_literals_of_the_type() {
        let s = sig("f(tags: string[] = [\"a\", 'b'], nums: number[] = [], \
             opts: {size: number, label?: string} = {size: -2, \"label\": \"x\"}, \
             rows: {id: number}[] = [{id: 1}, {id: 2},], any: object = {k: [null, true]}) -> string");
        let defaults: Vec<_> = s.params.iter().map(|p| p.default.clone()).collect();
        assert_eq!(
            defaults,
            vec![
                Some(json!(["a", "b"])),
                Some(json!([])),
                Some(json!({"size": -2, "label": "x"})),
                Some(json!([{"id": 1}, {"id": 2}])),
                Some(json!({"k": [null, true]})),
            ]
        );
        // The schema carries them, and a parameter with a default is optional.
        let schema = input_schema(&s.params);
        assert_eq!(schema["properties"]["tags"]["default"], json!(["a", "b"]));
        assert_eq!(schema["required"], json!([]));

        // A default of the wrong shape names the column of the value and why.
        for (text, column, starts) in [
            (
                "f(a: number[] = [1, \"x\"]) -> string",
                17,
                "default [1,\"x\"] does not match type `number[]`: ",
            ),
            (
                "f(a: {x: number} = {}) -> string",
                20,
                "default {} does not match type `object`: ",
            ),
            (
                "f(a: {x: number} = {x: 1, y: 2}) -> string",
                20,
                "default {\"x\":1,\"y\":2} does not match type `object`: ",
            ),
            (
                "f(a: string = null) -> string",
                15,
                "expected a default value",
            ),
            (
                "f(a: string[] = [1 2]) -> string",
                20,
                "expected `,` or `]` in the default array, found `2`",
            ),
            (
                "f(a: object = {x 1}) -> string",
                18,
                "expected `:` after `x` in the default object, found `1`",
            ),
            (
                "f(a: object = {x: 1, x: 2}) -> string",
                22,
                "key `x` is repeated in the default object",
            ),
            (
                "f(a: object = {1: 2}) -> string",
                16,
                "expected a key (a name or a quoted string) in the default object, found `1`",
            ),
            (
                "f(a: string[] = [\"x\") -> string",
                21,
                "expected `,` or `]` in the default array, found `)`",
            ),
        ] {
            let (c, m) = sig_err(text);
            assert!(m.starts_with(starts), "{text}: {m}");
            assert_eq!(c, column, "{text}: {m}");
        }
        let deep = format!("f(a: object = {}1) -> string", "[".repeat(100));
        assert_eq!(sig_err(&deep).1, "default value is nested too deeply");
    }

    #[test]
    fn column_offset_is_applied() {
        let e = parse_signature("f(a string) -> x", 5).unwrap_err();
        assert_eq!(e.column, 9);
        assert_eq!(
            parse_signature("f(a: string) -> string", 3)
                .unwrap()
                .name_column,
            3
        );
    }

    #[test]
    fn deep_nesting_is_refused_not_overflowed() {
        let text = format!("f() -> {}", "{a: ".repeat(10_000));
        let e = parse_signature(&text, 1).unwrap_err();
        assert_eq!(e.message, "type is nested too deeply");
    }

    #[test]
    fn named_types_are_refused_in_parameters() {
        let s = sig("f(h: Hotel) -> Hotel");
        let e = check_input_type(&s.params[0].ty).unwrap_err();
        assert_eq!(e.column, 6);
        assert!(
            e.message
                .starts_with("named type `Hotel` is not defined in this file's `TYPES:` section")
        );
        let s = sig("f(h: {x: Hotel[]}) -> string");
        assert_eq!(check_input_type(&s.params[0].ty).unwrap_err().column, 10);
    }

    #[test]
    fn field_declarations() {
        let f = parse_field_decl("qty?: number = 1", 7).unwrap();
        assert_eq!((f.name.as_str(), f.column, f.optional), ("qty", 7, true));
        assert_eq!(f.default, Some(json!(1)));
        assert_eq!(
            parse_field_decl("qty: number extra", 1).unwrap_err().column,
            13
        );
    }

    #[test]
    fn numbers_and_strings() {
        let s = sig(
            r#"f(a: number = 1e3, b: number = -7, c: string = 'it''s', d: string = "a\"b\\c\n") -> string"#,
        );
        assert_eq!(s.params[0].default, Some(json!(1000.0)));
        assert_eq!(s.params[1].default, Some(json!(-7)));
        assert_eq!(s.params[2].default, Some(json!("it's")));
        assert_eq!(s.params[3].default, Some(json!("a\"b\\c\n")));
        // Integers beyond i64 stay exact (they were rounded to floats).
        let s =
            sig("f(a: number = 18446744073709551615, b: number = -9223372036854775808) -> string");
        assert_eq!(s.params[0].default, Some(json!(u64::MAX)));
        assert_eq!(s.params[1].default, Some(json!(i64::MIN)));
        let s =
            sig("f(a: number = 18446744073709551616, b: number = -9223372036854775809) -> string");
        assert_eq!(s.params[0].default, Some(json!(18446744073709551616.0)));
        assert_eq!(s.params[1].default, Some(json!(-9223372036854775809.0)));
    }

    #[test]
    fn dates() {
        assert!(is_date("2024-02-29"));
        assert!(!is_date("2023-02-29"));
        assert!(!is_date("2023-13-01"));
        assert!(!is_date("2023-1-01"));
        assert!(!is_date("２０２３-01-01"));
    }
}
