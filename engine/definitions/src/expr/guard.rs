//! The parse-time half of the evaluation guard: refuses the jq constructs
//! that let an expression run without end (see the module doc of
//! [`super`], "Bounded evaluation", for the whole rule and its limits).
//!
//! The check walks jaq's syntax tree of the expression (`jaq_core::load::
//! parse::Term`), resolving each call the way jq does: to the innermost
//! definition or filter parameter of that name and arity in scope, else to
//! the standard library.

use jaq_core::load::lex::StrPart;
use jaq_core::load::parse::{BinaryOp, Pattern, Term};
use jaq_core::ops::Math;
use jaq_core::path::Part;

use super::{ExprError, MAX_RANGE_VALUES, MAX_STRING_REPEAT, Position};

/// Standard-library filters refused by name and arity, with the reason an
/// author is shown.
const UNBOUNDED_CALLS: &[(&str, usize, &str)] = &[
    (
        "repeat",
        1,
        "it produces values for ever, so the expression need never end",
    ),
    (
        "while",
        2,
        "it loops until a condition turns false, which need never happen",
    ),
    (
        "until",
        2,
        "it loops until a condition turns true, which need never happen",
    ),
    (
        "recurse",
        1,
        "it applies its filter again to every value it produced, which need never stop (`recurse` without arguments and `..` are allowed)",
    ),
    (
        "recurse",
        2,
        "it applies its filter again to every value it produced, which need never stop (`recurse` without arguments and `..` are allowed)",
    ),
    (
        "combinations",
        0,
        "the number of its values grows exponentially with its input",
    ),
    (
        "combinations",
        1,
        "the number of its values grows exponentially with its argument",
    ),
];

/// Standard-library filters whose value is a string (so that `*` next to
/// one of them repeats a string).
const STRING_FILTERS: &[&str] = &[
    "tostring",
    "tojson",
    "ascii_downcase",
    "ascii_upcase",
    "ltrimstr",
    "rtrimstr",
    "trim",
    "ltrim",
    "rtrim",
    "join",
    "implode",
    "todate",
    "todateiso8601",
    "strftime",
];

/// Check `term`, parsed from `source`: the first construct that could make
/// its evaluation unbounded, as [`ExprError::Unbounded`].
pub(super) fn check(source: &str, term: &Term<&str>) -> Result<(), ExprError> {
    Guard {
        source,
        scope: Vec::new(),
    }
    .term(term)
}

/// A name a call may resolve to before the standard library.
struct Entry<'s> {
    name: &'s str,
    arity: usize,
    /// A definition whose body is being checked: a call to it is recursion.
    defining: bool,
}

struct Guard<'a, 's> {
    source: &'a str,
    scope: Vec<Entry<'s>>,
}

