//! Helpers shared by the model adapter, the HTTP tool executor and the
//! OAuth clients: how a `reqwest` send error maps to "was anything sent?",
//! how a remote party's answer is read up to a limit ([`read_capped`]), and
//! how text from a remote party is cut down before it goes into an error
//! message.

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

/// Why [`read_capped`] read no body.
#[derive(Debug)]
pub(crate) enum CappedRead {
    /// The body is longer than the limit; what was known when reading
    /// stopped: `Content-Length: N` (nothing read) or `read N bytes`.
    TooLarge(String),
    /// Reading failed (connection, timeout).
    Failed(reqwest::Error),
}

/// The body of `response`, at most `limit` bytes, read chunk by chunk: a
/// longer one is refused as soon as it is known to be (from its
/// `Content-Length`, or once more than `limit` bytes have arrived), so no
/// more than `limit` bytes plus one chunk are ever held.
pub(crate) async fn read_capped(
    response: &mut reqwest::Response,
    limit: usize,
) -> Result<Vec<u8>, CappedRead> {
    if let Some(length) = response.content_length()
        && length > limit as u64
    {
        return Err(CappedRead::TooLarge(format!("Content-Length: {length}")));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(CappedRead::Failed)? {
        if body.len() + chunk.len() > limit {
            return Err(CappedRead::TooLarge(format!(
                "read {} bytes",
                body.len() + chunk.len()
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The first `limit` bytes of `response`'s body, and whether more
/// followed (not read): an error answer is quoted, never held whole.
pub(crate) async fn read_prefix(
    response: &mut reqwest::Response,
    limit: usize,
) -> Result<(Vec<u8>, bool), reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = limit - body.len();
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            return Ok((body, true));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, false))
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
