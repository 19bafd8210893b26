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
//! - a value of the agent's instructions or input (its `system` and first
//!   `user` messages) needs `user` (or `original`);
//! - a value of another tool's result needs `tools` (or `original`);
//! - a value found in both places needs either.
//!
//! A call holding a token its tool may not receive, a token the
//! conversation never issued, or anything that looks like a token and is
//! not one exactly (`[PII:EMAIL:1]`, `PII:email:1`), is refused (check
//! `pii_access`), naming it: a tool never acts on a token as if it were
//! the data. A token that stood for a JSON number and fills a whole string
//! argument becomes that number again. A tool with `llm` has its results
//! sent to the model as they are (its values get no token). The final
//! answer has every token put back: it is the node's output, which goes to
//! the run's caller or the next node (an agent there sees the data unless
//! it redacts too). A refused final answer's message quotes the answer as
//! the engine read it, so its values are replaced by their tokens before it
//! enters the transcript.
//!
//! The table of tokens is durable: each model call that finds a new value,
//! or a new origin of a known one, first records `pii_tokens_issued` (the
//! entries that changed, values included, like every event that carries
//! the run's data), and the fold keeps the table in the node's state
//! (`NodeState::pii`). So a token means the same value for the whole node
//! visit, whatever the detector of a later engine version finds, and a
//! replay computes nothing. Check 2 and the final answer read the table
//! only. Values are numbered per kind in the order they are first found;
//! each model call rescans the transcript (linear in its length) with the
//! table as its start, and also replaces every recorded value wherever it
//! appears as a whole word.
//!
//! Detection (pattern, then a check digit where the format has one):
//! e-mail addresses (Latin letters allowed in the local part and domain);
//! phone numbers in international form (`+`, country code, 8 to 15 digits
//! in all, ITU-T E.164, with spaces, `-`, `.`, `/` or parentheses between
//! digits, at least 10 digits when written without separators; national
//! forms without `+` are not found); payment card numbers (13 to 19 digits
//! starting with 2 to 6, the major networks' first digits, passing the
//! Luhn check of ISO/IEC 7812, crate `luhn`, written as one number or in
//! the usual groups: fours, 4-6-5, 4-6-4; not all one digit); IBANs (ISO
//! 13616, either case, checked per country and by mod 97, crate
//! `iban_validate`); US Social Security numbers (`AAA-GG-SSSS` without the
//! never-issued area 000, 666, 900-999, group 00 or serial 0000). A value
//! of no recognisable shape (a name, a street address) is not found: this
//! narrows what the provider sees, it does not guarantee nothing personal
//! passes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::sync::OnceLock;

use belay_proto::wire::{ChatMessage, ToolUse};
use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use belay_definitions::model::{PiiAccess, PiiKind};

/// One value of an agent node's conversation and its token: an entry of
/// the table `pii_tokens_issued` records and `NodeState::pii` keeps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PiiEntry {
    /// `[PII:<kind>:<n>]`.
    pub token: String,
    /// The value as it was written.
    pub value: String,
    /// Seen in the agent's instructions or input.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub user: bool,
    /// Seen in a tool's result.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tools: bool,
    /// First seen as a JSON number (a token filling a whole string
    /// argument becomes the number again).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub numeric: bool,
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
    /// Text that is, or looks like, a token the conversation never issued.
    Unknown {
        /// The text as written.
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
                "the arguments hold `{token}`, which is not a token this conversation issued; nothing was sent. Copy tokens exactly as you were given them (`[PII:<kind>:<n>]`)"
            ),
        }
    }
}

/// The table of one agent node's values and tokens, with what learning
/// from the transcript changed.
#[derive(Debug, Default)]
pub struct Redactor {
    kinds: Vec<PiiKind>,
    entries: Vec<PiiEntry>,
    by_value: HashMap<String, usize>,
    by_token: HashMap<String, usize>,
    counts: BTreeMap<PiiKind, u32>,
    /// Entries added or given a new origin by [`Redactor::learn`].
    changed: BTreeSet<usize>,
}

