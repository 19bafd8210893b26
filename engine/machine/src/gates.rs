//! Tool gates: the rules of a tool's shared `rate_limit:` and
//! `circuit_breaker:`, as pure functions over one [`GateRow`] and the
//! engine's clock.
//!
//! A tool's gates are shared by every run and every worker of a tenant, so
//! their state lives in the database (table `tool_gates`, one row per
//! tenant and tool name, written by `belay_store`), never in a process.
//! The store reads the row inside the dispatch transition, asks [`admit`]
//! whether the call may go, and writes back what it returns; results and
//! failures reported for the tool move its circuit with [`after_failure`]
//! (a success always closes it: see the store for the one
//! `UPDATE` that does so). Times are ms since the Unix epoch by the engine's
//! clock (`Store::clock_now`, which tests move), never a worker's.
//!
//! **Rate limit.** `rate_limit: r` lets at most one call go every
//! `ceil(1000 / r)` ms ([`interval_ms`]): a token bucket that holds one
//! token, kept as the time the next token is there (`next_at_ms`, GCRA's
//! theoretical arrival time). So any window of one second holds at most
//! `ceil(r)` dispatches, which is what an API's "r requests per second"
//! allows however it counts (fixed or sliding windows); there is no burst
//! above it. A call that comes too early is deferred, not failed: its task
//! goes back to ready until its turn, and the deferral is no attempt
//! (nothing was sent). Turns are handed out one interval apart, in the
//! order calls come (`queue_at_ms` is the next one to hand out), so calls
//! waiting together come back in a row rather than all at the next token.
//! A call back for its turn waits only for the token (a few ms more when
//! the call before it went late); a new call queues behind the turns
//! handed out. Only `next_at_ms` decides whether a call goes, so the bound
//! holds whatever the turns.
//!
//! **Circuit breaker.** `threshold` consecutive failures open the circuit:
//! calls then fail at once without being sent, until `reset_ms` has passed.
//! Then one call goes as a probe (half-open; the others still fail fast):
//! its success closes the circuit, its failure opens it for another
//! `reset_ms`. A probe that never reports (its worker died) is given up on
//! after `reset_ms`, and another call may probe. What counts as a failure
//! is [`counts_as_failure`].
//!
//! Architecture Invariant: pure (no I/O, no clock); the store passes the
//! time in.

use crate::event::FailureClass;
pub use belay_definitions::model::MAX_INTERVAL_MS;
use belay_definitions::model::{CircuitBreakerDef, ToolDef};

/// The gates a tool declares (copied from its pinned definition).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ToolGates {
    /// `rate_limit:`, calls per second.
    pub rate_limit: Option<f64>,
    /// `circuit_breaker:`.
    pub circuit_breaker: Option<CircuitBreakerDef>,
}

impl ToolGates {
    /// What `tool` declares.
    pub fn of(tool: &ToolDef) -> ToolGates {
        ToolGates {
            rate_limit: tool.rate_limit,
            circuit_breaker: tool.circuit_breaker,
        }
    }

    /// Whether the tool declares any gate (if not, its calls cost nothing here).
    pub fn any(&self) -> bool {
        self.rate_limit.is_some() || self.circuit_breaker.is_some()
    }
}

/// The state of a tool's circuit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Circuit {
    /// Calls go (subject to the rate limit).
    #[default]
    Closed,
    /// Calls fail without being sent until `retry_at_ms`.
    Open,
    /// One probe call went at `retry_at_ms - reset_ms`; others fail fast
    /// until it reports, or until `retry_at_ms` (then it is given up on).
    HalfOpen,
}

impl Circuit {
    /// Database spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Circuit::Closed => "closed",
            Circuit::Open => "open",
            Circuit::HalfOpen => "half_open",
        }
    }

    /// From the database spelling; `None` for anything else.
    pub fn parse(s: &str) -> Option<Circuit> {
        match s {
            "closed" => Some(Circuit::Closed),
            "open" => Some(Circuit::Open),
            "half_open" => Some(Circuit::HalfOpen),
            _ => None,
        }
    }
}

/// One row of `tool_gates`: a tenant's tool. A tool never gated has no row,
/// which means [`GateRow::default`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GateRow {
    /// Rate limit: the earliest time the next call may be dispatched.
    pub next_at_ms: i64,
    /// Rate limit: the turn the next deferred call is given.
    pub queue_at_ms: i64,
    /// Consecutive failures (reset by a success).
    pub failures: u32,
    /// The circuit.
    pub circuit: Circuit,
    /// Open: when a probe may go. Half-open: when the probe is given up on.
    pub retry_at_ms: i64,
}

