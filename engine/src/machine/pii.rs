//! PII redaction at the model boundary: an agent's `pii_redaction:` and a
//! tool's `pii_access:` (seed `abl-tools.md`, "PII access").
//!
//! An agent that redacts PII never sends its model provider the personal
//! data it finds: every message of the model's request (instructions, the
//! run's input, tool results, and the model's own earlier turns) has each
//! value replaced by a token, `[PII:<kind>:<n>]` (`[PII:email:1]`), before
//! the spec of the model call is written. The model works with tokens;
//! when it proposes a tool call whose arguments hold one, the token is put
//! back to the value at check 2, before the arguments are checked, only if
//! the tool's `pii_access` covers where the value came from:
//!
//! - a value of the agent's instructions or input (its `system` and `user`
//!   messages) needs `user` (or `original`);
//! - a value of another tool's result needs `tools` (or `original`);
//! - a value found in both places needs either.
//!
//! A call holding a token its tool may not receive, or a token the
//! conversation never issued, is refused (check `pii_access`), naming the
//! token and the level the tool lacks: a tool never acts on a token as if
//! it were the data. A tool with `llm` has its results sent to the model
//! as they are (its values get no token). The final answer has every token
//! put back: it goes to the run's own caller.
//!
//! What is recorded: the run's events keep the data as it came in (the run
//! input, results) and as the tool was called (restored arguments), as
//! they always do; the model's turns are recorded as the model wrote them,
//! with tokens. Only the model call's spec, which is what leaves for the
//! provider, is redacted.
//!
//! Tokens are numbered per kind in the order the values first appear in
//! the conversation, which only grows, so a value keeps its token for the
//! whole node, and the numbering is computed again from the transcript
//! whenever it is needed: nothing of it is stored, and replay computes the
//! same. A refusal or failure message (`error: …`) echoing a value already
//! known does not widen where that value came from.
//!
//! Detection (pattern, then a check digit where the format has one): e-mail
//! addresses; phone numbers in international form (`+`, 8 to 15 digits,
//! ITU-T E.164; national forms without `+` are not found); payment card
//! numbers (13 to 19 digits passing the Luhn check of ISO/IEC 7812, crate
//! `luhn`); IBANs (ISO 13616, checked per country and by mod 97, crate
//! `iban_validate`); US Social Security numbers (`AAA-GG-SSSS` without the
//! never-issued area 000, 666, 900-999, group 00 or serial 0000). A value
//! of no recognisable shape (a name, a street address) is not found: this
//! narrows what the provider sees, it does not guarantee nothing personal
//! passes.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::OnceLock;

use belay_proto::wire::{ChatMessage, ToolUse};
use regex::Regex;
use serde_json::Value;

use crate::definitions::model::{PiiAccess, PiiKind};

/// Where a value was seen in the conversation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Origins {
    /// In the agent's instructions or input (`system`, `user` messages).
    user: bool,
    /// In a tool's result.
    tools: bool,
}

/// One value found, with its token.
#[derive(Debug, Clone)]
struct Entry {
    value: String,
    token: String,
    origins: Origins,
}

/// Why a proposed call's arguments cannot be given back their data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The token names data whose origin the tool's `pii_access` does not
    /// cover.
    NotAllowed {
        /// The token as written, e.g. `[PII:email:1]`.
        token: String,
        /// The level the tool would need (`user`, `tools`, or `user` or
        /// `tools`).
        needs: &'static str,
    },
    /// The conversation never issued this token.
    Unknown {
        /// The token as written.
        token: String,
    },
}

impl Refusal {
    /// The reason given back to the model (and recorded in
    /// `tool_call_refused`), naming the tool.
    pub fn reason(&self, tool: &str) -> String {
        match self {
            Refusal::NotAllowed { token, needs } => format!(
                "the arguments hold {token}, personal data that tool `{tool}` may not receive (its `pii_access` lacks `{needs}`); nothing was sent. Call it without that value, or use a tool allowed to receive it"
            ),
            Refusal::Unknown { token } => format!(
                "the arguments hold {token}, which stands for no value of this conversation; nothing was sent. Use only the tokens you were given"
            ),
        }
    }
}