/// Where a message's values come from, and whether known values gain it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Learn {
    /// The instructions or input: new values get `user`, known ones too.
    User,
    /// A tool's result: new values get `tools`, known ones too.
    Tools,
    /// A tool's refusal or failure (`error: …`), which may echo an
    /// argument: new values get `tools`, known ones keep their origins.
    ToolsNewOnly,
}

impl Redactor {
    /// The redactor of `table` (the node's recorded entries) for `kinds`.
    pub fn new(table: &[PiiEntry], kinds: &[PiiKind]) -> Redactor {
        let mut r = Redactor {
            kinds: kinds.to_vec(),
            ..Redactor::default()
        };
        for entry in table {
            if let Some((kind, n)) = parse_token(&entry.token) {
                let count = r.counts.entry(kind).or_insert(0);
                *count = (*count).max(n);
            }
            let i = r.entries.len();
            r.by_value.insert(entry.value.clone(), i);
            r.by_token.insert(entry.token.clone(), i);
            r.entries.push(entry.clone());
        }
        r
    }

    /// Learns the values of `transcript` (an agent node's messages, in
    /// order): its `system` and `user` messages, and the results of tools
    /// for which `results_to_model(tool)` is false (tools with `pii_access:
    /// llm` answer true). The model's own turns add no value. A message
    /// holding only tokens adds nothing.
    pub fn learn(&mut self, transcript: &[ChatMessage], results_to_model: impl Fn(&str) -> bool) {
        let mut names: HashMap<&str, &str> = HashMap::new();
        for message in transcript {
            match message {
                ChatMessage::System { content } | ChatMessage::User { content } => {
                    self.learn_text(content, Learn::User);
                }
                ChatMessage::Assistant { tool_calls, .. } => {
                    // A tool result answers the turn just before it: ids
                    // are unique within a turn only.
                    names = tool_calls
                        .iter()
                        .map(|t| (t.id.as_str(), t.name.as_str()))
                        .collect();
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
                        Learn::ToolsNewOnly
                    } else {
                        Learn::Tools
                    };
                    self.learn_text(content, learn);
                }
            }
        }
    }

    /// The entries [`Redactor::learn`] added or gave a new origin, for
    /// `pii_tokens_issued`.
    pub fn changed(&self) -> Vec<PiiEntry> {
        self.changed
            .iter()
            .filter_map(|&i| self.entries.get(i).cloned())
            .collect()
    }

    /// Whether the table is empty.
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
        let mut names: HashMap<&str, &str> = HashMap::new();
        let mut out = Vec::with_capacity(transcript.len());
        for m in transcript {
            out.push(match m {
                ChatMessage::System { content } => ChatMessage::System {
                    content: self.redact_text(content),
                },
                ChatMessage::User { content } => ChatMessage::User {
                    content: self.redact_text(content),
                },
                ChatMessage::Assistant {
                    content,
                    tool_calls,
                } => {
                    names = tool_calls
                        .iter()
                        .map(|t| (t.id.as_str(), t.name.as_str()))
                        .collect();
                    ChatMessage::Assistant {
                        content: content.as_deref().map(|c| self.redact_text(c)),
                        tool_calls: tool_calls
                            .iter()
                            .map(|t| ToolUse {
                                id: t.id.clone(),
                                name: t.name.clone(),
                                arguments: self.redact_text(&t.arguments),
                            })
                            .collect(),
                    }
                }
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
            });
        }
        out
    }

    /// `text` with known values replaced by their tokens. JSON (an object,
    /// array or string) is changed string by string and number by number,
    /// the rest of its text kept byte for byte.
    pub fn redact_text(&self, text: &str) -> String {
        if self.is_empty() {
            return text.to_owned();
        }
        if is_structured(text) {
            return map_json(text, |span, is_number| {
                if is_number {
                    let redacted = self.redact_str(span);
                    (redacted != span).then(|| quoted(&redacted))
                } else {
                    let inner: String = serde_json::from_str(span).ok()?;
                    let redacted = self.redact_str(&inner);
                    (redacted != inner).then(|| quoted(&redacted))
                }
            });
        }
        self.redact_str(text)
    }

    /// `arguments` (a tool call's JSON text) with each token put back, when
    /// `access` covers where its value came from; the first token it does
    /// not cover, or that was never issued, or text that looks like a token
    /// and is not one exactly, refuses the call. Text that is not JSON is
    /// returned as it is (check 2 refuses it).
    pub fn restore_arguments(&self, arguments: &str, access: PiiAccess) -> Result<String, Refusal> {
        let Ok(mut value) = serde_json::from_str::<Value>(arguments) else {
            return Ok(arguments.to_owned());
        };
        let mut changed = false;
        self.restore_value(&mut value, access, &mut changed)?;
        if !changed {
            return Ok(arguments.to_owned());
        }
        Ok(serde_json::to_string(&value).unwrap_or_else(|_| arguments.to_owned()))
    }

    fn restore_value(
        &self,
        value: &mut Value,
        access: PiiAccess,
        changed: &mut bool,
    ) -> Result<(), Refusal> {
        match value {
            Value::String(s) => {
                let Some(re) = loose_token_regex() else {
                    return Ok(());
                };
                if !re.is_match(s) {
                    return Ok(());
                }
                // A whole string that is one token of a number: the number.
                if let Some(entry) = self.by_token.get(s.as_str()).map(|&i| &self.entries[i])
                    && entry.numeric
                    && self.allowed(entry, access)?
                    && let Ok(n) = entry.value.parse::<serde_json::Number>()
                {
                    *value = Value::Number(n);
                    *changed = true;
                    return Ok(());
                }
                let mut out = String::with_capacity(s.len());
                let mut last = 0;
                for m in re.find_iter(s) {
                    let Some(entry) = self.by_token.get(m.as_str()).map(|&i| &self.entries[i])
                    else {
                        return Err(Refusal::Unknown {
                            token: m.as_str().to_owned(),
                        });
                    };
                    self.allowed(entry, access)?;
                    out.push_str(&s[last..m.start()]);
                    out.push_str(&entry.value);
                    last = m.end();
                }
                out.push_str(&s[last..]);
                *s = out;
                *changed = true;
                Ok(())
            }
            Value::Array(items) => items
                .iter_mut()
                .try_for_each(|v| self.restore_value(v, access, changed)),
            Value::Object(map) => map
                .values_mut()
                .try_for_each(|v| self.restore_value(v, access, changed)),
            Value::Null | Value::Bool(_) | Value::Number(_) => Ok(()),
        }
    }

    /// `Ok(true)` when `access` covers where `entry` came from.
    fn allowed(&self, entry: &PiiEntry, access: PiiAccess) -> Result<bool, Refusal> {
        if (entry.user && access.user) || (entry.tools && access.tools) {
            return Ok(true);
        }
        let needs = match (entry.user, entry.tools) {
            (true, true) => "user` or `tools",
            (true, false) => "user",
            _ => "tools",
        };
        Err(Refusal::NotAllowed {
            token: entry.token.clone(),
            needs,
        })
    }

    /// `text` (a final answer) with every token of the table put back;
    /// other text, unknown tokens included, is left as it is.
    pub fn restore_all(&self, text: &str) -> String {
        let Some(re) = loose_token_regex() else {
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

    /// Learns the values of one message's text (JSON string by string and
    /// number by number, so an escape such as `\n` is never read as part
    /// of a value).
    fn learn_text(&mut self, text: &str, learn: Learn) {
        if is_structured(text) {
            let mut spans: Vec<(String, bool)> = Vec::new();
            map_json(text, |span, is_number| {
                if is_number {
                    spans.push((span.to_owned(), true));
                } else if let Ok(inner) = serde_json::from_str::<String>(span) {
                    spans.push((inner, false));
                }
                None
            });
            for (s, numeric) in spans {
                self.learn_str(&s, learn, numeric);
            }
        } else {
            self.learn_str(text, learn, false);
        }
    }

    fn learn_str(&mut self, text: &str, learn: Learn, numeric: bool) {
        for (range, kind) in find(text, &self.kinds) {
            let value = &text[range.clone()];
            // A number counts as a number only when the value is all of it.
            let numeric = numeric && range.len() == text.len();
            match (self.by_value.get(value).copied(), learn) {
                (Some(_), Learn::ToolsNewOnly) => {}
                (Some(i), Learn::User | Learn::Tools) => {
                    let e = &mut self.entries[i];
                    let before = (e.user, e.tools);
                    e.user |= learn == Learn::User;
                    e.tools |= learn == Learn::Tools;
                    if before != (e.user, e.tools) {
                        self.changed.insert(i);
                    }
                }
                (None, _) => {
                    let n = self.counts.entry(kind).or_insert(0);
                    *n += 1;
                    let token = format!("[PII:{}:{n}]", kind.name());
                    let i = self.entries.len();
                    self.by_value.insert(value.to_owned(), i);
                    self.by_token.insert(token.clone(), i);
                    self.entries.push(PiiEntry {
                        token,
                        value: value.to_owned(),
                        user: learn == Learn::User,
                        tools: learn != Learn::User,
                        numeric,
                    });
                    self.changed.insert(i);
                }
            }
        }
    }

    /// `text` with known values replaced by their tokens: each value the
    /// detector finds, then each recorded value still present as a whole
    /// word (one a later detector would not find keeps its token).
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
        let mut by_length: Vec<&PiiEntry> = self
            .entries
            .iter()
            .filter(|e| !e.value.is_empty() && out.contains(e.value.as_str()))
            .collect();
        by_length.sort_by_key(|e| std::cmp::Reverse(e.value.len()));
        for entry in by_length {
            out = replace_whole(&out, &entry.value, &entry.token);
        }
        out
    }

    /// A redactor that learned `transcript` from an empty table (tests).
    #[cfg(test)]
    fn from_transcript(
        transcript: &[ChatMessage],
        kinds: &[PiiKind],
        results_to_model: impl Fn(&str) -> bool,
    ) -> Redactor {
        let mut r = Redactor::new(&[], kinds);
        r.learn(transcript, results_to_model);
        r
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

/// `text` with each occurrence of `value` that is a whole word (no ASCII
/// letter, digit or `_` right before or after) replaced by `token`.
fn replace_whole(text: &str, value: &str, token: &str) -> String {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    let mut from = 0;
    while let Some(at) = text[from..].find(value).map(|i| from + i) {
        let end = at + value.len();
        if edge(text[..at].chars().next_back()) || edge(text[end..].chars().next()) {
            from = at + text[at..].chars().next().map_or(1, char::len_utf8);
            continue;
        }
        out.push_str(&text[last..at]);
        out.push_str(token);
        last = end;
        from = end;
    }
    out.push_str(&text[last..]);
    out
}

/// `[PII:<kind>:<n>]` read back.
fn parse_token(token: &str) -> Option<(PiiKind, u32)> {
    let inner = token.strip_prefix("[PII:")?.strip_suffix(']')?;
    let (kind, n) = inner.split_once(':')?;
    Some((PiiKind::from_name(kind)?, n.parse().ok()?))
}

/// `s` as a JSON string literal.
fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""))
}