/// Why a dispatch the machine allowed may not go now.
#[derive(Debug, Clone, PartialEq)]
pub enum GateVerdict {
    /// The rate limit has no room: the call waits for its turn. Not an attempt.
    Defer {
        /// From now until its turn, ms.
        delay_ms: u64,
        /// Its turn (RFC 3339, ms).
        until: String,
        /// The tool's `rate_limit:`, for the message.
        rate_limit: f64,
    },
    /// The circuit is open: the call fails without being sent.
    CircuitOpen {
        /// Consecutive failures so far.
        failures: u32,
        /// When a probe may go (RFC 3339, ms).
        until: String,
        /// Whether a probe call is under way (half-open).
        probing: bool,
    },
}

impl GateVerdict {
    /// What the model, the history and the worker are told, about `tool`.
    pub fn describe(&self, tool: &str) -> String {
        match self {
            GateVerdict::Defer {
                until, rate_limit, ..
            } => format!(
                "tool `{tool}` is at its rate limit ({rate_limit} per second); the call waits for its turn at {until}"
            ),
            GateVerdict::CircuitOpen {
                failures,
                until,
                probing: false,
            } => format!(
                "the circuit breaker of tool `{tool}` is open after {failures} consecutive failures: calls fail without being sent until {until}"
            ),
            GateVerdict::CircuitOpen {
                until,
                probing: true,
                ..
            } => format!(
                "the circuit breaker of tool `{tool}` is half-open: one probe call is under way, and other calls fail without being sent until it succeeds (or until {until})"
            ),
        }
    }
}

/// The spacing `rate_limit: rate` imposes between two dispatches, ms
/// (rounded up, so a second never holds more than `ceil(rate)`; at least 1).
pub fn interval_ms(rate: f64) -> i64 {
    let ms = (1000.0 / rate).ceil();
    if ms.is_nan() || ms < 1.0 {
        1
    } else if ms.is_finite() && ms <= MAX_INTERVAL_MS as f64 {
        ms as i64
    } else {
        // The parser refuses a rate this small; a stored one is held to a
        // day, so turns stay in the range of a database timestamp.
        MAX_INTERVAL_MS
    }
}

/// Whether the dispatch of a call of a tool gated by `gates` may go at
/// `now_ms`, and the row to write back (the same row when nothing changes).
/// `holds_turn`: the call was deferred before and comes back for its turn.
/// `None`: it may go (the token is taken, or it is the probe). The circuit
/// is judged first: a call that fails fast takes no turn of the rate limit,
/// and a probe that must wait for its turn does not half-open the circuit.
pub fn admit(
    row: &GateRow,
    now_ms: i64,
    gates: &ToolGates,
    holds_turn: bool,
) -> (Option<GateVerdict>, GateRow) {
    let mut next = *row;
    if let Some(breaker) = gates.circuit_breaker
        && row.circuit != Circuit::Closed
    {
        if now_ms < row.retry_at_ms {
            let verdict = GateVerdict::CircuitOpen {
                failures: row.failures,
                until: rfc3339(row.retry_at_ms),
                probing: row.circuit == Circuit::HalfOpen,
            };
            return (Some(verdict), *row);
        }
        next.circuit = Circuit::HalfOpen;
        next.retry_at_ms = now_ms.saturating_add(ms(breaker.reset_ms));
    }
    if let Some(rate) = gates.rate_limit {
        let interval = interval_ms(rate);
        // A new call also waits behind the turns handed out.
        let free_at = if holds_turn {
            row.next_at_ms
        } else {
            row.next_at_ms.max(row.queue_at_ms)
        };
        if now_ms < free_at {
            let turn = free_at;
            let deferred = GateRow {
                queue_at_ms: if holds_turn {
                    row.queue_at_ms
                } else {
                    turn.saturating_add(interval)
                },
                ..*row
            };
            let verdict = GateVerdict::Defer {
                delay_ms: u64::try_from(turn - now_ms).unwrap_or(0),
                until: rfc3339(turn),
                rate_limit: rate,
            };
            return (Some(verdict), deferred);
        }
        next.next_at_ms = now_ms.saturating_add(interval);
    }
    (None, next)
}

/// The row after a failure of the tool that [`counts_as_failure`], at
/// `now_ms`: one more consecutive failure; the circuit opens at the
/// threshold, and a failed probe (half-open) opens it again. An open
/// circuit stays open until its time (a late failure of a call sent before
/// it opened does not extend it).
pub fn after_failure(row: &GateRow, now_ms: i64, breaker: &CircuitBreakerDef) -> GateRow {
    let failures = row.failures.saturating_add(1);
    let opens = match row.circuit {
        Circuit::Closed => failures >= breaker.threshold,
        Circuit::HalfOpen => true,
        Circuit::Open => false,
    };
    GateRow {
        failures,
        circuit: if opens { Circuit::Open } else { row.circuit },
        retry_at_ms: if opens {
            now_ms.saturating_add(ms(breaker.reset_ms))
        } else {
            row.retry_at_ms
        },
        ..*row
    }
}

