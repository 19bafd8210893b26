//! jq expressions in workflow definitions: [`Expr`], one jq filter over the
//! run's state document, and [`Template`], a JSON value whose strings may
//! hold `${ <jq> }` expressions.
//!
//! The language is jq (the jq manual, <https://jqlang.org/manual/>) as
//! implemented by the jaq library (`jaq-core`, `jaq-std`, `jaq-json`; its
//! differences from jq are listed in jaq's manual,
//! <https://gedenkt.at/jaq/manual/>). Nothing here evaluates jq by itself.
//!
//! Determinism: the machine replays histories, so an expression must give
//! the same value for the same state every time. jq's functions that read
//! the clock, the environment, the time zone or an input stream, or that
//! write logs or stop the process, are removed ([`EXCLUDED`]); an
//! expression that names one is refused when it is parsed. jq has no
//! random-number function, and jaq adds none. The state's object keys
//! come in the order of `serde_json`'s map, sorted whatever order the
//! database stored them in (`keys_unsorted`, `to_entries` and `.[]` depend
//! on it): this holds while serde_json's `preserve_order` feature is off.
//!
//! # Bounded evaluation
//!
//! An expression is evaluated inside the engine's transition, under the
//! run's lock, so it must end. jaq (3.1) offers no fuel, step limit or
//! interruption hook: its evaluator is a tree of lazy iterators that
//! returns only when the value is there, and nothing outside can stop it.
//! So the bound comes from what an expression may say, plus counts kept
//! by the parts of the evaluation this module controls.
//!
//! Refused when parsed ([`ExprError::Unbounded`], with the position;
//! `guard.rs`), because each can run for ever:
//! - recursion: a `def` whose body calls itself, directly, through a
//!   `def` nested in it, or through a filter it passes on (jq resolves
//!   names lexically, so these are all the ways back into a definition);
//! - the library filters that loop until something happens: `repeat(f)`,
//!   `while(c; u)`, `until(c; u)`, `recurse(f)`, `recurse(f; c)` (plain
//!   `recurse` and `..` walk a finite value and stay), and
//!   `combinations`, whose count of values is exponential in its input;
//! - `range` with literal bounds that never end (a step of 0) or give more
//!   than [`MAX_RANGE_VALUES`] values;
//! - `*` that repeats a string (a string literal, an interpolation, a
//!   `@format` or a library filter that returns a string on one side)
//!   by anything but a number written in the expression, or by more than
//!   [`MAX_STRING_REPEAT`].
//!
//! Counted when evaluated: all the values `range` produces in one
//! evaluation, whatever its bounds ([`ExprError::RangeLimit`], even when
//! the expression catches the error it raises); the outputs, when there
//! is more than one ([`ExprError::ManyValues`], counting stops at 1000);
//! the value's size as compact JSON, counted while it is converted, so a
//! value whose JSON would dwarf its memory (one array shared many times)
//! stops early ([`ExprError::TooLarge`], [`MAX_VALUE_BYTES`]); its
//! nesting (100 levels, [`ExprError::NotJson`]). Each evaluation, and
//! each compilation, runs on a thread with an [`EVAL_STACK_BYTES`] stack:
//! jaq walks and drops nested values recursively (a 2 MiB stack overflows,
//! which aborts the process, at about 10 000 levels of a value), and its
//! parser recurses per level of the text's nesting (about 200 brackets in
//! a debug build), which [`MAX_EXPR_BYTES`] keeps within that stack.
//!
//! What this proves: without recursion, without those filters, and with
//! every `range` counted, each generator an expression can reach yields
//! finitely many values (`.[]`, `..`, `paths`, regular expressions walk
//! finite values; `limit`, `first`, `skip` only take from others), and a
//! call can only reach definitions written before it, so every
//! evaluation ends. What it does not prove is a small bound: a value can
//! still double (or square) at each step of a bounded loop or of a chain
//! written out, and jaq gives no place to count that.
//! `reduce range(40) as $i (2; . * .)` asks for 2^40 bits of integer and
//! aborts the process on a failed allocation; `reduce range(60) as $i
//! ("x"; . + .)`, `.s * .n` (a string repeated by a computed count that
//! the parser cannot see is one) and a long computed string repeated by a
//! literal count (up to [`MAX_STRING_REPEAT`] times its length) are the
//! same kind, and so is a chain of calls that doubles the work at each
//! level (`def f(g): g | g; f(f(f(...)))`) or loops nested over a large
//! array. Bounding those inside the evaluation needs size checks inside
//! every operation, i.e. a value type of our own around jaq's or a fuel
//! counter in jaq itself.
//!
//! # The sandbox
//!
//! What the rules above leave open is closed outside this module: a
//! process that calls `belay_engine::expr_sandbox::enable_sandbox` (every
//! binary that runs an engine does) sends each evaluation to a child
//! process with hard limits (memory, CPU time) and waits for it with a
//! deadline; a child that runs out of time or memory is killed and the
//! evaluation fails with [`ExprError::TimedOut`] or
//! [`ExprError::ResourceLimit`], so the run fails instead of the engine.
//! The child evaluates with the code of this module, every rule above
//! included. Compilation (and so every error with a position) stays in
//! the calling process: only compiled expressions are sent. Without the
//! sandbox (the engine crate's own tests, a program that did not enable
//! it), evaluation runs in this process as described above.
//!
//! # Direct evaluation
//!
//! Before either, an expression written in a small part of jq (paths of
//! literal keys, literals, `[…]`, `{…}`, `|`, `//`, `and`, `or`, `not`,
//! `length`, integer `+ - *`, string `+`, comparisons, `if`; at most 64
//! nodes) is evaluated straight over the state, in the calling process,
//! with no loop, generator or definition to run away and its allocations
//! charged (`direct.rs`, whose module doc proves the bound). It answers
//! only with the value jaq would give, checked against jaq over generated
//! expressions and states; anything else, every error included, goes on
//! to jaq (in the sandbox when it is enabled). Most expressions of
//! workflows (`.vars.n // 0`, `.vars.n < 10`, `{n: .vars.n}`) take this
//! path and cost a few microseconds instead of a round trip to an
//! evaluator process.
//!
//! Pure when evaluated in process: no I/O, no clock. With the sandbox,
//! [`Expr::eval`] and [`Template::render`] do process I/O behind the hook
//! installed by `expr_sandbox` (this module names no process, pipe or
//! clock); their results go into the run's events, so a replay folds the
//! values and never evaluates again. Compiled filters are shared between
//! expressions with the same text through a process-wide cache, which
//! changes how long a parse takes, never what an expression means.

use std::cell::Cell;
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::{Arc, LazyLock, Mutex, OnceLock, PoisonError, Weak};

use jaq_core::load::parse::Def;
use jaq_core::load::{self, Arena, File, Loader, lex, parse};
use jaq_core::native::Fun;
use jaq_core::{Ctx, Cv, Exn, Native, ValXs, Vars, compile, data};
use jaq_json::{Num, Val};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Number, Value};

mod direct;
mod guard;