/// The values of one agent node's conversation and their tokens.
#[derive(Debug, Default)]
pub struct Redactor {
    kinds: Vec<PiiKind>,
    entries: Vec<Entry>,
    by_value: HashMap<String, usize>,
    by_token: HashMap<String, usize>,
    counts: BTreeMap<PiiKind, u32>,
}

/// How a message's values are learned.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Learn {
    /// New values get the origin, known ones gain it.
    From(Origins),
    /// New values get the origin, known ones keep theirs (a refusal or
    /// failure message, which may echo an argument).
    NewOnly(Origins),
}

impl Redactor {
    /// Reads `transcript` (an agent node's messages, in order) and numbers
    /// the values of `kinds` found in its `system` and `user` messages and
    /// in the results of tools for which `results_to_model(tool)` is false
    /// (tools with `pii_access: llm` answer true). The model's own turns
    /// add no value.
    pub fn from_transcript(
        transcript: &[ChatMessage],
        kinds: &[PiiKind],
        results_to_model: impl Fn(&str) -> bool,
    ) -> Redactor {
        let mut r = Redactor {
            kinds: kinds.to_vec(),
            ..Redactor::default()
        };
        let user = Origins {
            user: true,
            tools: false,
        };
        let tools = Origins {
            user: false,
            tools: true,
        };
        let names = tool_names(transcript);
        for message in transcript {
            match message {
                ChatMessage::System { content } | ChatMessage::User { content } => {
                    r.learn_text(content, Learn::From(user));
                }
                ChatMessage::Tool {
                    tool_call_id,
                    content,
                } => {
                    let tool = names.get(tool_call_id.as_str()).copied().unwrap_or("");
                    if results_to_model(tool) {
                        continue;
                    }
                    let learn = if content.starts_with("error:") {
                        Learn::NewOnly(tools)
                    } else {
                        Learn::From(tools)
                    };
                    r.learn_text(content, learn);
                }
                ChatMessage::Assistant { .. } => {}
            }
        }
        r
    }

    /// Whether no value was found.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `transcript` with every known value replaced by its token, except
    /// in the results of tools for which `results_to_model` is true.
    pub fn redact_messages(
        &self,
        transcript: &[ChatMessage],
        results_to_model: impl Fn(&str) -> bool,
    ) -> Vec<ChatMessage> {
        if self.is_empty() {
            return transcript.to_vec();
        }
        let names = tool_names(transcript);
        transcript
            .iter()
            .map(|m| match m {
                ChatMessage::System { content } => ChatMessage::System {
                    content: self.redact_text(content),
                },
                ChatMessage::User { content } => ChatMessage::User {
                    content: self.redact_text(content),
                },
                ChatMessage::Assistant {
                    content,
                    tool_calls,
                } => ChatMessage::Assistant {
                    content: content.as_deref().map(|c| self.redact_text(c)),
                    tool_calls: tool_calls
                        .iter()
                        .map(|t| ToolUse {
                            id: t.id.clone(),
                            name: t.name.clone(),
                            arguments: self.redact_text(&t.arguments),
                        })
                        .collect(),
                },
                ChatMessage::Tool {
                    tool_call_id,
                    content,
                } => {
                    let tool = names.get(tool_call_id.as_str()).copied().unwrap_or("");
                    ChatMessage::Tool {
                        tool_call_id: tool_call_id.clone(),
                        content: if results_to_model(tool) {
                            content.clone()
                        } else {
                            self.redact_text(content)
                        },
                    }
                }
            })
            .collect()
    }

    /// `arguments` (a tool call's JSON text) with each token put back, when
    /// `access` covers where its value came from; the first token it does
    /// not cover, or that was never issued, refuses the call.
    pub fn restore_arguments(&self, arguments: &str, access: PiiAccess) -> Result<String, Refusal> {
        let mut out = String::with_capacity(arguments.len());
        let mut last = 0;
        let Some(re) = token_regex() else {
            return Ok(arguments.to_owned());
        };
        for m in re.find_iter(arguments) {
            let token = m.as_str();
            let Some(entry) = self.by_token.get(token).map(|&i| &self.entries[i]) else {
                return Err(Refusal::Unknown {
                    token: token.to_owned(),
                });
            };
            let allowed =
                (entry.origins.user && access.user) || (entry.origins.tools && access.tools);
            if !allowed {
                let needs = match (entry.origins.user, entry.origins.tools) {
                    (true, true) => "user` or `tools",
                    (true, false) => "user",
                    _ => "tools",
                };
                return Err(Refusal::NotAllowed {
                    token: token.to_owned(),
                    needs,
                });
            }
            out.push_str(&arguments[last..m.start()]);
            out.push_str(&json_escaped(&entry.value));
            last = m.end();
        }
        out.push_str(&arguments[last..]);
        Ok(out)
    }

