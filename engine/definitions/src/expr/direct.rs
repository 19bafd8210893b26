//! Direct evaluation: the small part of jq that most workflow expressions
//! are written in (`.vars.n // 0`, `(.vars.n // 0) + 1`, `.vars.n < 10`,
//! `{n: .vars.n}`), evaluated straight over the `serde_json` state, with
//! no jaq value conversion, no evaluation thread and no sandbox round
//! trip.
//!
//! # What it answers
//!
//! [`Direct::build`] takes jaq's syntax tree of an expression and keeps it
//! only if every node is one of: `.`; a path of literal keys and integer
//! indices (`.a."b"[0][-1]`, no `?`, no slices, no `[]`); `null`, `true`,
//! `false`, integer and plain string literals; `[a, b, ...]` and
//! `{k: v, k}` with literal keys; `|` without a binding; `//`; `and`,
//! `or`, `not`, `length`; `+`, `-`, `*`, unary `-`; the six comparisons;
//! `if … then … elif … else … end`. At most [`MAX_NODES`] nodes. The rest
//! (definitions, variables, generators, folds, `try`, library calls,
//! formats, interpolation) is left to jaq.
//!
//! [`Direct::eval`] answers `Some` only where its value is the one jaq
//! gives (the module tests compare the two over generated expressions and
//! states): arithmetic on integers that does not overflow, `+` on two
//! strings or with `null` on one side, comparisons of `null`, booleans,
//! integers and strings (jq's order across those types: null < false <
//! true < numbers < strings). Anything else, and every error (a field of
//! a number, a value too large or too deep for JSON), is `None`, and the
//! caller evaluates the expression with jaq as before, which gives the
//! same value or error it always did. So this changes how long an
//! evaluation takes, never what it gives.
//!
//! # Why it may run in the engine
//!
//! The sandbox (parent module doc) exists because jaq can be made to loop
//! or allocate without bound. Here there is no loop, recursion, definition
//! or generator (`not` and `length` are the only library filters, both
//! linear): each node is evaluated at most once per evaluation. Values
//! refer into the state instead of copying it, and a value the expression
//! made is shared, never copied, when it is used again (`[., ., .]` holds
//! three references to one value), so an evaluation allocates a few words
//! per node plus the strings `+` builds, which count against
//! [`MAX_BUILT_BYTES`]. The result is copied out against the
//! [`super::MAX_VALUE_BYTES`] that jaq's results are held to, charged
//! before each part is written: a part shared many times over is charged
//! each time it is written, and every part charges at least a byte, so
//! the copy stops within the budget (a string past it is refused by its
//! length, unread). It is sized in a first pass that allocates nothing,
//! so a result past the budget is declined without being built. `length`
//! and comparisons leave strings longer than that budget to jaq, so no
//! node's work grows with the state. A budget exceeded is `None`: jaq
//! decides, in the sandbox.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::rc::Rc;

use jaq_core::load::lex::StrPart;
use jaq_core::load::parse::{BinaryOp, Term};
use jaq_core::ops::{Cmp, Math};
use jaq_core::path::{Opt, Part};
use serde_json::{Map, Number, Value};

use super::{MAX_OUTPUT_DEPTH, MAX_VALUE_BYTES, charge, json_string_len};

/// Most syntax nodes an expression evaluated directly may have.
pub(super) const MAX_NODES: usize = 64;

/// Most bytes of strings that `+` may build in one evaluation.
pub(super) const MAX_BUILT_BYTES: usize = MAX_VALUE_BYTES;

/// An expression in the part of jq evaluated directly (module doc).
#[derive(Debug)]
pub(super) struct Direct(Node);

#[derive(Debug)]
enum Node {
    Id,
    Literal(Literal),
    Path(Box<Node>, Vec<Key>),
    Array(Vec<Node>),
    Object(Vec<(String, Node)>),
    Pipe(Box<Node>, Box<Node>),
    Alt(Box<Node>, Box<Node>),
    And(Box<Node>, Box<Node>),
    Or(Box<Node>, Box<Node>),
    Not,
    Length,
    Neg(Box<Node>),
    Math(Arith, Box<Node>, Box<Node>),
    Cmp(Cmp, Box<Node>, Box<Node>),
    If(Vec<(Node, Node)>, Option<Box<Node>>),
}