/// jq functions (and the variable `$ENV`) that workflow expressions may not
/// use, with the reason an author is shown. Names that jq has and jaq
/// lacks are listed too, so that they get this message rather than
/// "not defined".
pub const EXCLUDED: &[(&str, &str)] = &[
    ("now", "it reads the clock"),
    ("localtime", "it depends on the machine's time zone"),
    ("strflocaltime", "it depends on the machine's time zone"),
    ("env", "it reads the process environment"),
    ("$ENV", "it reads the process environment"),
    ("input", "it reads the input stream"),
    ("inputs", "it reads the input stream"),
    ("input_filename", "it reads the input stream"),
    ("input_line_number", "it reads the input stream"),
    ("get_search_list", "it reads the module search path"),
    ("get_prog_origin", "it reads the file system"),
    ("get_jq_origin", "it reads the file system"),
    ("halt", "it stops the process"),
    (
        "halt_error",
        "it writes to standard error and stops the process",
    ),
    ("debug", "it writes to the log"),
    ("debug_empty", "it writes to the log"),
    ("stderr", "it writes to standard error"),
    ("stderr_empty", "it writes to standard error"),
];

/// Most outputs counted when an expression produces more than one.
const MAX_COUNTED_OUTPUTS: usize = 1000;

/// Most values `range` may produce in one evaluation, all its calls
/// together ([`ExprError::RangeLimit`]); literal bounds beyond it are
/// refused when parsed.
pub const MAX_RANGE_VALUES: u64 = 100_000;

/// Largest count by which `*` may repeat a string; it must be written as
/// a number in the expression.
pub const MAX_STRING_REPEAT: u64 = 1_000;

/// Largest value an expression may produce, in bytes of compact JSON
/// ([`ExprError::TooLarge`]). Values end up in events.
pub const MAX_VALUE_BYTES: usize = 1 << 20;

/// Longest expression (the text inside one `${ }`), in bytes. With
/// [`EVAL_STACK_BYTES`] it bounds the nesting jaq's parser and compiler
/// recurse through (16 000 nested `-` take about 170 MiB of stack in a
/// debug build).
pub const MAX_EXPR_BYTES: usize = 16 * 1024;

/// Stack of the thread an evaluation runs on. jaq drops and walks nested
/// values recursively, and a loop can nest a value one level per step
/// (`reduce range(20000) as $i (0; [.])` overflows a 2 MiB stack, which
/// aborts the process); this leaves room for a few hundred thousand.
/// Only the pages used are backed by memory; starting the thread costs
/// some tens of microseconds per evaluation (a template's expressions
/// share one).
#[doc(hidden)] // For `belay_engine::expr_sandbox` only.
pub const EVAL_STACK_BYTES: usize = 256 << 20;

/// Deepest array/object nesting of a value an expression may produce.
/// Values end up in events that are read back with `serde_json`, which
/// refuses documents nested deeper than 128; this leaves room for the
/// event around the value.
const MAX_OUTPUT_DEPTH: usize = 100;

/// Longest runtime error message kept, in characters. jaq quotes the
/// offending value in its messages, and a message ends up in an event.
const MAX_MESSAGE_CHARS: usize = 500;

/// Compiled filters kept alive after their last [`Expr`] is dropped, so
/// that a definition parsed again (every run deserializes its plan) does
/// not compile again. About 90 KB each: every filter carries its own copy
/// of the compiled jq standard library.
const RECENT_FILTERS: usize = 64;

/// Where in an expression (or, in a [`TemplateError`], in a string) a
/// problem is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// Byte offset, from 0.
    pub offset: usize,
    /// Line, from 1.
    pub line: u32,
    /// Column in characters (not bytes), from 1.
    pub column: u32,
}

impl Position {
    /// The position of byte `offset` in `text` (clamped to its length).
    fn at(text: &str, offset: usize) -> Position {
        let mut offset = offset.min(text.len());
        while !text.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &text[..offset];
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        Position {
            offset,
            line: count(before.matches('\n').count()).saturating_add(1),
            column: count(before[line_start..].chars().count()).saturating_add(1),
        }
    }

    /// The same place, counted from `start` bytes earlier in `whole`.
    fn shifted(self, whole: &str, start: usize) -> Position {
        Position::at(whole, start.saturating_add(self.offset))
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 1 {
            write!(f, "column {}", self.column)
        } else {
            write!(f, "line {}, column {}", self.line, self.column)
        }
    }
}

/// Why an expression was refused or failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExprError {
    /// Not valid jq: lexing or parsing failed, it names an undefined
    /// function or variable, it imports a module, or it is longer than
    /// [`MAX_EXPR_BYTES`].
    #[error("{position}: {message}")]
    Syntax {
        /// What is wrong.
        message: String,
        /// Where.
        position: Position,
    },
    /// It uses a construct that lets an evaluation run without end
    /// (recursion, `repeat`, `while`, `until`, `recurse(f)`,
    /// `combinations`, a literal `range` beyond [`MAX_RANGE_VALUES`], a
    /// string repeated by a computed count); see the module doc.
    #[error(
        "{position}: {message}; a workflow expression runs inside the engine's transition and must finish"
    )]
    Unbounded {
        /// What is refused and why.
        message: String,
        /// Where.
        position: Position,
    },
    /// It names a function excluded for determinism (see [`EXCLUDED`]).
    #[error(
        "{position}: `{name}` is not available in workflow expressions: {reason}, and an expression must give the same value whenever a run is replayed"
    )]
    Excluded {
        /// The function (or `$ENV`).
        name: String,
        /// Why it is excluded.
        reason: &'static str,
        /// Where it is named.
        position: Position,
    },
    /// jq raised an error while evaluating (jaq's message, or the value
    /// given to `error`).
    #[error("{message}")]
    Runtime {
        /// The message.
        message: String,
    },
    /// The expression produced no value (e.g. `empty`, or `select` that
    /// dropped its input).
    #[error("the expression produced no value")]
    NoValue,
    /// The expression produced several values where one is needed.
    #[error(
        "the expression produced {}{count} values; wrap it in [ ] to collect them",
        if *at_least { "at least " } else { "" }
    )]
    ManyValues {
        /// How many were counted.
        count: usize,
        /// Counting stopped early (at an error or a limit).
        at_least: bool,
    },
    /// `range` produced more than [`MAX_RANGE_VALUES`] values in one
    /// evaluation (reported even when the expression caught the error it
    /// raised).
    #[error("the expression asked `range` for more than {limit} values in one evaluation")]
    RangeLimit {
        /// The limit.
        limit: u64,
    },
    /// The value is larger than [`MAX_VALUE_BYTES`] as compact JSON.
    #[error("the expression's value is larger than {limit} bytes of JSON")]
    TooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// The value cannot be written as JSON (NaN, infinity, a byte string,
    /// a non-string object key, nesting deeper than 100).
    #[error("the expression's value is not JSON: {reason}")]
    NotJson {
        /// What part is not JSON.
        reason: String,
    },
    /// The evaluation did not end within the sandbox's deadline
    /// (`belay_engine::expr_sandbox::EVAL_DEADLINE_MS`): the evaluator process
    /// was killed.
    #[error(
        "the expression did not finish within {ms} ms and was stopped; a workflow expression runs inside the engine's transition and must finish quickly"
    )]
    TimedOut {
        /// The deadline, in milliseconds.
        ms: u64,
    },
    /// The evaluation needed more of a resource than the sandbox's
    /// evaluator process may use (`belay_engine::expr_sandbox::MEMORY_LIMIT_BYTES`
    /// of memory, `belay_engine::expr_sandbox::CPU_LIMIT_SECS` of CPU time): the
    /// process died of it.
    #[error(
        "the expression was stopped: its evaluation needed more than {limit}; a workflow expression must stay small"
    )]
    ResourceLimit {
        /// The limit it hit, in words (`1024 MiB of memory`).
        limit: String,
    },
    /// The sandbox could not evaluate the expression (its evaluator process
    /// did not start, or answered something it should not have).
    #[error("the expression could not be evaluated: {message}")]
    Sandbox {
        /// What went wrong.
        message: String,
    },
}