    /// `text` (a final answer) with every token this conversation issued
    /// put back; other text, unknown tokens included, is left as it is.
    pub fn restore_all(&self, text: &str) -> String {
        let Some(re) = token_regex() else {
            return text.to_owned();
        };
        re.replace_all(text, |c: &regex::Captures<'_>| {
            let token = c.get(0).map_or("", |m| m.as_str());
            match self.by_token.get(token) {
                Some(&i) => self.entries[i].value.clone(),
                None => token.to_owned(),
            }
        })
        .into_owned()
    }

    /// Learns the values of one message's text: JSON is searched string by
    /// string (so an escape such as `\n` is never read as part of a value),
    /// other text as it is.
    fn learn_text(&mut self, text: &str, learn: Learn) {
        match structured(text) {
            Some(value) => self.learn_value(&value, learn),
            None => self.learn_str(text, learn),
        }
    }

    fn learn_value(&mut self, value: &Value, learn: Learn) {
        match value {
            Value::String(s) => self.learn_str(s, learn),
            Value::Number(n) => self.learn_str(&n.to_string(), learn),
            Value::Array(items) => {
                for v in items {
                    self.learn_value(v, learn);
                }
            }
            Value::Object(map) => {
                for v in map.values() {
                    self.learn_value(v, learn);
                }
            }
            Value::Null | Value::Bool(_) => {}
        }
    }

    fn learn_str(&mut self, text: &str, learn: Learn) {
        for (range, kind) in find(text, &self.kinds) {
            let value = &text[range];
            match (self.by_value.get(value), learn) {
                (Some(&i), Learn::From(o)) => {
                    let e = &mut self.entries[i];
                    e.origins.user |= o.user;
                    e.origins.tools |= o.tools;
                }
                (Some(_), Learn::NewOnly(_)) => {}
                (None, Learn::From(o) | Learn::NewOnly(o)) => {
                    let n = self.counts.entry(kind).or_insert(0);
                    *n += 1;
                    let token = format!("[PII:{}:{n}]", kind.name());
                    let i = self.entries.len();
                    self.by_value.insert(value.to_owned(), i);
                    self.by_token.insert(token.clone(), i);
                    self.entries.push(Entry {
                        value: value.to_owned(),
                        token,
                        origins: o,
                    });
                }
            }
        }
    }

    /// `text` with known values replaced by their tokens (JSON string by
    /// string, re-serialized only when something changed).
    fn redact_text(&self, text: &str) -> String {
        if let Some(mut value) = structured(text) {
            if self.redact_value(&mut value) {
                return serde_json::to_string(&value).unwrap_or_else(|_| self.redact_str(text));
            }
            return text.to_owned();
        }
        self.redact_str(text)
    }

    fn redact_value(&self, value: &mut Value) -> bool {
        match value {
            Value::String(s) => {
                let redacted = self.redact_str(s);
                let changed = redacted != *s;
                *s = redacted;
                changed
            }
            Value::Number(n) => {
                let text = n.to_string();
                let redacted = self.redact_str(&text);
                if redacted == text {
                    return false;
                }
                *value = Value::String(redacted);
                true
            }
            Value::Array(items) => {
                // Every item, not only up to the first that changed.
                let mut changed = false;
                for v in items {
                    changed |= self.redact_value(v);
                }
                changed
            }
            Value::Object(map) => {
                let mut changed = false;
                for v in map.values_mut() {
                    changed |= self.redact_value(v);
                }
                changed
            }
            Value::Null | Value::Bool(_) => false,
        }
    }

    fn redact_str(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut last = 0;
        for (range, _) in find(text, &self.kinds) {
            let Some(&i) = self.by_value.get(&text[range.clone()]) else {
                continue;
            };
            out.push_str(&text[last..range.start]);
            out.push_str(&self.entries[i].token);
            last = range.end;
        }
        out.push_str(&text[last..]);
        out
    }

    /// The tokens issued, with their values (tests).
    #[cfg(test)]
    fn tokens(&self) -> Vec<(String, String)> {
        self.entries
            .iter()
            .map(|e| (e.token.clone(), e.value.clone()))
            .collect()
    }
}