#[derive(Debug)]
enum Literal {
    Null,
    Bool(bool),
    Int(i64),
    Str(String),
}

#[derive(Debug, Clone, Copy)]
enum Arith {
    Add,
    Sub,
    Mul,
}

#[derive(Debug)]
enum Key {
    Field(String),
    Index(i64),
}

impl Direct {
    /// The expression `term`, if it is in the directly evaluated part of
    /// jq (module doc); `None` otherwise.
    pub(super) fn build(term: &Term<&str>) -> Option<Direct> {
        let mut left = MAX_NODES;
        node(term, &mut left).map(Direct)
    }

    /// The expression's value over `state`, when it is jaq's (module doc);
    /// `None`: evaluate with jaq.
    pub(super) fn eval(&self, state: &Value) -> Option<Value> {
        let mut eval = Eval {
            built_left: MAX_BUILT_BYTES,
        };
        let value = eval.node(&self.0, &V::Ref(state))?;
        result_json(&value)
    }
}

// ---------------------------------------------------------------------
// Building: jaq's syntax tree to `Node`.

fn node(term: &Term<&str>, left: &mut usize) -> Option<Node> {
    *left = left.checked_sub(1)?;
    let boxed = |term: &Term<&str>, left: &mut usize| node(term, left).map(Box::new);
    Some(match term {
        Term::Id => Node::Id,
        Term::Num(text) => Node::Literal(Literal::Int(integer(text)?)),
        Term::Str(None, parts) => Node::Literal(Literal::Str(plain_string(parts)?)),
        Term::Call(name, args) if args.is_empty() => match *name {
            "null" => Node::Literal(Literal::Null),
            "true" => Node::Literal(Literal::Bool(true)),
            "false" => Node::Literal(Literal::Bool(false)),
            "not" => Node::Not,
            "length" => Node::Length,
            _ => return None,
        },
        Term::Arr(None) => Node::Array(Vec::new()),
        Term::Arr(Some(items)) => {
            let mut out = Vec::new();
            comma_items(items, left, &mut out)?;
            Node::Array(out)
        }
        Term::Obj(entries) => Node::Object(
            entries
                .iter()
                .map(|(key, value)| object_entry(key, value.as_ref(), left))
                .collect::<Option<_>>()?,
        ),
        Term::Neg(inner) => Node::Neg(boxed(inner, left)?),
        Term::BinOp(l, op, r) => {
            let (l, r) = (boxed(l, left)?, boxed(r, left)?);
            match op {
                BinaryOp::Pipe(None) => Node::Pipe(l, r),
                BinaryOp::Alt => Node::Alt(l, r),
                BinaryOp::And => Node::And(l, r),
                BinaryOp::Or => Node::Or(l, r),
                BinaryOp::Math(Math::Add) => Node::Math(Arith::Add, l, r),
                BinaryOp::Math(Math::Sub) => Node::Math(Arith::Sub, l, r),
                BinaryOp::Math(Math::Mul) => Node::Math(Arith::Mul, l, r),
                BinaryOp::Cmp(cmp) => Node::Cmp(*cmp, l, r),
                _ => return None,
            }
        }
        Term::IfThenElse(branches, otherwise) => Node::If(
            branches
                .iter()
                .map(|(c, t)| Some((node(c, left)?, node(t, left)?)))
                .collect::<Option<_>>()?,
            match otherwise {
                Some(e) => Some(boxed(e, left)?),
                None => None,
            },
        ),
        Term::Path(base, path) => Node::Path(
            boxed(base, left)?,
            path.0
                .iter()
                .map(|(part, opt)| path_key(part, opt))
                .collect::<Option<_>>()?,
        ),
        _ => return None,
    })
}

/// The elements of `[a, b, ...]`: `items` split at its top-level commas.
fn comma_items(items: &Term<&str>, left: &mut usize, out: &mut Vec<Node>) -> Option<()> {
    match items {
        Term::BinOp(l, BinaryOp::Comma, r) => {
            comma_items(l, left, out)?;
            comma_items(r, left, out)
        }
        item => {
            out.push(node(item, left)?);
            Some(())
        }
    }
}