impl ExprError {
    /// The same error with its position counted from `start` bytes
    /// earlier in `whole` (an expression's place in a template string).
    fn shifted(self, whole: &str, start: usize) -> ExprError {
        match self {
            ExprError::Syntax { message, position } => ExprError::Syntax {
                message,
                position: position.shifted(whole, start),
            },
            ExprError::Excluded {
                name,
                reason,
                position,
            } => ExprError::Excluded {
                name,
                reason,
                position: position.shifted(whole, start),
            },
            ExprError::Unbounded { message, position } => ExprError::Unbounded {
                message,
                position: position.shifted(whole, start),
            },
            other => other,
        }
    }
}

/// A jq expression, checked when parsed and compiled once.
///
/// Serialized as its source text, e.g. `".nodes.intake.output.account_id"`.
/// Deserializing does not compile: a stored expression was checked when
/// its definition was registered, and is compiled on its first
/// [`Expr::eval`] (which reports a compile error should a jaq upgrade
/// refuse it). Equality compares source text.
#[derive(Clone)]
pub struct Expr {
    source: String,
    /// Boxed error: keeps `Expr` small in the definition types.
    compiled: OnceLock<Result<Arc<JqFilter>, Box<ExprError>>>,
}

impl Expr {
    /// Parse and compile jq source text (without `${ }`).
    ///
    /// Errors: [`ExprError::Syntax`] and [`ExprError::Excluded`], with the
    /// position within `source`.
    pub fn parse(source: &str) -> Result<Expr, ExprError> {
        let filter = filter_for(source)?;
        Ok(Expr {
            source: source.to_owned(),
            compiled: OnceLock::from(Ok(filter)),
        })
    }

    /// An expression that is compiled on first use (deserialization).
    fn unchecked(source: String) -> Expr {
        Expr {
            source,
            compiled: OnceLock::new(),
        }
    }

    /// The source text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Run the expression with `state` as its input (`.`).
    ///
    /// Exactly one output is required: none is [`ExprError::NoValue`],
    /// several are [`ExprError::ManyValues`]. A jq error is
    /// [`ExprError::Runtime`]; a value with no JSON form is
    /// [`ExprError::NotJson`]. A missing field is `null`, as in jq.
    ///
    /// An expression in the directly evaluated part of jq is evaluated
    /// here whatever the sandbox (module doc, "Direct evaluation").
    /// Otherwise, with the sandbox enabled (see the module doc), the
    /// expression is compiled here and evaluated in an evaluator process,
    /// which may also give [`ExprError::TimedOut`],
    /// [`ExprError::ResourceLimit`] or [`ExprError::Sandbox`].
    pub fn eval(&self, state: &Value) -> Result<Value, ExprError> {
        if let Some(value) = self.eval_direct(state) {
            return Ok(value);
        }
        match remote() {
            Some(remote) => {
                self.filter()?;
                remote(&[self.source.as_str()], state)
                    .into_iter()
                    .next()
                    .unwrap_or_else(|| Err(missing_outcome()))
            }
            None => on_eval_stack(|| self.eval_val(json_to_val(state))),
        }
    }

    /// The compiled filter (compiled now if it was not).
    fn filter(&self) -> Result<Arc<JqFilter>, ExprError> {
        self.compiled
            .get_or_init(|| filter_for(&self.source).map_err(Box::new))
            .clone()
            .map_err(|e| *e)
    }

    /// The value by direct evaluation (`direct.rs`), when the expression
    /// compiles and is in that part of jq: the value jaq would give.
    fn eval_direct(&self, state: &Value) -> Option<Value> {
        self.filter().ok()?.direct.as_ref()?.eval(state)
    }

    fn eval_val(&self, input: Val) -> Result<Value, ExprError> {
        let filter = self.filter()?;
        to_json(run_one(&filter, input)?)
    }
}

impl fmt::Debug for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Expr").field(&self.source).finish()
    }
}

impl PartialEq for Expr {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Eq for Expr {}

impl Serialize for Expr {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.source)
    }
}

impl<'de> Deserialize<'de> for Expr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Expr::unchecked)
    }
}

/// A problem with one string of a [`Template`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{error}", pointer_prefix(.pointer))]
pub struct TemplateError {
    /// JSON Pointer (RFC 6901) of the string within the template's value:
    /// `""` for the value itself, `/args/0` for an element, `/a~1b` for
    /// key `a/b`. `value.pointer(&e.pointer)` finds the string.
    pub pointer: String,
    /// Byte offset in that string where the expression's text starts
    /// (just after `${`).
    pub offset: usize,
    /// The error; positions in it count from the start of the string.
    pub error: ExprError,
}

fn pointer_prefix(pointer: &str) -> String {
    if pointer.is_empty() {
        String::new()
    } else {
        format!("{pointer}: ")
    }
}

/// A JSON value whose strings may hold `${ <jq> }` expressions over the
/// run's state document.
///
/// - A string that is exactly one `${ e }` (whitespace around it allowed)
///   becomes the value of `e`, of any JSON type.
/// - A string mixing text and `${ }` becomes a string, each value
///   interpolated: strings as they are, anything else as compact JSON.
/// - `$${` is a literal `${` (so a `$` just before an expression is
///   written `${ "$" }${ e }`); other `$` are literal.
/// - Arrays and objects are rendered element by element; object keys are
///   never templated.
///
/// The end of an expression is the first `}` that closes no `{` of the
/// expression, outside jq strings and `#` comments.
///
/// Serialized as the original JSON value. Deserializing splits the strings
/// again but compiles their expressions on first use, as [`Expr`] does.
/// Equality compares the original value.
#[derive(Clone)]
pub struct Template {
    source: Value,
    root: Node,
}

/// A template value, with constant parts folded.
#[derive(Debug, Clone)]
enum Node {
    /// No expression inside (escapes already applied).
    Const(Value),
    /// A string that is exactly one expression (boxed: keeps `Template`
    /// small in the definition types).
    Whole(Box<Located>),
    /// A string of text and expressions.
    Interp(Vec<Piece>),
    Array(Vec<Node>),
    Object(Vec<(String, Node)>),
}

#[derive(Debug, Clone)]
enum Piece {
    Text(String),
    Expr(Located),
}

/// An expression and where it is written, for errors.
#[derive(Debug, Clone)]
struct Located {
    expr: Expr,
    pointer: String,
    /// Byte offset of the expression text in its string.
    offset: usize,
    /// The whole string, to count error positions in.
    string: Arc<str>,
}

impl Located {
    fn eval(&self, input: &Val) -> Result<Value, TemplateError> {
        self.expr
            .eval_val(input.clone())
            .map_err(|error| self.error(error))
    }

    /// `error` of this expression, placed in its template.
    fn error(&self, error: ExprError) -> TemplateError {
        TemplateError {
            pointer: self.pointer.clone(),
            offset: self.offset,
            error: error.shifted(&self.string, self.offset),
        }
    }
}