/// A JSON object, array or string held in `text`, if it is one (a bare
/// number or literal is read as text: `4111111111111111` is a card number,
/// not the JSON number it also is).
fn structured(text: &str) -> Option<Value> {
    let t = text.trim_start();
    if !(t.starts_with('{') || t.starts_with('[') || t.starts_with('"')) {
        return None;
    }
    serde_json::from_str(text).ok()
}

/// Tool-use id → tool name, from the model's turns.
fn tool_names(transcript: &[ChatMessage]) -> HashMap<&str, &str> {
    transcript
        .iter()
        .flat_map(|m| match m {
            ChatMessage::Assistant { tool_calls, .. } => tool_calls.as_slice(),
            _ => &[],
        })
        .map(|t| (t.id.as_str(), t.name.as_str()))
        .collect()
}

/// `value` as it goes inside a JSON string.
fn json_escaped(value: &str) -> String {
    let quoted = serde_json::to_string(value).unwrap_or_default();
    quoted
        .strip_prefix('"')
        .and_then(|q| q.strip_suffix('"'))
        .unwrap_or(&quoted)
        .to_owned()
}

/// The pattern of a token; `None` only if the constant failed to compile
/// (no token is then found).
fn token_regex() -> Option<&'static Regex> {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    RE.get_or_init(|| Regex::new(r"\[PII:(?:email|phone|card|iban|ssn):[0-9]{1,9}\]").ok())
        .as_ref()
}

/// The pattern of each kind (the checks that follow are in [`find`]).
fn pattern(kind: PiiKind) -> Option<&'static Regex> {
    static RES: OnceLock<[Option<Regex>; 5]> = OnceLock::new();
    let res = RES.get_or_init(|| {
        [
            // The characters of RFC 5322's dot-atom local part (dots
            // anywhere: `a..b@` is not valid, but is still someone's
            // address as written) and a domain of labels ending in a
            // label of letters.
            r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]+@(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,63}",
            r"\+[1-9](?:[ -]?[0-9]){7,14}",
            r"[0-9](?:[ -]?[0-9])*",
            r"[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]){10,30}",
            r"[0-9]{3}-[0-9]{2}-[0-9]{4}",
        ]
        .map(|p| Regex::new(p).ok())
    });
    let i = match kind {
        PiiKind::Email => 0,
        PiiKind::Phone => 1,
        PiiKind::Card => 2,
        PiiKind::Iban => 3,
        PiiKind::Ssn => 4,
    };
    res[i].as_ref()
}

/// The values of `kinds` in `text`: byte ranges, in order, never
/// overlapping. Where candidates overlap, kinds with a check digit (card,
/// IBAN) and the strict SSN form win over e-mail and phone, and a phone
/// number then takes its longest form that overlaps nothing chosen
/// (`+1 555 0100 4111 1111 1111 1111` is a phone number and a card).
pub fn find(text: &str, kinds: &[PiiKind]) -> Vec<(Range<usize>, PiiKind)> {
    const PRIORITY: [PiiKind; 5] = [
        PiiKind::Card,
        PiiKind::Iban,
        PiiKind::Ssn,
        PiiKind::Email,
        PiiKind::Phone,
    ];
    let mut chosen: Vec<(Range<usize>, PiiKind)> = Vec::new();
    for kind in PRIORITY.into_iter().filter(|k| kinds.contains(k)) {
        let Some(re) = pattern(kind) else { continue };
        let mut at = 0;
        while let Some(m) = re.find_at(text, at) {
            let found = candidates(text, m.range(), kind);
            // An IBAN or phone pattern may run into the next value: go on
            // from the end of the longest form found (or the next
            // character, when none is).
            at = match kind {
                PiiKind::Iban | PiiKind::Phone => match found.first().and_then(|f| f.first()) {
                    Some(longest) => longest.end,
                    None => m.start() + text[m.start()..].chars().next().map_or(1, char::len_utf8),
                },
                _ => m.end(),
            };
            for alternatives in found {
                if let Some(range) = alternatives.into_iter().find(|r| {
                    chosen
                        .iter()
                        .all(|(c, _)| r.end <= c.start || c.end <= r.start)
                }) {
                    chosen.push((range, kind));
                }
            }
        }
    }
    chosen.sort_by_key(|(r, _)| r.start);
    chosen
}