/// `k: v`, or `k` alone (`{k}` is `{k: .k}`), with a literal key.
fn object_entry(
    key: &Term<&str>,
    value: Option<&Term<&str>>,
    left: &mut usize,
) -> Option<(String, Node)> {
    let Term::Str(None, parts) = key else {
        return None;
    };
    let key = plain_string(parts)?;
    let value = match value {
        Some(value) => node(value, left)?,
        None => {
            *left = left.checked_sub(1)?;
            Node::Path(Box::new(Node::Id), vec![Key::Field(key.clone())])
        }
    };
    Some((key, value))
}

/// A path part `.k`, `."k"`, `[n]` or `[-n]`, without `?`.
fn path_key(part: &Part<Term<&str>>, opt: &Opt) -> Option<Key> {
    if !matches!(opt, Opt::Essential) {
        return None;
    }
    match part {
        Part::Index(Term::Str(None, parts)) => plain_string(parts).map(Key::Field),
        Part::Index(Term::Num(text)) => integer(text).map(Key::Index),
        Part::Index(Term::Neg(inner)) => match &**inner {
            Term::Num(text) => integer(text)?.checked_neg().map(Key::Index),
            _ => None,
        },
        _ => None,
    }
}

/// An integer literal as jaq reads one (`Num::from_str`: a machine
/// integer when it parses as one); anything else (decimals, exponents,
/// big integers) is left to jaq.
fn integer(text: &str) -> Option<i64> {
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// A string literal without interpolation.
fn plain_string(parts: &[StrPart<&str, Term<&str>>]) -> Option<String> {
    let mut out = String::new();
    for part in parts {
        match part {
            StrPart::Str(s) => out.push_str(s),
            StrPart::Char(c) => out.push(*c),
            StrPart::Term(_) => return None,
        }
    }
    Some(out)
}

// ---------------------------------------------------------------------
// Evaluating.

/// A value while the expression is evaluated: a part of the state, or one
/// the expression made. Cloning one is O(1) (a value used twice, as in
/// `[., .]`, is shared, never copied), so what an evaluation allocates is
/// bounded by its nodes and by the strings `+` builds.
#[derive(Debug, Clone)]
enum V<'a> {
    Ref(&'a Value),
    Null,
    Bool(bool),
    Int(i64),
    /// A string literal of the expression.
    Lit(&'a str),
    /// A string `+` built.
    Str(Rc<str>),
    Array(Rc<Vec<V<'a>>>),
    Object(Rc<BTreeMap<&'a str, V<'a>>>),
}

/// A scalar view of a value, for arithmetic and comparisons. `Other`:
/// an array, an object or a number that is not an `i64`.
#[derive(Debug, Clone, Copy)]
enum Scalar<'v> {
    Null,
    Bool(bool),
    Int(i64),
    Str(&'v str),
    Other,
}

impl<'a> V<'a> {
    fn scalar(&self) -> Scalar<'_> {
        match self {
            V::Null | V::Ref(Value::Null) => Scalar::Null,
            V::Bool(b) | V::Ref(Value::Bool(b)) => Scalar::Bool(*b),
            V::Int(i) => Scalar::Int(*i),
            V::Ref(Value::Number(n)) => n.as_i64().map_or(Scalar::Other, Scalar::Int),
            V::Lit(s) => Scalar::Str(s),
            V::Str(s) => Scalar::Str(s),
            V::Ref(Value::String(s)) => Scalar::Str(s),
            V::Ref(Value::Array(_) | Value::Object(_)) | V::Array(_) | V::Object(_) => {
                Scalar::Other
            }
        }
    }

    /// jq's truth: everything but `false` and `null`.
    fn truthy(&self) -> bool {
        !matches!(self.scalar(), Scalar::Null | Scalar::Bool(false))
    }

    /// `.k` or `.[n]` of this value; `None` where jq fails.
    fn index(&self, key: &Key) -> Option<V<'a>> {
        match (self, key) {
            (V::Null | V::Ref(Value::Null), _) => Some(V::Null),
            (V::Ref(Value::Object(map)), Key::Field(k)) => {
                Some(map.get(k.as_str()).map_or(V::Null, V::Ref))
            }
            (V::Object(map), Key::Field(k)) => {
                Some(map.get(k.as_str()).cloned().unwrap_or(V::Null))
            }
            (V::Ref(Value::Array(items)), Key::Index(i)) => {
                Some(element(items.len(), *i).map_or(V::Null, |at| V::Ref(&items[at])))
            }
            (V::Array(items), Key::Index(i)) => {
                Some(element(items.len(), *i).map_or(V::Null, |at| items[at].clone()))
            }
            _ => None,
        }
    }
}

/// Where index `i` of an array of `len` falls (negative from the end),
/// if inside it.
fn element(len: usize, i: i64) -> Option<usize> {
    let len = i64::try_from(len).ok()?;
    let at = if i < 0 { len.checked_add(i)? } else { i };
    if (0..len).contains(&at) {
        usize::try_from(at).ok()
    } else {
        None
    }
}

struct Eval {
    built_left: usize,
}

impl Eval {
    fn node<'a>(&mut self, node: &'a Node, input: &V<'a>) -> Option<V<'a>> {
        Some(match node {
            Node::Id => input.clone(),
            Node::Literal(Literal::Null) => V::Null,
            Node::Literal(Literal::Bool(b)) => V::Bool(*b),
            Node::Literal(Literal::Int(i)) => V::Int(*i),
            Node::Literal(Literal::Str(s)) => V::Lit(s),
            Node::Path(base, keys) => {
                let mut value = self.node(base, input)?;
                for key in keys {
                    value = value.index(key)?;
                }
                value
            }
            Node::Array(items) => V::Array(Rc::new(
                items
                    .iter()
                    .map(|item| self.node(item, input))
                    .collect::<Option<_>>()?,
            )),
            Node::Object(entries) => {
                let mut map = BTreeMap::new();
                for (key, value) in entries {
                    map.insert(key.as_str(), self.node(value, input)?);
                }
                V::Object(Rc::new(map))
            }
            Node::Pipe(l, r) => {
                let l = self.node(l, input)?;
                self.node(r, &l)?
            }
            Node::Alt(l, r) => {
                let l = self.node(l, input)?;
                if l.truthy() { l } else { self.node(r, input)? }
            }
            Node::And(l, r) => {
                V::Bool(self.node(l, input)?.truthy() && self.node(r, input)?.truthy())
            }
            Node::Or(l, r) => {
                V::Bool(self.node(l, input)?.truthy() || self.node(r, input)?.truthy())
            }
            Node::Not => V::Bool(!input.truthy()),
            Node::Length => length(input)?,
            Node::Neg(inner) => match self.node(inner, input)?.scalar() {
                Scalar::Int(i) => V::Int(i.checked_neg()?),
                _ => return None,
            },
            Node::Math(op, l, r) => {
                let (l, r) = (self.node(l, input)?, self.node(r, input)?);
                self.arith(*op, l, r)?
            }
            Node::Cmp(cmp, l, r) => {
                let (l, r) = (self.node(l, input)?, self.node(r, input)?);
                V::Bool(compare(*cmp, order(l.scalar(), r.scalar())?))
            }
            Node::If(branches, otherwise) => {
                for (condition, then) in branches {
                    if self.node(condition, input)?.truthy() {
                        return self.node(then, input);
                    }
                }
                match otherwise {
                    Some(otherwise) => self.node(otherwise, input)?,
                    None => input.clone(),
                }
            }
        })
    }

    fn arith<'a>(&mut self, op: Arith, l: V<'a>, r: V<'a>) -> Option<V<'a>> {
        match (op, l.scalar(), r.scalar()) {
            (Arith::Add, Scalar::Null, _) => Some(r),
            (Arith::Add, _, Scalar::Null) => Some(l),
            (Arith::Add, Scalar::Int(a), Scalar::Int(b)) => a.checked_add(b).map(V::Int),
            (Arith::Sub, Scalar::Int(a), Scalar::Int(b)) => a.checked_sub(b).map(V::Int),
            (Arith::Mul, Scalar::Int(a), Scalar::Int(b)) => a.checked_mul(b).map(V::Int),
            (Arith::Add, Scalar::Str(a), Scalar::Str(b)) => {
                let len = a.len().checked_add(b.len())?;
                self.built_left = self.built_left.checked_sub(len)?;
                Some(V::Str(Rc::from([a, b].concat())))
            }
            _ => None,
        }
    }
}

/// jq's `length` (jaq-json's `Val::length`): 0 of `null`, the absolute
/// value of an integer, the characters of a string, the elements of an
/// array or object; `None` for the rest (a boolean fails, a float is left
/// to jaq).
fn length<'a>(value: &V<'a>) -> Option<V<'a>> {
    let count = |n: usize| i64::try_from(n).ok().map(V::Int);
    match value {
        V::Ref(Value::Array(items)) => count(items.len()),
        V::Array(items) => count(items.len()),
        V::Ref(Value::Object(map)) => count(map.len()),
        V::Object(map) => count(map.len()),
        other => match other.scalar() {
            Scalar::Null => Some(V::Int(0)),
            Scalar::Int(i) => i.checked_abs().map(V::Int),
            // A string longer than a result may be is left to jaq (in the
            // sandbox): counting it is work proportional to the state.
            Scalar::Str(s) if s.len() <= MAX_VALUE_BYTES => count(s.chars().count()),
            Scalar::Str(_) => None,
            Scalar::Bool(_) | Scalar::Other => None,
        },
    }
}