impl Template {
    /// Split every string of `value` and compile every expression.
    ///
    /// Errors: one per bad expression (or unclosed `${`), in document
    /// order, each with the JSON Pointer of its string.
    pub fn parse(value: &Value) -> Result<Template, Vec<TemplateError>> {
        let mut errors = Vec::new();
        let root = build(value, &mut String::new(), true, &mut errors);
        if errors.is_empty() {
            Ok(Template {
                source: value.clone(),
                root,
            })
        } else {
            Err(errors)
        }
    }

    /// A template that renders to `value` as it is: no string of it is read
    /// as an expression. Its serialized form writes each `${` of its
    /// strings as `$${`, so that reading it back gives the same template.
    pub fn constant(value: Value) -> Template {
        Template {
            source: escape_value(&value),
            root: Node::Const(value),
        }
    }

    /// The value with every expression replaced by its result over `state`.
    ///
    /// The first failing expression's error is returned, with the pointer
    /// of its string. With the sandbox enabled, all the expressions of the
    /// template are evaluated in one request to an evaluator process (one
    /// deadline for them all), as [`Expr::eval`] describes.
    pub fn render(&self, state: &Value) -> Result<Value, TemplateError> {
        if let Some(values) = render_direct(&self.root, state) {
            let mut values = values.into_iter();
            return render_node(&self.root, &mut |l| {
                values.next().ok_or_else(|| l.error(missing_outcome()))
            });
        }
        match (&self.root, remote()) {
            (Node::Const(v), _) => Ok(v.clone()),
            (root, Some(remote)) => render_remote(root, state, remote),
            // Convert the state once for all the expressions.
            (root, None) => on_eval_stack(|| {
                let input = json_to_val(state);
                render_node(root, &mut |located| located.eval(&input))
            }),
        }
    }

    /// Whether the template holds no expression (rendering ignores the
    /// state).
    pub fn is_constant(&self) -> bool {
        matches!(self.root, Node::Const(_))
    }

    /// The JSON value it was parsed from, as serialized (for
    /// [`Template::constant`], the value with each `${` written `$${`).
    pub fn source(&self) -> &Value {
        &self.source
    }
}

impl fmt::Debug for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Template").field(&self.source).finish()
    }
}

