//! A run's place in a distributed trace: the W3C Trace Context
//! (<https://www.w3.org/TR/trace-context/>) a run is started with, persisted
//! on its `RunStarted` event and carried to workers in task specs, and the
//! span ids derived from it. Pure: no clock, no randomness, no I/O, so the
//! machine may copy it into specs and every engine or worker process, before
//! or after a restart, derives the same span id for the same node.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Most bytes of a `tracestate` header kept (the W3C limit is 32 members
/// of at most 256 bytes each; 512 is what the specification asks
/// propagators to support at least).
pub const MAX_TRACESTATE_BYTES: usize = 512;

/// The W3C trace context of a run (or of one of its calls): a
/// `traceparent` header value (`00-<trace id: 32 hex>-<parent span id: 16
/// hex>-<flags: 2 hex>`, lower case) and its `tracestate` (possibly empty),
/// passed on as received. Built only by [`TraceContext::parse`] or
/// [`TraceContext::from_ids`], so a stored one is always well-formed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceContext {
    /// `traceparent` header value, version `00`.
    pub traceparent: String,
    /// `tracestate` header value; empty when there is none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tracestate: String,
}

/// Why a `traceparent` value was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraceContextError {
    /// Not `00-<32 hex>-<16 hex>-<2 hex>` in lower case.
    Malformed(String),
    /// The trace id or the parent id is all zeros (invalid by the W3C rules).
    ZeroId(String),
}

// By hand: `thiserror` is only in this crate's `grpc` build.
impl std::error::Error for TraceContextError {}

impl std::fmt::Display for TraceContextError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TraceContextError::Malformed(v) => write!(
                f,
                "traceparent {v:?} is not `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`"
            ),
            TraceContextError::ZeroId(v) => {
                write!(f, "traceparent {v:?} has an all-zero trace id or parent id")
            }
        }
    }
}

impl TraceContext {
    /// Parse a `traceparent` header (and its `tracestate`, kept when it is
    /// at most [`MAX_TRACESTATE_BYTES`] of visible ASCII, dropped
    /// otherwise, as the W3C rules allow). Version `00` only; a future
    /// version's first four fields are accepted as the specification
    /// asks, and stored as `00`.
    pub fn parse(traceparent: &str, tracestate: &str) -> Result<TraceContext, TraceContextError> {
        let value = traceparent.trim();
        let malformed = || TraceContextError::Malformed(value.chars().take(80).collect());
        let parts: Vec<&str> = value.split('-').collect();
        if parts.len() < 4 {
            return Err(malformed());
        }
        let (version, trace_id, parent_id, flags) = (parts[0], parts[1], parts[2], parts[3]);
        let hex_of = |s: &str, n: usize| {
            s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        };
        if !hex_of(version, 2)
            || version == "ff"
            || (version == "00" && parts.len() != 4)
            || !hex_of(trace_id, 32)
            || !hex_of(parent_id, 16)
            || !hex_of(flags, 2)
        {
            return Err(malformed());
        }
        if trace_id.bytes().all(|b| b == b'0') || parent_id.bytes().all(|b| b == b'0') {
            return Err(TraceContextError::ZeroId(value.to_owned()));
        }
        let state = tracestate.trim();
        let keep_state =
            state.len() <= MAX_TRACESTATE_BYTES && state.bytes().all(|b| (0x20..0x7f).contains(&b));
        Ok(TraceContext {
            traceparent: format!("00-{trace_id}-{parent_id}-{flags}"),
            tracestate: if keep_state {
                state.to_owned()
            } else {
                String::new()
            },
        })
    }

    /// A context of a new trace (`trace_id`, 16 bytes, not all zero) whose
    /// parent is `parent_id` (8 bytes), sampled.
    pub fn from_ids(trace_id: [u8; 16], parent_id: [u8; 8]) -> TraceContext {
        TraceContext {
            traceparent: format!("00-{}-{}-01", hex::encode(trace_id), hex::encode(parent_id)),
            tracestate: String::new(),
        }
    }

    /// The trace id, 32 lower-case hex digits.
    pub fn trace_id(&self) -> &str {
        self.traceparent.get(3..35).unwrap_or_default()
    }

    /// The parent span id, 16 lower-case hex digits.
    pub fn parent_id(&self) -> &str {
        self.traceparent.get(36..52).unwrap_or_default()
    }

    /// The trace flags byte (bit 0: sampled).
    pub fn flags(&self) -> u8 {
        self.traceparent
            .get(53..55)
            .and_then(|f| u8::from_str_radix(f, 16).ok())
            .unwrap_or(0)
    }