/// jq's order of two scalars of the types compared here (null < false <
/// true < numbers < strings); `None` for anything else.
fn order(l: Scalar<'_>, r: Scalar<'_>) -> Option<Ordering> {
    let rank = |s: &Scalar<'_>| match s {
        Scalar::Null => Some(0),
        Scalar::Bool(_) => Some(1),
        Scalar::Int(_) => Some(2),
        Scalar::Str(_) => Some(3),
        Scalar::Other => None,
    };
    // Strings longer than a result may be are left to jaq, as `length`.
    let long = |s: &Scalar<'_>| matches!(s, Scalar::Str(s) if s.len() > MAX_VALUE_BYTES);
    if long(&l) || long(&r) {
        return None;
    }
    let by_rank = rank(&l)?.cmp(&rank(&r)?);
    Some(match (l, r) {
        (Scalar::Bool(a), Scalar::Bool(b)) => a.cmp(&b),
        (Scalar::Int(a), Scalar::Int(b)) => a.cmp(&b),
        (Scalar::Str(a), Scalar::Str(b)) => a.as_bytes().cmp(b.as_bytes()),
        _ => by_rank,
    })
}

fn compare(cmp: Cmp, ordering: Ordering) -> bool {
    match cmp {
        Cmp::Eq => ordering.is_eq(),
        Cmp::Ne => ordering.is_ne(),
        Cmp::Lt => ordering.is_lt(),
        Cmp::Le => ordering.is_le(),
        Cmp::Gt => ordering.is_gt(),
        Cmp::Ge => ordering.is_ge(),
    }
}