impl PartialEq for Template {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Serialize for Template {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.source.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Template {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let source = Value::deserialize(deserializer)?;
        let mut errors = Vec::new();
        let root = build(&source, &mut String::new(), false, &mut errors);
        if errors.is_empty() {
            Ok(Template { source, root })
        } else {
            let list: Vec<String> = errors.iter().map(ToString::to_string).collect();
            Err(serde::de::Error::custom(format!(
                "invalid template: {}",
                list.join("; ")
            )))
        }
    }
}

/// Build the node for `value` at `pointer`; `check` compiles expressions
/// now (parse) rather than on first use (deserialize).
fn build(
    value: &Value,
    pointer: &mut String,
    check: bool,
    errors: &mut Vec<TemplateError>,
) -> Node {
    match value {
        Value::String(s) => build_string(s, pointer, check, errors),
        Value::Array(items) => {
            let nodes = items
                .iter()
                .enumerate()
                .map(|(i, item)| {
                    let len = pointer.len();
                    pointer.push('/');
                    pointer.push_str(&i.to_string());
                    let node = build(item, pointer, check, errors);
                    pointer.truncate(len);
                    node
                })
                .collect::<Vec<_>>();
            if nodes.iter().all(|n| matches!(n, Node::Const(_))) {
                Node::Const(Value::Array(nodes.into_iter().map(const_value).collect()))
            } else {
                Node::Array(nodes)
            }
        }
        Value::Object(map) => {
            let entries = map
                .iter()
                .map(|(key, item)| {
                    let len = pointer.len();
                    pointer.push('/');
                    pointer.push_str(&key.replace('~', "~0").replace('/', "~1"));
                    let node = build(item, pointer, check, errors);
                    pointer.truncate(len);
                    (key.clone(), node)
                })
                .collect::<Vec<_>>();
            if entries.iter().all(|(_, n)| matches!(n, Node::Const(_))) {
                Node::Const(Value::Object(
                    entries
                        .into_iter()
                        .map(|(k, n)| (k, const_value(n)))
                        .collect(),
                ))
            } else {
                Node::Object(entries)
            }
        }
        other => Node::Const(other.clone()),
    }
}

/// `value` with every `${` in its strings (not keys) written `$${`: the
/// template source of a constant. Splitting undoes it exactly, since every
/// `$` before a `{` gets a `$` of its own in front.
fn escape_value(value: &Value) -> Value {
    match value {
        Value::String(s) => Value::String(s.replace("${", "$${")),
        Value::Array(items) => Value::Array(items.iter().map(escape_value).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), escape_value(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn const_value(node: Node) -> Value {
    match node {
        Node::Const(v) => v,
        // Only called when every node is constant.
        _ => Value::Null,
    }
}

fn build_string(s: &str, pointer: &str, check: bool, errors: &mut Vec<TemplateError>) -> Node {
    let segments = match split(s) {
        Ok(segments) => segments,
        Err(start) => {
            errors.push(TemplateError {
                pointer: pointer.to_owned(),
                offset: start,
                error: ExprError::Syntax {
                    message: "`${` is not closed by a matching `}`".into(),
                    position: Position::at(s, start.saturating_sub(2)),
                },
            });
            return Node::Const(Value::String(s.to_owned()));
        }
    };
    let string: Arc<str> = Arc::from(s);
    let mut pieces = Vec::with_capacity(segments.len());
    for segment in segments {
        match segment {
            Segment::Text(text) => pieces.push(Piece::Text(text)),
            Segment::Expr { source, offset } => {
                let expr = if check {
                    match Expr::parse(source) {
                        Ok(expr) => expr,
                        Err(error) => {
                            errors.push(TemplateError {
                                pointer: pointer.to_owned(),
                                offset,
                                error: error.shifted(s, offset),
                            });
                            continue;
                        }
                    }
                } else {
                    Expr::unchecked(source.to_owned())
                };
                pieces.push(Piece::Expr(Located {
                    expr,
                    pointer: pointer.to_owned(),
                    offset,
                    string: Arc::clone(&string),
                }));
            }
        }
    }
    let exprs = pieces
        .iter()
        .filter(|p| matches!(p, Piece::Expr(_)))
        .count();
    let blank_text = pieces.iter().all(|p| match p {
        Piece::Text(t) => t.trim().is_empty(),
        Piece::Expr(_) => true,
    });
    if exprs == 0 {
        let text: String = pieces
            .into_iter()
            .map(|p| match p {
                Piece::Text(t) => t,
                Piece::Expr(_) => String::new(),
            })
            .collect();
        Node::Const(Value::String(text))
    } else if exprs == 1 && blank_text {
        match pieces.into_iter().find_map(|p| match p {
            Piece::Expr(located) => Some(located),
            Piece::Text(_) => None,
        }) {
            Some(located) => Node::Whole(Box::new(located)),
            None => Node::Const(Value::String(s.to_owned())),
        }
    } else {
        Node::Interp(pieces)
    }
}

/// Render `node`, taking each expression's value from `eval`, in document
/// order ([`collect_exprs`]'s order), stopping at the first error.
fn render_node(
    node: &Node,
    eval: &mut dyn FnMut(&Located) -> Result<Value, TemplateError>,
) -> Result<Value, TemplateError> {
    match node {
        Node::Const(v) => Ok(v.clone()),
        Node::Whole(located) => eval(located),
        Node::Interp(pieces) => {
            let mut out = String::new();
            for piece in pieces {
                match piece {
                    Piece::Text(text) => out.push_str(text),
                    Piece::Expr(located) => match eval(located)? {
                        Value::String(s) => out.push_str(&s),
                        other => out.push_str(&other.to_string()),
                    },
                }
            }
            Ok(Value::String(out))
        }
        Node::Array(nodes) => nodes
            .iter()
            .map(|n| render_node(n, eval))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
        Node::Object(entries) => entries
            .iter()
            .map(|(k, n)| Ok((k.clone(), render_node(n, eval)?)))
            .collect::<Result<Map<_, _>, _>>()
            .map(Value::Object),
    }
}

/// The expressions of `node`, in the order [`render_node`] evaluates them.
fn collect_exprs<'n>(node: &'n Node, out: &mut Vec<&'n Located>) {
    match node {
        Node::Const(_) => {}
        Node::Whole(located) => out.push(located),
        Node::Interp(pieces) => out.extend(pieces.iter().filter_map(|p| match p {
            Piece::Expr(located) => Some(located),
            Piece::Text(_) => None,
        })),
        Node::Array(nodes) => nodes.iter().for_each(|n| collect_exprs(n, out)),
        Node::Object(entries) => entries.iter().for_each(|(_, n)| collect_exprs(n, out)),
    }
}

/// The values of every expression of `node`, in [`render_node`]'s order,
/// when all are evaluated directly (`direct.rs`); `None` when one is not
/// (the template is then rendered as before, the direct ones evaluated
/// again: a template mixes the two rarely, and one request to the sandbox
/// keeps its single deadline).
fn render_direct(root: &Node, state: &Value) -> Option<Vec<Value>> {
    let mut located = Vec::new();
    collect_exprs(root, &mut located);
    located.iter().map(|l| l.expr.eval_direct(state)).collect()
}

/// [`Template::render`] through the sandbox: compile here (an expression
/// that does not compile fails as it would in process, and nothing after
/// it is evaluated), evaluate the rest in one request.
fn render_remote(root: &Node, state: &Value, remote: Remote) -> Result<Value, TemplateError> {
    let mut located = Vec::new();
    collect_exprs(root, &mut located);
    let compiled = located
        .iter()
        .take_while(|l| l.expr.filter().is_ok())
        .count();
    let sources: Vec<&str> = located[..compiled]
        .iter()
        .map(|l| l.expr.source())
        .collect();
    let mut outcomes = if sources.is_empty() {
        Vec::new()
    } else {
        remote(&sources, state)
    }
    .into_iter();
    render_node(root, &mut |l| {
        l.expr
            .filter()
            .and_then(|_| outcomes.next().unwrap_or_else(|| Err(missing_outcome())))
            .map_err(|error| l.error(error))
    })
}

/// A part of a template string.
#[derive(Debug, PartialEq)]
enum Segment<'s> {
    /// Literal text, escapes applied.
    Text(String),
    /// The text between `${` and its `}`, and its byte offset.
    Expr { source: &'s str, offset: usize },
}

/// Split a template string into text and expressions. Err: the byte
/// offset just after a `${` that is never closed.
fn split(s: &str) -> Result<Vec<Segment<'_>>, usize> {
    let mut segments = Vec::new();
    let mut text = String::new();
    let mut i = 0;
    while let Some(found) = s[i..].find('$') {
        let at = i + found;
        text.push_str(&s[i..at]);
        let rest = &s[at..];
        if rest.starts_with("$${") {
            text.push_str("${");
            i = at + 3;
        } else if rest.starts_with("${") {
            let start = at + 2;
            let len = closing_brace(&s[start..]).ok_or(start)?;
            if !text.is_empty() {
                segments.push(Segment::Text(std::mem::take(&mut text)));
            }
            segments.push(Segment::Expr {
                source: &s[start..start + len],
                offset: start,
            });
            i = start + len + 1;
        } else {
            text.push('$');
            i = at + 1;
        }
    }
    text.push_str(&s[i..]);
    if !text.is_empty() {
        segments.push(Segment::Text(text));
    }
    Ok(segments)
}

/// Byte index in `code` of the `}` that ends an expression starting at
/// its beginning: the first `}` that closes no bracket of the expression,
/// outside jq strings (including `\( )` inside them) and `#` comments.
/// Brackets that do not match are left for jaq to report.
fn closing_brace(code: &str) -> Option<usize> {
    #[derive(PartialEq)]
    enum Open {
        Bracket(u8),
        Interpolation,
    }
    let b = code.as_bytes();
    let mut open: Vec<Open> = Vec::new();
    let mut in_string = false;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if in_string {
            match c {
                b'\\' if b.get(i + 1) == Some(&b'(') => {
                    open.push(Open::Interpolation);
                    in_string = false;
                    i += 1;
                }
                // Skips the escaped byte; a multi-byte character's other
                // bytes are never ASCII, so they cannot be misread.
                b'\\' => i += 1,
                b'"' => in_string = false,
                _ => {}
            }
            i += 1;
            continue;
        }
        match c {
            b'"' => in_string = true,
            b'#' => {
                // A comment runs to the end of the line; as in jaq, a
                // line ending in an odd number of `\` continues it.
                loop {
                    let end = code[i..].find('\n').map_or(b.len(), |n| i + n);
                    let line = code[i..end].trim_end_matches('\r');
                    let backslashes = line.bytes().rev().take_while(|c| *c == b'\\').count();
                    i = end;
                    if backslashes % 2 == 0 || i >= b.len() {
                        break;
                    }
                    i += 1;
                }
                continue;
            }
            b'(' => open.push(Open::Bracket(b')')),
            b'[' => open.push(Open::Bracket(b']')),
            b'{' => open.push(Open::Bracket(b'}')),
            b')' | b']' | b'}' => match open.last() {
                Some(Open::Bracket(close)) if *close == c => {
                    open.pop();
                }
                Some(Open::Interpolation) if c == b')' => {
                    open.pop();
                    in_string = true;
                }
                // A `}` that closes no `{` of the expression ends it,
                // even with a `(` or `[` left open (jaq reports those).
                _ if c == b'}' && !open.contains(&Open::Bracket(b'}')) => return Some(i),
                _ => {}
            },
            _ => {}
        }
        i += 1;
    }
    None
}

// ---------------------------------------------------------------------
// jaq: compiling and running.

type D = data::JustLut<Val>;
/// A compiled expression: jaq's filter, and the same expression for
/// direct evaluation when it is in that part of jq (`direct.rs`).
struct JqFilter {
    jaq: jaq_core::Filter<D>,
    direct: Option<direct::Direct>,
}

fn excluded(name: &str) -> Option<&'static str> {
    EXCLUDED
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, reason)| *reason)
}

/// The jq standard library written in jq (`map`, `select`, ...), parsed
/// once, without the definitions of excluded functions.
fn prelude() -> &'static [Def<&'static str>] {
    static PRELUDE: OnceLock<Vec<Def<&'static str>>> = OnceLock::new();
    PRELUDE.get_or_init(|| {
        jaq_core::defs()
            .chain(jaq_std::defs())
            .chain(jaq_json::defs())
            .filter(|def| excluded(def.name).is_none())
            .collect()
    })
}