/// Whether `text` is a JSON object, array or string (a bare number or
/// literal is read as text: `4111111111111111` is a card number, not the
/// JSON number it also is).
fn is_structured(text: &str) -> bool {
    let t = text.trim_start();
    (t.starts_with('{') || t.starts_with('[') || t.starts_with('"'))
        && serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok()
}

/// Walks the string literals (quotes included) and numbers of `text`,
/// valid JSON, calling `f(span, is_number)`; each `Some(replacement)`
/// takes the span's place, every other byte is kept.
fn map_json(text: &str, mut f: impl FnMut(&str, bool) -> Option<String>) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    let mut i = 0;
    while i < bytes.len() {
        let (end, is_number) = match bytes[i] {
            b'"' => {
                // `"` and `\` never occur inside a UTF-8 sequence.
                let mut j = i + 1;
                while j < bytes.len() && bytes[j] != b'"' {
                    j += if bytes[j] == b'\\' { 2 } else { 1 };
                }
                (j.min(bytes.len() - 1) + 1, false)
            }
            b'-' | b'0'..=b'9' => {
                let mut j = i;
                while j < bytes.len()
                    && matches!(bytes[j], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
                {
                    j += 1;
                }
                (j, true)
            }
            _ => {
                i += 1;
                continue;
            }
        };
        if let Some(span) = text.get(i..end)
            && let Some(replacement) = f(span, is_number)
        {
            out.push_str(&text[last..i]);
            out.push_str(&replacement);
            last = end;
        }
        i = end;
    }
    out.push_str(&text[last..]);
    out
}