// ---------------------------------------------------------------------
// The result as JSON, charged as jaq's results are (`val_to_json`).

/// Where a result is written, and what it may still use.
struct Out {
    /// Bytes of compact JSON left ([`MAX_VALUE_BYTES`] at first).
    left: usize,
    /// Whether to build the value, or only charge for it (a sizing pass:
    /// a result past the budget is declined before anything is
    /// allocated; a `serde_json` map of one entry takes some hundred
    /// bytes of memory for a few of JSON).
    build: bool,
}

impl Out {
    fn charge(&mut self, bytes: usize) -> Option<()> {
        charge(&mut self.left, bytes).ok()
    }

    /// Charge `s` as a JSON string; past the budget without reading all
    /// of a long string (its JSON is at least its bytes and two quotes).
    fn charge_str(&mut self, s: &str) -> Option<()> {
        if s.len().saturating_add(2) > self.left {
            return None;
        }
        self.charge(json_string_len(s))
    }

    /// `value` once charged `bytes` (`null` in a sizing pass).
    fn scalar(&mut self, bytes: usize, value: impl FnOnce() -> Value) -> Option<Value> {
        self.charge(bytes)?;
        Some(if self.build { value() } else { Value::Null })
    }

    fn string(&mut self, s: &str) -> Option<Value> {
        self.charge_str(s)?;
        Some(if self.build {
            Value::String(s.to_owned())
        } else {
            Value::Null
        })
    }
}