/// The values of `kind` within one match of its pattern, after boundaries
/// and check digits: each inner list is one value's forms, longest first,
/// of which at most one is taken.
fn candidates(text: &str, range: Range<usize>, kind: PiiKind) -> Vec<Vec<Range<usize>>> {
    let before = text[..range.start].chars().next_back();
    let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
    let digit = |c: Option<char>| c.is_some_and(|c| c.is_ascii_digit());
    let value = &text[range.clone()];
    let after = text[range.end..].chars().next();
    match kind {
        PiiKind::Email => {
            // Not the tail of a longer word.
            if word(before) {
                return Vec::new();
            }
            vec![vec![range]]
        }
        PiiKind::Phone => {
            if word(before) {
                return Vec::new();
            }
            // Prefixes that end a group of digits, 8 to 15 digits long.
            let forms = group_ends(text, &range)
                .into_iter()
                .rev()
                .filter(|&end| {
                    let digits = text[range.start..end]
                        .chars()
                        .filter(char::is_ascii_digit)
                        .count();
                    (8..=15).contains(&digits)
                })
                .map(|end| range.start..end)
                .collect::<Vec<_>>();
            if forms.is_empty() {
                Vec::new()
            } else {
                vec![forms]
            }
        }
        PiiKind::Card => {
            if word(after) {
                return Vec::new();
            }
            // Spans of whole groups, 13 to 19 digits passing the Luhn
            // check; a span is not the tail of a word or of `+…`. Longest
            // first (then leftmost), each overlapping none taken before:
            // in `555 0100 4111 1111 1111 1111` the card is the 16 digits,
            // though `555 0100 4111 1111` passes the check too.
            let starts = group_starts(text, &range);
            let ends = group_ends(text, &range);
            let mut spans: Vec<(usize, Range<usize>)> = Vec::new();
            for (i, &start) in starts.iter().enumerate() {
                let lead = text[..start].chars().next_back();
                if i == 0 && (word(lead) || lead == Some('+')) {
                    continue;
                }
                for &end in ends.iter().filter(|&&e| e > start) {
                    let v = &text[start..end];
                    let n = v.chars().filter(char::is_ascii_digit).count();
                    if n > 19 {
                        break;
                    }
                    if n >= 13 && luhn::valid(v) {
                        spans.push((n, start..end));
                    }
                }
            }
            spans.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.start.cmp(&b.1.start)));
            let mut out: Vec<Vec<Range<usize>>> = Vec::new();
            for (_, span) in spans {
                if out
                    .iter()
                    .all(|r| span.end <= r[0].start || r[0].end <= span.start)
                {
                    out.push(vec![span]);
                }
            }
            out
        }
        PiiKind::Iban => {
            if word(before) {
                return Vec::new();
            }
            // The pattern may run into the next word (`… 00 TODAY`): the
            // prefixes that end a group and are an IBAN.
            let mut forms = Vec::new();
            let mut end = range.end;
            loop {
                let candidate = &text[range.start..end];
                let next = text[end..].chars().next();
                if !word(next)
                    && candidate
                        .parse::<iban::Iban>()
                        .or_else(|_| candidate.replace(' ', "").parse::<iban::Iban>())
                        .is_ok()
                {
                    forms.push(range.start..end);
                }
                match candidate.rfind(' ') {
                    Some(space) => end = range.start + space,
                    None => break,
                }
            }
            if forms.is_empty() {
                Vec::new()
            } else {
                vec![forms]
            }
        }
        PiiKind::Ssn => {
            if digit(before) || before == Some('-') || digit(after) || after == Some('-') {
                return Vec::new();
            }
            let mut parts = value.split('-');
            let (Some(area), Some(group), Some(serial)) =
                (parts.next(), parts.next(), parts.next())
            else {
                return Vec::new();
            };
            let issued = area != "000"
                && area != "666"
                && !area.starts_with('9')
                && group != "00"
                && serial != "0000";
            if issued {
                vec![vec![range]]
            } else {
                Vec::new()
            }
        }
    }
}