/// The functions implemented in Rust (`length`, `test`, ...), without the
/// excluded ones, and with `range` counted against the evaluation's
/// budget ([`counted_range`]).
fn natives() -> impl Iterator<Item = Fun<D>> {
    jaq_core::funs()
        .chain(jaq_std::funs())
        .chain(jaq_json::funs())
        .filter(|(name, _, _)| excluded(name).is_none())
        .map(|(name, args, f)| {
            if name == "range" {
                (name, args, Native::<D>::new(counted_range))
            } else {
                (name, args, f)
            }
        })
}

thread_local! {
    /// Values `range` may still produce in the evaluation running on this
    /// thread (reset by [`run_one`]).
    static RANGE_LEFT: Cell<u64> = const { Cell::new(MAX_RANGE_VALUES) };
    /// Whether the evaluation running on this thread ran out of it.
    static RANGE_EXHAUSTED: Cell<bool> = const { Cell::new(false) };
}

/// jaq's `range($from; $upto; $by)` (the other arities are defined with
/// it), with each value taken from the thread's budget. Out of budget, it
/// raises an error and stops; [`run_one`] then reports
/// [`ExprError::RangeLimit`] whatever the expression did with that error.
fn counted_range(mut cv: Cv<'_, D>) -> ValXs<'_, Val> {
    use std::cmp::Ordering;
    let by = cv.0.pop_var();
    let to = cv.0.pop_var();
    let from = cv.0.pop_var();
    let direction = by
        .partial_cmp(&Val::from(0_isize))
        .unwrap_or(Ordering::Equal);
    // As in jaq: the value, then the error of computing the next one (if
    // any), then nothing.
    let mut next: Option<Result<Val, Exn<'_, Val>>> = Some(Ok(from));
    Box::new(std::iter::from_fn(move || {
        let x = match next.take()? {
            Ok(x) => x,
            Err(e) => return Some(Err(e)),
        };
        let more = match direction {
            Ordering::Greater => x < to,
            Ordering::Less => x > to,
            Ordering::Equal => x != to,
        };
        if !more {
            return None;
        }
        let left = RANGE_LEFT.with(Cell::get);
        if left == 0 {
            RANGE_EXHAUSTED.with(|e| e.set(true));
            return Some(Err(Exn::from(jaq_core::Error::str(format!(
                "`range` produced more than {MAX_RANGE_VALUES} values in one evaluation"
            )))));
        }
        RANGE_LEFT.with(|l| l.set(left - 1));
        next = Some((x.clone() + by.clone()).map_err(Exn::from));
        Some(Ok(x))
    }))
}

/// Compiled filters by source text: the live ones (held by some [`Expr`])
/// and a few recent ones kept alive.
struct FilterCache {
    live: BTreeMap<String, Weak<JqFilter>>,
    recent: VecDeque<Arc<JqFilter>>,
    /// Size of `live` at which dropped entries are swept out.
    sweep_at: usize,
}

static CACHE: LazyLock<Mutex<FilterCache>> = LazyLock::new(|| {
    Mutex::new(FilterCache {
        live: BTreeMap::new(),
        recent: VecDeque::new(),
        sweep_at: 2 * RECENT_FILTERS,
    })
});

/// The compiled filter for `source`, from the cache or compiled now.
fn filter_for(source: &str) -> Result<Arc<JqFilter>, ExprError> {
    let cached = CACHE
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .live
        .get(source)
        .and_then(Weak::upgrade);
    if let Some(filter) = cached {
        return Ok(filter);
    }
    // Compile outside the lock; two threads may both compile the same
    // text, which costs time but not correctness. jaq's lexer, parser and
    // compiler recurse once per level of nesting (a 2 MiB stack overflows
    // at about 200 nested brackets in a debug build), so they get the
    // evaluation's stack, and the text is capped so that its nesting fits.
    if source.len() > MAX_EXPR_BYTES {
        return Err(ExprError::Syntax {
            message: format!(
                "the expression is {} bytes long, more than the {MAX_EXPR_BYTES} an expression may have",
                source.len()
            ),
            position: Position::at(source, MAX_EXPR_BYTES),
        });
    }
    let filter = Arc::new(on_eval_stack(|| compile_filter(source))?);
    let mut cache = CACHE.lock().unwrap_or_else(PoisonError::into_inner);
    if cache.live.len() >= cache.sweep_at {
        cache.live.retain(|_, f| f.strong_count() > 0);
        cache.sweep_at = (2 * cache.live.len()).max(2 * RECENT_FILTERS);
    }
    cache
        .live
        .insert(source.to_owned(), Arc::downgrade(&filter));
    if cache.recent.len() >= RECENT_FILTERS {
        cache.recent.pop_front();
    }
    cache.recent.push_back(Arc::clone(&filter));
    Ok(filter)
}

/// Covariance: a `'static` definition used where a shorter one is wanted.
fn shorten<'s>(def: Def<&'static str>) -> Def<&'s str> {
    def
}

/// Lex, parse and compile `source` with jaq.
fn compile_filter(source: &str) -> Result<JqFilter, ExprError> {
    let arena = Arena::default();
    let loader = Loader::new(prelude().iter().cloned().map(shorten));
    let modules = loader
        .load(
            &arena,
            File {
                code: source,
                path: (),
            },
        )
        .map_err(|errors| load_error(source, errors))?;
    let natives = natives().map(|(name, args, f)| -> (&str, _, _) { (name, args, f) });
    let filter = compile::Compiler::default()
        .with_funs(natives)
        .compile(modules)
        .map_err(|errors| compile_error(source, errors))?;
    // The loader accepted the text, so it parses; a `module` directive
    // (metadata) is the one thing the loader takes and a term does not.
    let term = load::parse(source, |p| p.term()).ok_or_else(|| ExprError::Syntax {
        message: "`module` directives are not available in workflow expressions".into(),
        position: Position::at(source, 0),
    })?;
    guard::check(source, &term)?;
    Ok(JqFilter {
        jaq: filter,
        direct: direct::Direct::build(&term),
    })
}

/// Byte offset of `part` in `whole`, when `part` is a slice of it.
fn offset_in(whole: &str, part: &str) -> Option<usize> {
    let offset = (part.as_ptr() as usize).checked_sub(whole.as_ptr() as usize)?;
    (offset <= whole.len()).then_some(offset)
}

/// A short quote of the text at an error.
fn quote(found: &str) -> String {
    let mut shown: String = found.chars().take(20).collect();
    if shown.len() < found.len() {
        shown.push('…');
    }
    format!("`{shown}`")
}

fn syntax(source: &str, at: &str, message: String) -> ExprError {
    ExprError::Syntax {
        message,
        position: Position::at(source, offset_in(source, at).unwrap_or(0)),
    }
}