/// Whether a failed call counts against its tool's circuit: it was
/// dispatched and the endpoint did not answer (it could not be reached,
/// timed out, or the connection broke: any class but `rejected`, with no
/// HTTP status), or it answered 5xx, 408 or 429. A definite refusal of
/// the request (other 4xx, 3xx, a refused address, a tool's own error
/// result) says the endpoint works, and counts as neither a failure nor a
/// success; so do lost leases (the worker, not the endpoint, may be gone).
pub fn counts_as_failure(class: FailureClass, status_code: Option<u16>) -> bool {
    match status_code {
        Some(status) => status >= 500 || status == 408 || status == 429,
        None => class != FailureClass::Rejected,
    }
}

fn ms(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// `ms` since the epoch as RFC 3339 with ms, UTC.
fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC)
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATE_2: ToolGates = ToolGates {
        rate_limit: Some(2.0),
        circuit_breaker: None,
    };
    const BREAKER: CircuitBreakerDef = CircuitBreakerDef {
        threshold: 3,
        reset_ms: 10_000,
    };
    const BREAKER_ONLY: ToolGates = ToolGates {
        rate_limit: None,
        circuit_breaker: Some(BREAKER),
    };

    #[test]
    fn intervals_round_up() {
        assert_eq!(interval_ms(2.0), 500);
        assert_eq!(interval_ms(3.0), 334);
        assert_eq!(interval_ms(0.5), 2000);
        assert_eq!(interval_ms(1000.0), 1);
        assert_eq!(interval_ms(1e9), 1);
        assert_eq!(interval_ms(1e-300), MAX_INTERVAL_MS);
        assert_eq!(interval_ms(1.0 / 86_400.0), MAX_INTERVAL_MS);
    }

    /// Dispatch attempts `(time, holds_turn)` against a fresh row; returns
    /// the times that went and the turns given to the others.
    fn replay(gates: &ToolGates, calls: &[(i64, bool)]) -> (Vec<i64>, Vec<i64>) {
        let mut row = GateRow::default();
        let (mut went, mut turns) = (Vec::new(), Vec::new());
        for &(t, holds_turn) in calls {
            let (verdict, next) = admit(&row, t, gates, holds_turn);
            match verdict {
                None => went.push(t),
                Some(GateVerdict::Defer { delay_ms, .. }) => turns.push(t + delay_ms as i64),
                Some(other) => panic!("{other:?}"),
            }
            row = next;
        }
        (went, turns)
    }

    #[test]
    fn one_call_per_interval_and_waiting_calls_get_turns_in_a_row() {
        let s = 1_700_000_000_000;
        // Four calls at once: one goes, three get turns 500 ms apart.
        let (went, turns) = replay(&RATE_2, &[(s, false); 4]);
        assert_eq!(went, vec![s]);
        assert_eq!(turns, vec![s + 500, s + 1000, s + 1500]);
        // Each comes back at its turn and goes.
        let calls = [(s, false), (s, false), (s, false)];
        let back = [(s + 500, true), (s + 1000, true)];
        let (went, turns) = replay(&RATE_2, &[&calls[..], &back[..]].concat());
        assert_eq!(went, vec![s, s + 500, s + 1000]);
        assert_eq!(turns, vec![s + 500, s + 1000]);
        // A call that went late pushes the next one back by as much, not to
        // the end of the queue.
        let late = [(s + 510, true), (s + 1000, true), (s + 1010, true)];
        let (went, turns) = replay(&RATE_2, &[&calls[..], &late[..]].concat());
        assert_eq!(went, vec![s, s + 510, s + 1010]);
        assert_eq!(turns, vec![s + 500, s + 1000, s + 1010]);
        // A new call queues behind the turns handed out.
        let new = [(s + 600, false)];
        let (_, turns) = replay(&RATE_2, &[&calls[..], &new[..]].concat());
        assert_eq!(turns, vec![s + 500, s + 1000, s + 1500]);
        // A call after a quiet time goes at once.
        let (went, _) = replay(&RATE_2, &[(s, false), (s + 10_000, false)]);
        assert_eq!(went.len(), 2);
    }

    #[test]
    fn no_second_holds_more_than_the_rate_however_calls_arrive() {
        for rate in [0.5, 1.0, 2.0, 3.0, 2.5, 10.0] {
            let gates = ToolGates {
                rate_limit: Some(rate),
                circuit_breaker: None,
            };
            // Calls every 7 ms for 5 s, each back (a few ms late) at its turn.
            let mut row = GateRow::default();
            let mut pending: Vec<(i64, bool)> = (0..700).map(|i| (i * 7, false)).collect();
            let mut went = Vec::new();
            while !pending.is_empty() {
                let (t, holds_turn) = pending.remove(0);
                let (verdict, next) = admit(&row, t, &gates, holds_turn);
                row = next;
                match verdict {
                    None => went.push(t),
                    Some(GateVerdict::Defer { delay_ms, .. }) if t < 5_000 => {
                        let at = t + delay_ms as i64 + (t % 3);
                        let i = pending.partition_point(|&(p, _)| p <= at);
                        pending.insert(i, (at, true));
                    }
                    _ => {}
                }
            }
            let most = rate.ceil() as usize;
            for (i, &t) in went.iter().enumerate() {
                let in_window = went[i..].iter().take_while(|&&u| u < t + 1000).count();
                assert!(
                    in_window <= most,
                    "rate {rate}: {in_window} in [{t}, {t}+1s)"
                );
            }
            assert!(went.len() >= (5.0 * rate) as usize, "rate {rate}: {went:?}");
        }
    }

    #[test]
    fn circuit_opens_at_the_threshold_and_a_probe_decides() {
        let mut row = GateRow::default();
        for failure in 1..=3 {
            assert_eq!(admit(&row, 0, &BREAKER_ONLY, false).0, None);
            row = after_failure(&row, 100, &BREAKER);
            assert_eq!(row.failures, failure);
        }
        assert_eq!((row.circuit, row.retry_at_ms), (Circuit::Open, 10_100));
        // Open: calls fail fast, and change nothing.
        let (verdict, same) = admit(&row, 5_000, &BREAKER_ONLY, false);
        assert_eq!(same, row);
        assert!(
            matches!(&verdict, Some(GateVerdict::CircuitOpen { failures: 3, probing: false, until }) if until == "1970-01-01T00:00:10.100Z"),
            "{verdict:?}"
        );
        // A late failure of a call sent before it opened does not extend it.
        assert_eq!(after_failure(&row, 6_000, &BREAKER).retry_at_ms, 10_100);
        // After reset_ms one probe goes; the others fail fast.
        let (verdict, probing) = admit(&row, 10_100, &BREAKER_ONLY, false);
        assert_eq!(verdict, None);
        assert_eq!(
            (probing.circuit, probing.retry_at_ms),
            (Circuit::HalfOpen, 20_100)
        );
        assert!(matches!(
            admit(&probing, 10_200, &BREAKER_ONLY, false).0,
            Some(GateVerdict::CircuitOpen { probing: true, .. })
        ));
        // The probe fails: open again for reset_ms.
        let reopened = after_failure(&probing, 10_300, &BREAKER);
        assert_eq!(
            (reopened.circuit, reopened.retry_at_ms, reopened.failures),
            (Circuit::Open, 20_300, 4)
        );
        // A probe never heard of is given up on after reset_ms.
        assert_eq!(admit(&probing, 20_100, &BREAKER_ONLY, false).0, None);
    }

    #[test]
    fn a_probe_waiting_for_its_turn_leaves_the_circuit_open() {
        let gates = ToolGates {
            rate_limit: Some(1.0),
            circuit_breaker: Some(BREAKER),
        };
        let row = GateRow {
            next_at_ms: 20_000,
            circuit: Circuit::Open,
            retry_at_ms: 10_000,
            failures: 3,
            ..GateRow::default()
        };
        let (verdict, next) = admit(&row, 15_000, &gates, false);
        assert!(matches!(
            verdict,
            Some(GateVerdict::Defer {
                delay_ms: 5_000,
                ..
            })
        ));
        assert_eq!((next.circuit, next.retry_at_ms), (Circuit::Open, 10_000));
        // An open circuit takes no turn of the rate limit.
        let open = GateRow {
            retry_at_ms: 30_000,
            ..row
        };
        assert_eq!(admit(&open, 25_000, &gates, false).1, open);
    }

    #[test]
    fn which_failures_count() {
        use FailureClass::*;
        assert!(counts_as_failure(MayHaveActed, Some(500)));
        assert!(counts_as_failure(NotSent, Some(503)));
        assert!(counts_as_failure(NotSent, Some(429)));
        assert!(counts_as_failure(Rejected, Some(408)));
        assert!(counts_as_failure(NotSent, None)); // connection refused
        assert!(counts_as_failure(MayHaveActed, None)); // timeout
        assert!(!counts_as_failure(Rejected, Some(404)));
        assert!(!counts_as_failure(Rejected, Some(400)));
        assert!(!counts_as_failure(Rejected, Some(302)));
        assert!(!counts_as_failure(Rejected, None)); // refused address, tool error
    }
}