impl<'s> Guard<'_, 's> {
    fn refuse(&self, at: Option<&str>, message: String) -> ExprError {
        let offset = at
            .and_then(|at| super::offset_in(self.source, at))
            .unwrap_or(0);
        ExprError::Unbounded {
            message,
            position: Position::at(self.source, offset),
        }
    }

    fn lookup(&self, name: &str, arity: usize) -> Option<&Entry<'s>> {
        self.scope
            .iter()
            .rev()
            .find(|e| e.name == name && e.arity == arity)
    }

    fn terms<'t>(
        &mut self,
        terms: impl IntoIterator<Item = &'t Term<&'s str>>,
    ) -> Result<(), ExprError>
    where
        's: 't,
    {
        terms.into_iter().try_for_each(|t| self.term(t))
    }

    fn term(&mut self, term: &Term<&'s str>) -> Result<(), ExprError> {
        match term {
            Term::Id | Term::Recurse | Term::Num(_) | Term::Var(_) | Term::Break(_) => Ok(()),
            Term::Str(format, parts) => {
                if let Some(format) = format {
                    self.call(format, &[])?;
                }
                for part in parts {
                    if let StrPart::Term(t) = part {
                        self.term(t)?;
                    }
                }
                Ok(())
            }
            Term::Arr(inner) => self.terms(inner.as_deref()),
            Term::Obj(entries) => {
                for (key, value) in entries {
                    self.term(key)?;
                    self.terms(value)?;
                }
                Ok(())
            }
            Term::Neg(t) => self.term(t),
            Term::BinOp(l, op, r) => {
                match op {
                    BinaryOp::Math(Math::Mul) | BinaryOp::UpdateMath(Math::Mul) => {
                        self.repetition(l, r)?;
                    }
                    BinaryOp::Pipe(Some(pattern)) => {
                        self.term(l)?;
                        self.pattern(pattern)?;
                        return self.term(r);
                    }
                    _ => {}
                }
                self.term(l)?;
                self.term(r)
            }
            Term::Label(_, body) => self.term(body),
            Term::Fold(_, xs, pattern, args) => {
                self.term(xs)?;
                self.pattern(pattern)?;
                self.terms(args)
            }
            Term::TryCatch(body, catch) => {
                self.term(body)?;
                self.terms(catch.as_deref())
            }
            Term::IfThenElse(branches, otherwise) => {
                for (cond, then) in branches {
                    self.term(cond)?;
                    self.term(then)?;
                }
                self.terms(otherwise.as_deref())
            }
            Term::Def(defs, body) => {
                let mark = self.scope.len();
                for def in defs {
                    let at = self.scope.len();
                    self.scope.push(Entry {
                        name: def.name,
                        arity: def.args.len(),
                        defining: true,
                    });
                    for arg in &def.args {
                        // `$x` binds a variable, which no call can reach;
                        // `f` binds a filter argument (arity 0).
                        if !arg.starts_with('$') {
                            self.scope.push(Entry {
                                name: arg,
                                arity: 0,
                                defining: false,
                            });
                        }
                    }
                    self.term(&def.body)?;
                    self.scope.truncate(at + 1);
                    if let Some(entry) = self.scope.last_mut() {
                        entry.defining = false;
                    }
                }
                self.term(body)?;
                self.scope.truncate(mark);
                Ok(())
            }
            Term::Call(name, args) => {
                self.call(name, args)?;
                self.terms(args)
            }
            Term::Path(head, path) => {
                self.term(head)?;
                for (part, _) in &path.0 {
                    match part {
                        Part::Index(i) => self.term(i)?,
                        Part::Range(from, to) => {
                            self.terms(from)?;
                            self.terms(to)?;
                        }
                    }
                }
                Ok(())
            }
        }
    }

    fn pattern(&mut self, pattern: &Pattern<&'s str>) -> Result<(), ExprError> {
        match pattern {
            Pattern::Var(_) => Ok(()),
            Pattern::Arr(items) => items.iter().try_for_each(|p| self.pattern(p)),
            Pattern::Obj(entries) => entries.iter().try_for_each(|(key, p)| {
                self.term(key)?;
                self.pattern(p)
            }),
        }
    }

    /// A call of `name` with `args`: recursion and unbounded library
    /// filters are refused.
    fn call(&mut self, name: &'s str, args: &[Term<&'s str>]) -> Result<(), ExprError> {
        if let Some(entry) = self.lookup(name, args.len()) {
            if entry.defining {
                return Err(self.refuse(
                    Some(name),
                    format!(
                        "`{name}` calls itself (directly or through a filter it passes on), and recursion is not available: it need never end"
                    ),
                ));
            }
            return Ok(());
        }
        if let Some((_, _, reason)) = UNBOUNDED_CALLS
            .iter()
            .find(|(n, arity, _)| *n == name && *arity == args.len())
        {
            return Err(self.refuse(
                Some(name),
                format!(
                    "`{name}/{}` is not available in workflow expressions: {reason}",
                    args.len()
                ),
            ));
        }
        if name == "range" {
            self.range(name, args)?;
        }
        Ok(())
    }

    /// `range` with literal bounds that produce more values than one
    /// evaluation may take, or that never end, is refused now; other
    /// bounds are counted when evaluated.
    fn range(&self, name: &'s str, args: &[Term<&'s str>]) -> Result<(), ExprError> {
        let literals: Option<Vec<f64>> = args.iter().map(number).collect();
        let Some(values) = literals else {
            return Ok(());
        };
        let (from, to, by) = match values.as_slice() {
            [to] => (0.0, *to, 1.0),
            [from, to] => (*from, *to, 1.0),
            [from, to, by] => (*from, *to, *by),
            _ => return Ok(()),
        };
        let count = if by == 0.0 {
            if from == to { 0.0 } else { f64::INFINITY }
        } else {
            ((to - from) / by).ceil().max(0.0)
        };
        if count.is_nan() || count > MAX_RANGE_VALUES as f64 {
            let message = if count.is_infinite() || count.is_nan() {
                "`range` with these bounds never ends".to_owned()
            } else {
                format!(
                    "`range` with these bounds produces {count} values, and one evaluation may take at most {MAX_RANGE_VALUES} from `range`"
                )
            };
            return Err(self.refuse(Some(name), message));
        }
        Ok(())
    }

    /// `l * r` where one side is a string repeats it: the count must be an
    /// integer literal of at most [`MAX_STRING_REPEAT`].
    fn repetition(&self, l: &Term<&'s str>, r: &Term<&'s str>) -> Result<(), ExprError> {
        for (text, count) in [(l, r), (r, l)] {
            if !self.is_string(text) {
                continue;
            }
            match number(count) {
                Some(n) if n <= MAX_STRING_REPEAT as f64 => {}
                _ => {
                    return Err(self.refuse(
                        first_text(count).or_else(|| first_text(text)),
                        format!(
                            "`*` repeats a string here, and the count must be a number written in the expression (at most {MAX_STRING_REPEAT}): a computed count could ask for any amount of memory"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether `term` is known to produce strings.
    fn is_string(&self, term: &Term<&'s str>) -> bool {
        match term {
            Term::Str(..) => true,
            Term::Call(name, args) => {
                self.lookup(name, args.len()).is_none()
                    && (name.starts_with('@') || STRING_FILTERS.contains(name))
            }
            Term::BinOp(_, BinaryOp::Pipe(_), r) => self.is_string(r),
            _ => false,
        }
    }
}

/// The value of a number literal (`3`, `-2`, `1e3`).
fn number(term: &Term<&str>) -> Option<f64> {
    match term {
        Term::Num(text) => text.parse().ok(),
        Term::Neg(inner) => number(inner).map(|n| -n),
        _ => None,
    }
}

/// The first piece of source text inside `term`, to point an error at.
fn first_text<'s>(term: &Term<&'s str>) -> Option<&'s str> {
    match term {
        Term::Num(s) | Term::Var(s) | Term::Break(s) | Term::Label(s, _) | Term::Call(s, _) => {
            Some(s)
        }
        Term::Str(format, parts) => format.or_else(|| {
            parts.iter().find_map(|p| match p {
                StrPart::Str(s) => Some(*s),
                StrPart::Term(t) => first_text(t),
                StrPart::Char(_) => None,
            })
        }),
        Term::Neg(t) => first_text(t),
        Term::Arr(inner) => inner.as_deref().and_then(first_text),
        Term::BinOp(l, _, r) => first_text(l).or_else(|| first_text(r)),
        Term::Path(head, path) => first_text(head).or_else(|| {
            path.0.iter().find_map(|(part, _)| match part {
                Part::Index(i) => first_text(i),
                Part::Range(from, to) => from
                    .as_ref()
                    .and_then(first_text)
                    .or_else(|| to.as_ref().and_then(first_text)),
            })
        }),
        Term::Fold(s, ..) => Some(s),
        _ => None,
    }
}
