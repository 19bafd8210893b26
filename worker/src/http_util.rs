//! Helpers shared by the model adapter and the HTTP tool executor: how a
//! `reqwest` send error maps to "was anything sent?", and how text from a
//! remote party is cut down before it goes into an error message.

use std::error::Error as StdError;
use std::fmt::Write as _;

/// Longest remote text (provider or tool error bodies) kept in an error
/// message, in bytes.
pub(crate) const MAX_ERROR_BODY_BYTES: usize = 4096;

/// What a failed `send` tells us about whether the request reached the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendFailure {
    /// The request was never built or the connection was never established
    /// (refused, DNS failure, TLS handshake, connect timeout): nothing was sent.
    NotSent,
    /// The whole-request timeout fired; the request may have been sent.
    Timeout,
    /// Anything else (reset, closed mid-response, body error): the request may
    /// have been sent.
    AfterSend,
}

/// Classifies a `reqwest` error. The connect check comes first because a
/// connect timeout is both `is_connect` and `is_timeout`, and no byte of the
/// request left the machine in that case.
pub(crate) fn classify_send_error(err: &reqwest::Error) -> SendFailure {
    if err.is_builder() || err.is_connect() {
        SendFailure::NotSent
    } else if err.is_timeout() {
        SendFailure::Timeout
    } else {
        SendFailure::AfterSend
    }
}

/// The error and all its sources, joined with `": "`, because `reqwest`'s own
/// `Display` hides the useful part ("connection refused") in the sources.
pub(crate) fn error_chain(err: &(dyn StdError + 'static)) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        let text = inner.to_string();
        // hyper and reqwest often repeat the same text one level down.
        if !out.ends_with(&text) {
            let _ = write!(out, ": {text}");
        }
        source = inner.source();
    }
    out
}

/// `text` cut to at most [`MAX_ERROR_BODY_BYTES`] on a char boundary, with a
/// marker saying how much was dropped.
pub(crate) fn truncate_text(text: &str) -> String {
    if text.len() <= MAX_ERROR_BODY_BYTES {
        return text.to_owned();
    }
    let mut end = MAX_ERROR_BODY_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}… ({} more bytes truncated)",
        &text[..end],
        text.len() - end
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn truncate_keeps_short_text_and_cuts_on_char_boundary() {
        assert_eq!(truncate_text("short"), "short");
        let long = "é".repeat(MAX_ERROR_BODY_BYTES); // 2 bytes per char
        let cut = truncate_text(&long);
        assert!(cut.len() < long.len());
        assert!(cut.contains("more bytes truncated"));
        assert!(cut.starts_with("éé"));
    }
}