/// Where each group of digits of `range` starts (after `+` or a
/// separator).
fn group_starts(text: &str, range: &Range<usize>) -> Vec<usize> {
    let mut out = Vec::new();
    let mut prev: Option<char> = None;
    for (i, c) in text[range.clone()].char_indices() {
        if c.is_ascii_digit() && !prev.is_some_and(|p| p.is_ascii_digit()) {
            out.push(range.start + i);
        }
        prev = Some(c);
    }
    out
}

/// Where each group of digits of `range` ends (before a separator, or at
/// the end, which must not be followed by a digit).
fn group_ends(text: &str, range: &Range<usize>) -> Vec<usize> {
    let mut out = Vec::new();
    let part = &text[range.clone()];
    let mut chars = part.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let next = chars.peek().map(|(_, n)| *n);
        if c.is_ascii_digit() && !next.is_some_and(|n| n.is_ascii_digit()) {
            let end = range.start + i + c.len_utf8();
            let after = text[end..].chars().next();
            if !after.is_some_and(|a| a.is_ascii_digit()) {
                out.push(end);
            }
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn kinds_of(text: &str) -> Vec<(&str, PiiKind)> {
        find(text, &PiiKind::ALL)
            .into_iter()
            .map(|(r, k)| (&text[r], k))
            .collect()
    }

    #[test]
    fn each_kind_is_found_with_its_check() {
        assert_eq!(
            kinds_of("write to Ada.Lovelace+ml@example.co.uk, or call +44 20 7946 0958."),
            [
                ("Ada.Lovelace+ml@example.co.uk", PiiKind::Email),
                ("+44 20 7946 0958", PiiKind::Phone)
            ]
        );
        // Luhn: 4111 1111 1111 1111 passes, …1112 does not.
        assert_eq!(
            kinds_of("card 4111 1111 1111 1111, not 4111 1111 1111 1112"),
            [("4111 1111 1111 1111", PiiKind::Card)]
        );
        assert_eq!(
            kinds_of("IBAN DE89 3704 0044 0532 0130 00 TODAY; GB82WEST12345698765432"),
            [
                ("DE89 3704 0044 0532 0130 00", PiiKind::Iban),
                ("GB82WEST12345698765432", PiiKind::Iban)
            ]
        );
        // Values side by side: the card keeps its digits, the phone
        // number takes what is left.
        assert_eq!(
            kinds_of("+1 555 0100 4111 1111 1111 1111"),
            [
                ("+1 555 0100", PiiKind::Phone),
                ("4111 1111 1111 1111", PiiKind::Card)
            ]
        );
        // A wrong check digit is no IBAN.
        assert!(kinds_of("DE88 3704 0044 0532 0130 00").is_empty());
        assert_eq!(
            kinds_of("SSN 078-05-1120."),
            [("078-05-1120", PiiKind::Ssn)]
        );
        // Never issued: area 000, 666, 9xx; group 00; serial 0000.
        for never in [
            "000-12-3456",
            "666-12-3456",
            "912-12-3456",
            "123-00-4567",
            "123-45-0000",
        ] {
            assert!(kinds_of(never).is_empty(), "{never}");
        }
        // Dates, short numbers, order ids and versions are not PII.
        assert!(kinds_of("2026-11-30, order 12345678, v1.2.3, #42, 555-1234").is_empty());
    }

    #[test]
    fn only_the_kinds_asked_for_are_found() {
        let text = "ada@example.com 4111111111111111";
        assert_eq!(find(text, &[PiiKind::Card]).len(), 1);
        assert_eq!(find(text, &[PiiKind::Email]).len(), 1);
        assert!(find(text, &[PiiKind::Ssn]).is_empty());
    }

    fn user(text: &str) -> ChatMessage {
        ChatMessage::User {
            content: text.into(),
        }
    }

    fn call(id: &str, tool: &str, args: &str) -> ChatMessage {
        ChatMessage::Assistant {
            content: None,
            tool_calls: vec![ToolUse {
                id: id.into(),
                name: tool.into(),
                arguments: args.into(),
            }],
        }
    }

    fn result(id: &str, text: &str) -> ChatMessage {
        ChatMessage::Tool {
            tool_call_id: id.into(),
            content: text.into(),
        }
    }

    #[test]
    fn tokens_are_numbered_per_kind_in_order_and_stay_put() {
        let transcript = vec![
            ChatMessage::System {
                content: "You help ops@belay.dev.".into(),
            },
            user(r#"{"email":"ada@example.com","note":"line\nbob@example.com"}"#),
            call("c1", "lookup", r#"{"who":"[PII:email:2]"}"#),
            result(
                "c1",
                r#"{"phone":"+1 415 555 2671","email":"ada@example.com"}"#,
            ),
        ];
        let r = Redactor::from_transcript(&transcript, &PiiKind::ALL, |_| false);
        assert_eq!(
            r.tokens(),
            [
                ("[PII:email:1]".into(), "ops@belay.dev".into()),
                ("[PII:email:2]".into(), "ada@example.com".into()),
                // From inside a JSON string: the `\n` escape is not part of it.
                ("[PII:email:3]".into(), "bob@example.com".into()),
                ("[PII:phone:1]".into(), "+1 415 555 2671".into()),
            ]
        );
        let sent = r.redact_messages(&transcript, |_| false);
        let text = serde_json::to_string(&sent).unwrap();
        for value in [
            "ops@belay.dev",
            "ada@example.com",
            "bob@example.com",
            "415 555",
        ] {
            assert!(!text.contains(value), "{value} in {text}");
        }
        assert_eq!(
            sent[1],
            user(r#"{"email":"[PII:email:2]","note":"line\n[PII:email:3]"}"#)
        );
        // A longer conversation keeps the numbers.
        let mut longer = transcript.clone();
        longer.push(user("and carol@example.com"));
        let r2 = Redactor::from_transcript(&longer, &PiiKind::ALL, |_| false);
        assert_eq!(&r2.tokens()[..4], &r.tokens()[..]);
        assert_eq!(r2.tokens()[4].0, "[PII:email:4]");
    }

    #[test]
    fn arguments_get_their_data_back_only_where_access_covers_its_origin() {
        let transcript = vec![
            user("mail ada@example.com"),
            call("c1", "crm", "{}"),
            result("c1", r#"{"card":"4111 1111 1111 1111"}"#),
        ];
        let r = Redactor::from_transcript(&transcript, &PiiKind::ALL, |_| false);
        let args = r#"{"to":"[PII:email:1]","card":"[PII:card:1]"}"#;
        let all = PiiAccess {
            user: true,
            tools: true,
            llm: false,
        };
        assert_eq!(
            r.restore_arguments(args, all).unwrap(),
            r#"{"to":"ada@example.com","card":"4111 1111 1111 1111"}"#
        );
        let user_only = PiiAccess {
            user: true,
            ..PiiAccess::default()
        };
        assert_eq!(
            r.restore_arguments(args, user_only),
            Err(Refusal::NotAllowed {
                token: "[PII:card:1]".into(),
                needs: "tools"
            })
        );
        assert_eq!(
            r.restore_arguments(args, PiiAccess::default()),
            Err(Refusal::NotAllowed {
                token: "[PII:email:1]".into(),
                needs: "user"
            })
        );
        assert_eq!(
            r.restore_arguments(r#"{"to":"[PII:email:7]"}"#, all),
            Err(Refusal::Unknown {
                token: "[PII:email:7]".into()
            })
        );
        // No token: nothing to check.
        assert_eq!(
            r.restore_arguments(r#"{"to":"x"}"#, PiiAccess::default())
                .unwrap(),
            r#"{"to":"x"}"#
        );
        assert_eq!(
            r.restore_all("Sent to [PII:email:1]; [PII:ssn:1] is unknown."),
            "Sent to ada@example.com; [PII:ssn:1] is unknown."
        );
    }

    #[test]
    fn results_of_llm_tools_pass_as_they_are_and_errors_do_not_widen_origins() {
        let transcript = vec![
            user("for ada@example.com"),
            call("c1", "directory", "{}"),
            result("c1", "bob@example.com"),
            call("c2", "mailer", r#"{"to":"[PII:email:1]"}"#),
            result("c2", "error: ada@example.com bounced"),
        ];
        let llm = |tool: &str| tool == "directory";
        let r = Redactor::from_transcript(&transcript, &PiiKind::ALL, llm);
        assert_eq!(r.tokens().len(), 1);
        let sent = r.redact_messages(&transcript, llm);
        assert_eq!(sent[2], result("c1", "bob@example.com"));
        assert_eq!(sent[4], result("c2", "error: [PII:email:1] bounced"));
        // Still the user's only: a `tools` tool may not have it.
        assert!(
            r.restore_arguments(
                r#""[PII:email:1]""#,
                PiiAccess {
                    tools: true,
                    ..PiiAccess::default()
                }
            )
            .is_err()
        );
    }

    #[test]
    fn a_number_that_is_a_card_becomes_a_token_string() {
        let transcript = vec![user(r#"{"pan":4111111111111111,"qty":3}"#)];
        let r = Redactor::from_transcript(&transcript, &PiiKind::ALL, |_| false);
        assert_eq!(
            r.redact_messages(&transcript, |_| false)[0],
            user(r#"{"pan":"[PII:card:1]","qty":3}"#)
        );
        // Text that is a bare number is text.
        let bare = vec![user("4111111111111111")];
        let r = Redactor::from_transcript(&bare, &PiiKind::ALL, |_| false);
        assert_eq!(r.redact_messages(&bare, |_| false)[0], user("[PII:card:1]"));
    }

    mod props {
        use proptest::prelude::*;
        use proptest::test_runner::{Config, RngSeed};

        use super::*;

        /// Values of every kind that pass their checks.
        fn value() -> impl Strategy<Value = String> {
            prop_oneof![
                (
                    "[a-z][a-z0-9._]{0,8}[a-z0-9]",
                    "[a-z]{1,8}",
                    "(com|org|co\\.uk|dev)"
                )
                    .prop_map(|(l, d, t)| format!("{l}@{d}.{t}")),
                ("[1-9]", "[0-9]{9,12}").prop_map(|(c, n)| format!("+{c}{n}")),
                Just("4111 1111 1111 1111".to_owned()),
                Just("5500-0000-0000-0004".to_owned()),
                Just("DE89 3704 0044 0532 0130 00".to_owned()),
                Just("GB82WEST12345698765432".to_owned()),
                Just("078-05-1120".to_owned()),
            ]
        }

        /// Text: words, punctuation and values, the values recorded.
        fn text() -> impl Strategy<Value = (String, Vec<String>)> {
            proptest::collection::vec(
                prop_oneof![
                    "[a-zA-Z]{1,8}".prop_map(|w| (w, None)),
                    Just((", ".to_owned(), None)),
                    value().prop_map(|v| (v.clone(), Some(v))),
                ],
                0..12,
            )
            .prop_map(|parts| {
                let mut text = String::new();
                let mut values = Vec::new();
                for (part, value) in parts {
                    if !text.is_empty() {
                        text.push(' ');
                    }
                    text.push_str(&part);
                    values.extend(value);
                }
                (text, values)
            })
        }

        proptest! {
            #![proptest_config(Config {
                cases: 256,
                rng_seed: RngSeed::Fixed(0x00be_1a70_0011),
                failure_persistence: None,
                ..Config::default()
            })]

            /// No value of the text reaches the model's copy, and putting
            /// every token back gives the text again.
            #[test]
            fn redacted_text_holds_no_value_and_restores_exactly((text, values) in text()) {
                let transcript = vec![user(&text)];
                let r = Redactor::from_transcript(&transcript, &PiiKind::ALL, |_| false);
                let sent = r.redact_messages(&transcript, |_| false);
                let ChatMessage::User { content } = &sent[0] else {
                    return Err(TestCaseError::fail("not a user message"));
                };
                for v in &values {
                    prop_assert!(!content.contains(v.as_str()), "{v} in {content}");
                }
                prop_assert_eq!(r.restore_all(content), text);
            }
        }
    }
}