fn load_error(source: &str, errors: load::Errors<&str, ()>) -> ExprError {
    let mut found: Vec<ExprError> = Vec::new();
    for (file, error) in errors {
        if offset_in(source, file.code).is_none() || file.code.len() != source.len() {
            found.push(ExprError::Syntax {
                message: format!("internal: jq's standard library failed to load: {error:?}"),
                position: Position::at(source, 0),
            });
            continue;
        }
        match error {
            load::Error::Lex(errors) => {
                found.extend(errors.into_iter().map(|(expect, rest)| {
                    let message = match expect {
                        lex::Expect::Digit => "expected a digit".to_owned(),
                        lex::Expect::Ident => "expected a name".to_owned(),
                        lex::Expect::Delim("\"") => "unterminated string: expected `\"`".to_owned(),
                        lex::Expect::Delim(open) => format!(
                            "`{open}` is not closed: expected `{}`",
                            match open {
                                "(" => ")",
                                "[" => "]",
                                _ => "}",
                            }
                        ),
                        lex::Expect::Escape => "invalid escape sequence in a string".to_owned(),
                        lex::Expect::Unicode => {
                            "invalid `\\u` escape: expected 4 hexadecimal digits".to_owned()
                        }
                        lex::Expect::Token => match rest.chars().next() {
                            Some(c) => format!("unexpected `{c}`"),
                            None => "unexpected end of the expression".to_owned(),
                        },
                        _ => format!("cannot read the expression at {}", quote(rest)),
                    };
                    syntax(source, rest, message)
                }));
            }
            load::Error::Parse(errors) => {
                found.extend(errors.into_iter().map(|(expect, at)| {
                    let expected = match &expect {
                        parse::Expect::Just(s) => format!("`{s}`"),
                        other => other.as_str().to_owned(),
                    };
                    let found = if at.is_empty() {
                        "the end of the expression".to_owned()
                    } else {
                        quote(at)
                    };
                    syntax(source, at, format!("expected {expected}, found {found}"))
                }));
            }
            load::Error::Io(errors) => {
                found.extend(errors.into_iter().map(|(path, _)| {
                    syntax(
                        source,
                        path,
                        "`include` and `import` are not available: expressions cannot load modules"
                            .to_owned(),
                    )
                }));
            }
        }
    }
    first_error(found)
}

fn compile_error(source: &str, errors: compile::Errors<&str, ()>) -> ExprError {
    let mut found: Vec<ExprError> = Vec::new();
    for (file, undefined) in errors {
        if offset_in(source, file.code).is_none() || file.code.len() != source.len() {
            found.push(ExprError::Syntax {
                message: format!(
                    "internal: jq's standard library failed to compile: {undefined:?}"
                ),
                position: Position::at(source, 0),
            });
            continue;
        }
        for (name, kind) in undefined {
            let position = Position::at(source, offset_in(source, name).unwrap_or(0));
            found.push(match excluded(name) {
                Some(reason) => ExprError::Excluded {
                    name: name.to_owned(),
                    reason,
                    position,
                },
                None => ExprError::Syntax {
                    message: match kind {
                        compile::Undefined::Filter(arity) => {
                            format!("`{name}/{arity}` is not defined")
                        }
                        other => format!("{} `{name}` is not defined", other.as_str()),
                    },
                    position,
                },
            });
        }
    }
    first_error(found)
}

/// The error that comes first in the expression.
fn first_error(errors: Vec<ExprError>) -> ExprError {
    errors
        .into_iter()
        .min_by_key(|e| match e {
            ExprError::Syntax { position, .. }
            | ExprError::Excluded { position, .. }
            | ExprError::Unbounded { position, .. } => position.offset,
            _ => 0,
        })
        .unwrap_or_else(|| ExprError::Syntax {
            message: "internal: jaq refused the expression without saying why".into(),
            position: Position {
                offset: 0,
                line: 1,
                column: 1,
            },
        })
}

// ---------------------------------------------------------------------
// Evaluating somewhere else: the sandbox's hook.

/// Evaluates compiled expressions outside this thread (the sandbox's
/// evaluator processes, `belay_engine::expr_sandbox`): given their sources, in
/// order, and the input, the outcome of each, in order, ending at the first
/// error (so fewer outcomes than sources only after an error).
#[doc(hidden)] // For `belay_engine::expr_sandbox` only.
pub type Remote = fn(&[&str], &Value) -> Vec<Result<Value, ExprError>>;

static REMOTE: OnceLock<Remote> = OnceLock::new();

/// Send every evaluation of this process to `remote` from now on. Set once;
/// false if it was set already.
#[doc(hidden)] // For `belay_engine::expr_sandbox` only.
pub fn set_remote(remote: Remote) -> bool {
    REMOTE.set(remote).is_ok()
}

/// Where evaluations go, when not to this process.
fn remote() -> Option<Remote> {
    REMOTE.get().copied()
}

fn missing_outcome() -> ExprError {
    ExprError::Sandbox {
        message: "the evaluator answered fewer values than it was asked for".into(),
    }
}

/// Evaluate `sources`, in order, over `input` on this thread, as one
/// request to the sandbox's evaluator is: `emit` gets each outcome, and
/// nothing after the first error. Each source is compiled (through the
/// cache) and evaluated with every rule of the module doc. Must run on a
/// thread with an [`EVAL_STACK_BYTES`] stack marked by
/// [`mark_eval_stack`].
#[doc(hidden)] // For `belay_engine::expr_sandbox` only.
pub fn eval_sources(
    sources: &[String],
    input: &Value,
    mut emit: impl FnMut(Result<Value, ExprError>),
) {
    let input = json_to_val(input);
    for source in sources {
        let outcome = filter_for(source)
            .and_then(|filter| run_one(&filter, input.clone()))
            .and_then(to_json);
        let failed = outcome.is_err();
        emit(outcome);
        if failed {
            break;
        }
    }
}

thread_local! {
    /// Whether this thread has an [`EVAL_STACK_BYTES`] stack (so
    /// [`on_eval_stack`] runs its function right here).
    static ON_EVAL_STACK: Cell<bool> = const { Cell::new(false) };
}

/// Record that the calling thread was started with an [`EVAL_STACK_BYTES`]
/// stack: evaluations and compilations run on it directly.
#[doc(hidden)] // For `belay_engine::expr_sandbox` only.
pub fn mark_eval_stack() {
    ON_EVAL_STACK.with(|on| on.set(true));
}

/// Run `f` on a thread of its own with an [`EVAL_STACK_BYTES`] stack, and
/// wait for it: an evaluation, or a compilation. jaq's values are not
/// `Send`, so `f` makes and drops them all on that thread. On such a
/// thread already (a compilation inside an evaluation, the sandbox's
/// evaluator), or should the thread not start, `f` runs here.
fn on_eval_stack<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    if ON_EVAL_STACK.with(Cell::get) {
        return f();
    }
    let slot = Mutex::new(Some(f));
    let take = || slot.lock().unwrap_or_else(PoisonError::into_inner).take();
    std::thread::scope(|scope| {
        let spawned = std::thread::Builder::new()
            .name("belay-jq".into())
            .stack_size(EVAL_STACK_BYTES)
            .spawn_scoped(scope, || {
                mark_eval_stack();
                take().map(|f| f())
            });
        let ran = match spawned {
            Ok(handle) => match handle.join() {
                Ok(ran) => ran,
                Err(panic) => std::panic::resume_unwind(panic),
            },
            Err(_) => None,
        };
        match ran {
            Some(value) => value,
            // Not started: `f` is still in the slot.
            None => match take() {
                Some(f) => f(),
                None => unreachable!("an evaluation ran and returned nothing"),
            },
        }
    })
}