    /// The same trace and state with `span_id` (16 hex digits) as the
    /// parent: what a child of that span carries.
    pub fn with_parent(&self, span_id: &str) -> TraceContext {
        TraceContext {
            traceparent: format!("00-{}-{span_id}-{:02x}", self.trace_id(), self.flags()),
            tracestate: self.tracestate.clone(),
        }
    }

    /// The span id of one visit of a node of run `run_id` in this trace:
    /// `visit` is the visit's prefix (`<node>`, or `<node>~<n>` on the n-th
    /// visit). 16 hex digits: the first 8 bytes of SHA-256 over the trace
    /// id, run id and visit (never all zero), so the engine that records
    /// the node's span and the worker whose call spans are its children
    /// agree without asking each other.
    pub fn node_span_id(&self, run_id: &str, visit: &str) -> String {
        let mut hash = Sha256::new();
        for part in [self.trace_id(), run_id, visit] {
            hash.update(part.as_bytes());
            hash.update([0u8]);
        }
        let digest = hash.finalize();
        let mut id = [0u8; 8];
        id.copy_from_slice(&digest[..8]);
        if id == [0; 8] {
            id[7] = 1;
        }
        hex::encode(id)
    }

    /// What a call of the visit `visit` of a node carries: this trace with
    /// the node's span ([`TraceContext::node_span_id`]) as the parent.
    pub fn for_node(&self, run_id: &str, visit: &str) -> TraceContext {
        self.with_parent(&self.node_span_id(run_id, visit))
    }
}

/// What a task spec of a traced run carries (`ModelCallSpec.trace`,
/// `ToolCallSpec.trace`): the run's trace with the call's node span as
/// the parent, and what the worker's span of the call is labelled with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallTrace {
    /// The parent of the worker's span of the call.
    #[serde(flatten)]
    pub context: TraceContext,
    /// The call id (`<visit>.m<n>`, `<visit>.t<n>`, …).
    pub call_id: String,
    /// A tool call's repeat safety (`never`, `idempotent`, `reconcile`);
    /// empty for model calls.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub repeat_safety: String,
}

/// The node visit a call id belongs to: its text before the first `.`
/// (call ids are `<visit>.m<n>`, `<visit>.t<n>`, `<visit>.t<n>.p<n>`, …,
/// and node names have no `.`).
pub fn visit_of(call_id: &str) -> &str {
    call_id.split('.').next().unwrap_or(call_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_w3c_traceparent_parses_and_exposes_its_fields() {
        let t = TraceContext::parse(TP, "rojo=00f067aa0ba902b7").expect("valid");
        assert_eq!(t.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.parent_id(), "00f067aa0ba902b7");
        assert_eq!(t.flags(), 1);
        assert_eq!(t.tracestate, "rojo=00f067aa0ba902b7");
    }

    #[test]
    fn malformed_or_zero_traceparents_are_refused_with_the_reason() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
        ] {
            assert!(
                matches!(
                    TraceContext::parse(bad, ""),
                    Err(TraceContextError::Malformed(_))
                ),
                "{bad:?}"
            );
        }
        let zero = "00-00000000000000000000000000000000-00f067aa0ba902b7-01";
        let err = TraceContext::parse(zero, "").expect_err("zero trace id");
        assert!(err.to_string().contains("all-zero"), "{err}");
    }

    #[test]
    fn a_later_version_is_read_as_version_00() {
        let t = TraceContext::parse(
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "",
        )
        .expect("future version");
        assert_eq!(t.traceparent, TP);
    }

    #[test]
    fn node_span_ids_are_stable_and_differ_per_visit() {
        let t = TraceContext::parse(TP, "").expect("valid");
        let a = t.node_span_id("run-1", "triage");
        assert_eq!(a, t.node_span_id("run-1", "triage"));
        assert_eq!(a.len(), 16);
        assert_ne!(a, t.node_span_id("run-1", "triage~2"));
        assert_ne!(a, t.node_span_id("run-2", "triage"));
        let child = t.for_node("run-1", "triage");
        assert_eq!(child.trace_id(), t.trace_id());
        assert_eq!(child.parent_id(), a);
    }

    #[test]
    fn an_oversized_tracestate_is_dropped_not_refused() {
        let t = TraceContext::parse(TP, &"a=b,".repeat(200)).expect("valid parent");
        assert_eq!(t.tracestate, "");
    }
}