/// The value as JSON, sized first; `None` where jaq's conversion would
/// fail.
fn result_json(value: &V<'_>) -> Option<Value> {
    let mut sizing = Out {
        left: MAX_VALUE_BYTES,
        build: false,
    };
    materialize(value, 0, &mut sizing)?;
    let mut out = Out {
        left: MAX_VALUE_BYTES,
        build: true,
    };
    materialize(value, 0, &mut out)
}

fn materialize(value: &V<'_>, depth: usize, out: &mut Out) -> Option<Value> {
    match value {
        V::Ref(value) => copy(value, depth, out),
        V::Null => copy(&Value::Null, depth, out),
        V::Bool(b) => copy(&Value::Bool(*b), depth, out),
        V::Int(i) => copy(&Value::Number(Number::from(*i)), depth, out),
        V::Lit(s) => out.string(s),
        V::Str(s) => out.string(s),
        V::Array(items) => array(items, depth, out, materialize),
        V::Object(map) => object(map.iter().map(|(k, v)| (*k, v)), depth, out, materialize),
    }
}

/// A copy of a part of the state, charged as it is made, so a copy past
/// the budget stops early.
fn copy(value: &Value, depth: usize, out: &mut Out) -> Option<Value> {
    match value {
        Value::Null => out.scalar(4, || Value::Null),
        Value::Bool(b) => out.scalar(if *b { 4 } else { 5 }, || Value::Bool(*b)),
        Value::Number(n) => out.scalar(n.to_string().len(), || Value::Number(n.clone())),
        Value::String(s) => out.string(s),
        Value::Array(items) => array(items, depth, out, copy),
        Value::Object(map) => object(map.iter().map(|(k, v)| (k.as_str(), v)), depth, out, copy),
    }
}

/// An array of `items`, each converted by `each`, charged as `val_to_json`
/// charges one (brackets and commas first).
fn array<T>(
    items: &[T],
    depth: usize,
    out: &mut Out,
    each: fn(&T, usize, &mut Out) -> Option<Value>,
) -> Option<Value> {
    let depth = nested(depth)?;
    out.charge(items.len().max(1) + 1)?;
    if !out.build {
        for item in items {
            each(item, depth, out)?;
        }
        return Some(Value::Null);
    }
    items
        .iter()
        .map(|item| each(item, depth, out))
        .collect::<Option<_>>()
        .map(Value::Array)
}

/// An object of `entries`, each value converted by `each`, charged as
/// `val_to_json` charges one (punctuation first, then each key).
fn object<'e, T: 'e>(
    entries: impl ExactSizeIterator<Item = (&'e str, &'e T)>,
    depth: usize,
    out: &mut Out,
    each: fn(&T, usize, &mut Out) -> Option<Value>,
) -> Option<Value> {
    let depth = nested(depth)?;
    out.charge(object_punctuation(entries.len()))?;
    let mut map = Map::new();
    for (key, item) in entries {
        out.charge_str(key)?;
        let value = each(item, depth, out)?;
        if out.build {
            map.insert(key.to_owned(), value);
        }
    }
    Some(if out.build {
        Value::Object(map)
    } else {
        Value::Null
    })
}

/// Braces, commas and colons of an object of `len` entries.
fn object_punctuation(len: usize) -> usize {
    if len == 0 { 2 } else { 2 * len + 1 }
}

/// One level deeper, if jaq's results may nest that deep.
fn nested(depth: usize) -> Option<usize> {
    (depth < MAX_OUTPUT_DEPTH).then_some(depth + 1)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