/// Text that is, or looks like, a token: `[PII:email:1]`, and what a model
/// may make of one (`[PII:EMAIL:1]`, `[ PII: email :1 ]`, `PII:email:1`).
/// Only an exact issued token is restored; the rest refuses a call.
/// `None` only if the constant failed to compile (nothing is then found).
fn loose_token_regex() -> Option<&'static Regex> {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"(?i)\[?[ \t]*\bpii[ \t]*:[ \t]*[a-z_\-]+[ \t]*:[ \t]*[0-9]+[ \t]*\]?").ok()
    })
    .as_ref()
}

/// The pattern of each kind (the checks that follow are in [`find`]).
fn pattern(kind: PiiKind) -> Option<&'static Regex> {
    static RES: OnceLock<[Option<Regex>; 5]> = OnceLock::new();
    let res = RES.get_or_init(|| {
        [
            // The characters of RFC 5322's dot-atom local part, and Latin
            // letters (RFC 6531) (dots anywhere: `a..b@` is not valid, but
            // is still someone's address as written), and a domain of
            // labels, Latin letters allowed (IDN), ending in a label of
            // ASCII letters.
            r"[A-Za-z0-9\x{00C0}-\x{024F}!#$%&'*+/=?^_`{|}~.-]+@(?:[A-Za-z0-9\x{00C0}-\x{024F}](?:[A-Za-z0-9\x{00C0}-\x{024F}-]{0,61}[A-Za-z0-9\x{00C0}-\x{024F}])?\.)+[A-Za-z]{2,63}",
            // Up to three separators between digits: `+1 (415) 555-2671`,
            // `+44 (0)20 7946 0958`, `+33.1.23.45.67.89`.
            r"\+[1-9](?:[ \-./()\x{00A0}]{0,3}[0-9]){7,14}",
            r"[0-9](?:[ \-./_\x{00A0}]{0,2}[0-9])*",
            r"[A-Za-z]{2}[0-9]{2}(?:[ \-]{0,2}[A-Za-z0-9]){10,30}",
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
    // ASCII only: text in scripts without spaces between words (`連絡先は
    // ada@example.comです`) puts letters right against a value.
    let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
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
                    let form = &text[range.start + 1..end];
                    let digits = form.chars().filter(char::is_ascii_digit).count();
                    // `+12500000` in `balance +12500000` is an amount: a
                    // number written without separators needs 10 digits.
                    let grouped = digits < form.chars().count();
                    (8..=15).contains(&digits) && (grouped || digits >= 10)
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
                // Ends are in order: from the first after `start`, until
                // past 19 digits (linear in the run's length).
                let first = ends.partition_point(|&e| e <= start);
                for &end in &ends[first..] {
                    let v = &text[start..end];
                    let n = v.chars().filter(char::is_ascii_digit).count();
                    if n > 19 {
                        break;
                    }
                    if n >= 13 && card_shaped(v) && luhn::valid(v) {
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
                        .to_ascii_uppercase()
                        .replace([' ', '-'], "")
                        .parse::<iban::Iban>()
                        .is_ok()
                {
                    forms.push(range.start..end);
                }
                match candidate.rfind([' ', '-']) {
                    // Before the separators (`00  DE` has two).
                    Some(space) => {
                        end = range.start + candidate[..space].trim_end_matches([' ', '-']).len();
                    }
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

/// Whether `v` (digits and separators, 13 to 19 digits) is written like a
/// card number: one number, or groups of four (the last 1 to 4 digits),
/// or 4-6-5 / 4-6-4; starting with 2 to 6 (the major networks' first
/// digits, so millisecond timestamps, `1…`, are not cards), and not all
/// one digit.
fn card_shaped(v: &str) -> bool {
    let groups: Vec<usize> = v
        .split(|c: char| !c.is_ascii_digit())
        .filter(|g| !g.is_empty())
        .map(str::len)
        .collect();
    let grouping = match groups.as_slice() {
        [_] => true,
        [4, 6, 5] | [4, 6, 4] => true,
        [init @ .., last] => {
            init.len() >= 3 && init.iter().all(|&g| g == 4) && (1..=4).contains(last)
        }
        [] => false,
    };
    let mut digits = v.chars().filter(char::is_ascii_digit);
    let first = digits.next();
    grouping && first.is_some_and(|d| ('2'..='6').contains(&d)) && !digits.all(|d| Some(d) == first)
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
    fn values_against_other_scripts_and_with_latin_letters_are_found() {
        // No spaces between words in Japanese: the values still count.
        assert_eq!(
            kinds_of("連絡先はada@example.comです、電話+81 3 1234 5678まで"),
            [
                ("ada@example.com", PiiKind::Email),
                ("+81 3 1234 5678", PiiKind::Phone)
            ]
        );
        assert_eq!(
            kinds_of("カード番号は4111111111111111です、口座DE89370400440532013000へ"),
            [
                ("4111111111111111", PiiKind::Card),
                ("DE89370400440532013000", PiiKind::Iban)
            ]
        );
        assert_eq!(
            kinds_of("Zoë.smith@example.com, josé@exämple.com"),
            [
                ("Zoë.smith@example.com", PiiKind::Email),
                ("josé@exämple.com", PiiKind::Email)
            ]
        );
    }

    #[test]
    fn common_ways_of_writing_phones_cards_and_ibans_are_found() {
        for phone in [
            "+1 (415) 555-2671",
            "+44 (0)20 7946 0958",
            "+33.1.23.45.67.89",
            "+1.415.555.2671",
            "+49/30/1234567",
            "+1\u{a0}415\u{a0}555\u{a0}2671",
            "+14155552671",
        ] {
            assert_eq!(kinds_of(phone), [(phone, PiiKind::Phone)], "{phone}");
        }
        for card in [
            "4111.1111.1111.1111",
            "4111/1111/1111/1111",
            "4111  1111  1111  1111",
            "3782 822463 10005",
        ] {
            assert_eq!(kinds_of(card), [(card, PiiKind::Card)], "{card}");
        }
        for iban in [
            "de89370400440532013000",
            "de89 3704 0044 0532 0130 00",
            "DE89-3704-0044-0532-0130-00",
            "DE89  3704  0044  0532  0130  00",
        ] {
            assert_eq!(kinds_of(iban), [(iban, PiiKind::Iban)], "{iban}");
        }
    }

    #[test]
    fn ordinary_numbers_are_not_taken_for_personal_data() {
        for text in [
            "0 0 0 0 0 0 0 0 0 0 0 0 0",
            "0000 0000 0000 0000",
            "4444 4444 4444 4444",
            "at 1764518400000 ms",
            "2026-04-20 2026-12-03",
            "balance change +12500000",
            "delta +100000000 bytes",
            "550e8400-e29b-41d4-a716-446655440000",
            "version 10.4.12, 192.168.10.200",
        ] {
            assert!(kinds_of(text).is_empty(), "{text}: {:?}", kinds_of(text));
        }
    }

    #[test]
    fn a_long_run_of_digits_is_searched_in_linear_time() {
        // 200 000 one-digit groups: quadratic would take minutes.
        let text = "7 ".repeat(200_000);
        assert!(kinds_of(&text).is_empty());
    }

    #[test]
    fn json_is_redacted_in_place_and_numbers_keep_their_precision() {
        let transcript = vec![user(
            r#"{"order": 123456789012345678901234567890, "email": "ada@example.com", "pan": 4111111111111111}"#,
        )];
        let r = Redactor::from_transcript(&transcript, &PiiKind::ALL, |_| false);
        assert_eq!(
            r.redact_messages(&transcript, |_| false)[0],
            user(
                r#"{"order": 123456789012345678901234567890, "email": "[PII:email:1]", "pan": "[PII:card:1]"}"#
            )
        );
        // A token of a number that fills a string argument is the number.
        let all = PiiAccess {
            user: true,
            tools: true,
            llm: false,
        };
        assert_eq!(
            serde_json::from_str::<Value>(
                &r.restore_arguments(r#"{"pan":"[PII:card:1]","note":"card [PII:card:1]"}"#, all)
                    .unwrap()
            )
            .unwrap(),
            serde_json::json!({"pan": 4111111111111111u64, "note": "card 4111111111111111"})
        );
    }

    #[test]
    fn anything_like_a_token_that_is_not_one_is_refused() {
        let transcript = vec![user("ada@example.com")];
        let r = Redactor::from_transcript(&transcript, &PiiKind::ALL, |_| false);
        let all = PiiAccess {
            user: true,
            tools: true,
            llm: false,
        };
        for altered in [
            r#""[PII:EMAIL:1]""#,
            r#""[PII:Email:1]""#,
            r#""[PII: email:1]""#,
            r#""PII:email:1""#,
            r#""[PII:email:99999999999]""#,
            r#""[PII:email:01]""#,
            r#""[PII:e-mail:1]""#,
        ] {
            assert!(
                matches!(
                    r.restore_arguments(altered, all),
                    Err(Refusal::Unknown { .. })
                ),
                "{altered}"
            );
        }
        // A JSON escape is read as the text it stands for.
        assert_eq!(
            r.restore_arguments(r#""\u005bPII:email:1]""#, all).unwrap(),
            r#""ada@example.com""#
        );
    }

    #[test]
    fn a_recorded_value_keeps_its_token_whatever_the_detector_finds() {
        // A table from an earlier engine, holding a value today's detector
        // does not find (a national phone number).
        let table = vec![PiiEntry {
            token: "[PII:phone:1]".into(),
            value: "020 7946 0958".into(),
            user: true,
            tools: false,
            numeric: false,
        }];
        let mut r = Redactor::new(&table, &PiiKind::ALL);
        let transcript = vec![user("call 020 7946 0958 or +1 415 555 2671")];
        r.learn(&transcript, |_| false);
        // The new value continues the numbering; the recorded one is
        // still replaced wherever it stands as a whole.
        assert_eq!(
            r.changed()
                .iter()
                .map(|e| e.token.as_str())
                .collect::<Vec<_>>(),
            ["[PII:phone:2]"]
        );
        assert_eq!(
            r.redact_messages(&transcript, |_| false)[0],
            user("call [PII:phone:1] or [PII:phone:2]")
        );
        // Learning again changes nothing.
        let mut again = Redactor::new(&[table[0].clone(), r.changed()[0].clone()], &PiiKind::ALL);
        again.learn(&transcript, |_| false);
        assert!(again.changed().is_empty());
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
            serde_json::from_str::<Value>(&r.restore_arguments(args, all).unwrap()).unwrap(),
            serde_json::json!({"to": "ada@example.com", "card": "4111 1111 1111 1111"})
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
            r.restore_arguments(r#"{"to":"[PII:email:1]"}"#, PiiAccess::default()),
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