/// Run `filter` on `input`; exactly one output is wanted, and `range`
/// may produce at most [`MAX_RANGE_VALUES`] values on the way.
fn run_one(filter: &JqFilter, input: Val) -> Result<Val, ExprError> {
    RANGE_LEFT.with(|l| l.set(MAX_RANGE_VALUES));
    RANGE_EXHAUSTED.with(|e| e.set(false));
    let result = run_outputs(filter, input);
    if RANGE_EXHAUSTED.with(Cell::get) {
        return Err(ExprError::RangeLimit {
            limit: MAX_RANGE_VALUES,
        });
    }
    result
}

fn run_outputs(filter: &JqFilter, input: Val) -> Result<Val, ExprError> {
    let ctx = Ctx::<D>::new(&filter.jaq.lut, Vars::new([]));
    let mut outputs = filter.jaq.id.run((ctx, input));
    let first = match outputs.next() {
        None => return Err(ExprError::NoValue),
        Some(output) => output.map_err(exn_error)?,
    };
    match outputs.next() {
        None => Ok(first),
        Some(Err(e)) => Err(exn_error(e)),
        Some(Ok(_)) => {
            let mut count = 2;
            let mut at_least = false;
            for output in outputs {
                if output.is_err() || count >= MAX_COUNTED_OUTPUTS {
                    at_least = true;
                    break;
                }
                count += 1;
            }
            Err(ExprError::ManyValues { count, at_least })
        }
    }
}

/// A jaq exception as an error. (`jaq_core::unwrap_valr` is not used: it
/// exits the process on `halt`.)
fn exn_error(exn: Exn<'_, Val>) -> ExprError {
    let message = match exn.get_err() {
        Ok(error) => match error.into_val() {
            Val::TStr(text) => String::from_utf8_lossy(&text).into_owned(),
            other => format!("{other} (not a string)"),
        },
        Err(other) => format!("evaluation stopped: {other:?}"),
    };
    ExprError::Runtime {
        message: truncate(message),
    }
}

fn truncate(message: String) -> String {
    if message.chars().count() <= MAX_MESSAGE_CHARS {
        return message;
    }
    let mut short: String = message.chars().take(MAX_MESSAGE_CHARS).collect();
    short.push('…');
    short
}

// ---------------------------------------------------------------------
// Values: serde_json <-> jaq.

/// `serde_json` to jaq. Integers stay integers (beyond `isize`, jaq's big
/// integers); other numbers are `f64`.
fn json_to_val(value: &Value) -> Val {
    match value {
        Value::Null => Val::Null,
        Value::Bool(b) => Val::Bool(*b),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Val::Num(Num::from_integral(i))
            } else if let Some(u) = n.as_u64() {
                Val::Num(Num::from_integral(u))
            } else {
                n.as_f64().map_or(Val::Null, Val::from)
            }
        }
        Value::String(s) => Val::from(s.clone()),
        Value::Array(items) => items.iter().map(json_to_val).collect(),
        Value::Object(map) => Val::obj(
            map.iter()
                .map(|(k, v)| (Val::from(k.clone()), json_to_val(v)))
                .collect(),
        ),
    }
}

/// jaq to `serde_json`: [`ExprError::NotJson`] for what has no JSON form,
/// [`ExprError::TooLarge`] past [`MAX_VALUE_BYTES`] of compact JSON.
fn to_json(value: Val) -> Result<Value, ExprError> {
    let mut left = MAX_VALUE_BYTES;
    val_to_json(value, 0, &mut left)
}

/// Take `bytes` from what the value may still use. Charged before
/// descending into an array or object, so a value whose JSON is far larger
/// than its memory (the same array shared many times over) stops early.
fn charge(left: &mut usize, bytes: usize) -> Result<(), ExprError> {
    if bytes > *left {
        return Err(ExprError::TooLarge {
            limit: MAX_VALUE_BYTES,
        });
    }
    *left -= bytes;
    Ok(())
}

/// Bytes of `s` as a JSON string, quotes and escapes included (as
/// `serde_json` writes it).
fn json_string_len(s: &str) -> usize {
    2 + s
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum::<usize>()
}

fn val_to_json(value: Val, depth: usize, left: &mut usize) -> Result<Value, ExprError> {
    let not_json = |reason: String| ExprError::NotJson { reason };
    let nested = |depth: usize| {
        if depth >= MAX_OUTPUT_DEPTH {
            Err(not_json(format!(
                "it is nested deeper than {MAX_OUTPUT_DEPTH} levels"
            )))
        } else {
            Ok(depth + 1)
        }
    };
    Ok(match value {
        Val::Null => {
            charge(left, 4)?;
            Value::Null
        }
        Val::Bool(b) => {
            charge(left, if b { 4 } else { 5 })?;
            Value::Bool(b)
        }
        Val::Num(n) => {
            let number = num_to_json(&n).map_err(not_json)?;
            charge(left, number.to_string().len())?;
            Value::Number(number)
        }
        Val::TStr(text) => {
            let text = String::from_utf8_lossy(&text).into_owned();
            charge(left, json_string_len(&text))?;
            Value::String(text)
        }
        Val::BStr(_) => {
            return Err(not_json(
                "a byte string (from `tobytes`) has no JSON form".into(),
            ));
        }
        Val::Arr(items) => {
            let depth = nested(depth)?;
            // Brackets and commas.
            charge(left, items.len().max(1) + 1)?;
            Value::Array(
                items
                    .iter()
                    .map(|item| val_to_json(item.clone(), depth, left))
                    .collect::<Result<_, _>>()?,
            )
        }
        Val::Obj(map) => {
            let depth = nested(depth)?;
            // Braces, commas and colons.
            charge(left, if map.is_empty() { 2 } else { 2 * map.len() + 1 })?;
            let mut out = Map::new();
            for (key, item) in map.iter() {
                let key = match key {
                    Val::TStr(text) => String::from_utf8_lossy(text).into_owned(),
                    other => return Err(not_json(format!("object key {other} is not a string"))),
                };
                charge(left, json_string_len(&key))?;
                out.insert(key, val_to_json(item.clone(), depth, left)?);
            }
            Value::Object(out)
        }
    })
}

/// A jaq number as JSON. jaq keeps integers (`Int`, `BigInt`) apart from
/// floats and decimal literals (`Dec`, the text of `1.5` in an expression);
/// floats stay floats (`1.0` is `1.0`, `4 / 2` is `2.0`). Integers beyond
/// `u64` become the nearest `f64`, as in jq.
fn num_to_json(n: &Num) -> Result<Number, String> {
    let float = |f: f64| {
        Number::from_f64(f).ok_or_else(|| {
            if f.is_nan() {
                "NaN is not a JSON number".to_owned()
            } else {
                format!(
                    "{} is not a JSON number",
                    if f > 0.0 { "infinity" } else { "-infinity" }
                )
            }
        })
    };
    match n {
        Num::Int(i) => i64::try_from(*i).map_or_else(|_| float(*i as f64), |i| Ok(Number::from(i))),
        Num::BigInt(big) => {
            let text = big.to_string();
            if let Ok(i) = text.parse::<i64>() {
                Ok(Number::from(i))
            } else if let Ok(u) = text.parse::<u64>() {
                Ok(Number::from(u))
            } else {
                float(text.parse::<f64>().unwrap_or(f64::NAN))
            }
        }
        Num::Float(f) => float(*f),
        Num::Dec(text) => float(text.parse::<f64>().unwrap_or(f64::NAN)),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
