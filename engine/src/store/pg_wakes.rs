//! Wake-ups of the PostgreSQL backend: sent after a transition commits, in
//! batches, never from inside the transition's transaction.
//!
//! Why not `NOTIFY` inside the transaction (which would deliver the wake-up
//! atomically with the commit): PostgreSQL serialises the commits of all
//! transactions that issued a `NOTIFY`. `PreCommit_Notify` takes a
//! database-wide lock that is held until the commit record is flushed
//! (`src/backend/commands/async.c`), so the WAL flushes of notifying
//! transactions cannot be grouped. Measured with `pgbench -M prepared -c 50`
//! on the development machine (PostgreSQL 15, `synchronous_commit = on`):
//! `BEGIN; INSERT; COMMIT` ran 8 300 tx/s, the same with a `pg_notify` in it
//! 1 070 tx/s (46 ms mean latency). Every transition notified, so this lock
//! was the engine's throughput limit.
//!
//! Instead, a committed transition hands its wake-ups ([`Wakes`]) to the
//! [`WakeRelay`]: they are delivered at once to this process's own listener
//! (a broadcast; no round trip), and queued for one background sender that
//! sends everything queued in one autocommit statement (`SELECT pg_notify(c,
//! p) FROM UNNEST(...)`): while one statement is in flight the next batch
//! collects, so under load the notifications per transition fall well below
//! one. Each payload starts with the sending process's instance id, and a
//! listener skips its own (it already had them locally).
//!
//! Payloads (channel, text): [`TASKS_CHANNEL`] `<instance>:` (tasks may be
//! claimable) or `<instance>:outbox`; [`EVENTS_CHANNEL`]
//! `<instance>:<run id>,<run id>,...` (at most [`MAX_PAYLOAD_BYTES`] a
//! payload; more runs take more notifications). A payload without `:` is
//! read as the older single form (`""`, `"outbox"`, one run id), so replicas
//! of the previous release are understood during a rolling upgrade.
//!
//! Delivery is best effort: a crash between commit and send, or a failed
//! send (logged at warn), loses wake-ups. That is safe because every waiter
//! looks again on its own at least every second: claim long-polls
//! (`Coordinator::claim`), `WatchRun` streams and the MCP server's waits.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use sqlx::postgres::PgPool;
use tokio::sync::{broadcast, mpsc};
use uuid::Uuid;

use super::{Wake, Wakes};

/// Channel notified when tasks become claimable or outbox rows are written.
pub const TASKS_CHANNEL: &str = "belay_tasks";
/// Channel notified when runs get events (payload: run ids).
pub const EVENTS_CHANNEL: &str = "belay_events";

/// Largest payload of one notification, bytes (PostgreSQL's limit is 8000).
pub const MAX_PAYLOAD_BYTES: usize = 7_000;

/// Capacity of the in-process broadcast of wake-ups; a listener that falls
/// further behind is told to look again at everything.
const LOCAL_CAPACITY: usize = 4_096;

/// Wake-ups waiting for the background sender, deduplicated.
#[derive(Debug, Default)]
struct Pending {
    tasks: bool,
    outbox: bool,
    runs: Vec<Uuid>,
    seen: HashSet<Uuid>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        !self.tasks && !self.outbox && self.runs.is_empty()
    }
}

/// Hands committed wake-ups to this process's listener at once and to other
/// processes through `pg_notify`, batched (module docs). Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct WakeRelay {
    instance: Arc<str>,
    pending: Arc<Mutex<Pending>>,
    /// Wakes the sender; capacity 1: one signal covers everything queued.
    signal: mpsc::Sender<()>,
    local: broadcast::Sender<Wake>,
}

impl WakeRelay {
    /// A relay sending through `pool`; spawns the sender task, which ends
    /// when the last clone of the relay is dropped. Needs a Tokio runtime.
    pub(crate) fn start(pool: PgPool) -> WakeRelay {
        let (signal, rx) = mpsc::channel(1);
        let (local, _) = broadcast::channel(LOCAL_CAPACITY);
        let relay = WakeRelay {
            instance: Uuid::now_v7().simple().to_string().into(),
            pending: Arc::new(Mutex::new(Pending::default())),
            signal,
            local,
        };
        tokio::spawn(send_loop(
            pool,
            Arc::clone(&relay.instance),
            Arc::clone(&relay.pending),
            rx,
        ));
        relay
    }

    /// Queue the wake-ups of a committed transition of `run_id`.
    pub(crate) fn send(&self, run_id: Uuid, wakes: Wakes) {
        if !(wakes.tasks || wakes.events || wakes.outbox) {
            return;
        }
        // No local listener (no coordinator) is fine.
        if wakes.tasks {
            let _ = self.local.send(Wake::Tasks);
        }
        if wakes.events {
            let _ = self.local.send(Wake::RunEvents(run_id));
        }
        if wakes.outbox {
            let _ = self.local.send(Wake::Outbox);
        }
        {
            let mut p = lock(&self.pending);
            p.tasks |= wakes.tasks;
            p.outbox |= wakes.outbox;
            if wakes.events && p.seen.insert(run_id) {
                p.runs.push(run_id);
            }
        }
        // Full: a signal is already waiting, and it covers this batch.
        let _ = self.signal.try_send(());
    }

    /// This process's own wake-ups, as they are committed.
    pub(crate) fn subscribe_local(&self) -> broadcast::Receiver<Wake> {
        self.local.subscribe()
    }

    /// The wake-ups a notification carries, or nothing when this process
    /// sent it (it had them locally).
    pub(crate) fn decode(&self, channel: &str, payload: &str) -> Vec<Wake> {
        decode(&self.instance, channel, payload)
    }
}

fn lock(p: &Mutex<Pending>) -> std::sync::MutexGuard<'_, Pending> {
    // Pending wake-ups hold no invariant a panic could break.
    p.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn send_loop(
    pool: PgPool,
    instance: Arc<str>,
    pending: Arc<Mutex<Pending>>,
    mut signal: mpsc::Receiver<()>,
) {
    while signal.recv().await.is_some() {
        let batch = std::mem::take(&mut *lock(&pending));
        if batch.is_empty() {
            continue;
        }
        let (channels, payloads) = encode(&instance, &batch);
        let sent =
            sqlx::query("SELECT pg_notify(c, p) FROM UNNEST($1::text[], $2::text[]) AS n(c, p)")
                .bind(&channels)
                .bind(&payloads)
                .execute(&pool)
                .await;
        if let Err(e) = sent {
            if pool.is_closed() {
                return;
            }
            // Waiters look again within a second on their own.
            tracing::warn!(error = %e, notifications = channels.len(), "sending wake-ups failed; waiters will poll");
        }
    }
}

/// The notifications (channels, payloads) of a batch.
fn encode(instance: &str, batch: &Pending) -> (Vec<&'static str>, Vec<String>) {
    let mut channels = Vec::new();
    let mut payloads = Vec::new();
    if batch.tasks {
        channels.push(TASKS_CHANNEL);
        payloads.push(format!("{instance}:"));
    }
    if batch.outbox {
        channels.push(TASKS_CHANNEL);
        payloads.push(format!("{instance}:outbox"));
    }
    let mut current = String::new();
    for run in &batch.runs {
        if current.len() + 37 > MAX_PAYLOAD_BYTES {
            channels.push(EVENTS_CHANNEL);
            payloads.push(std::mem::take(&mut current));
        }
        if current.is_empty() {
            current.push_str(instance);
            current.push(':');
        } else {
            current.push(',');
        }
        current.push_str(&run.to_string());
    }
    if !current.is_empty() {
        channels.push(EVENTS_CHANNEL);
        payloads.push(current);
    }
    (channels, payloads)
}

/// The wake-ups of one notification; none when `own` sent it. Unknown
/// channels and unreadable run ids are skipped.
fn decode(own: &str, channel: &str, payload: &str) -> Vec<Wake> {
    let body = match payload.split_once(':') {
        Some((sender, _)) if sender == own => return Vec::new(),
        Some((_, body)) => body,
        // The older form: no sender.
        None => payload,
    };
    match channel {
        TASKS_CHANNEL if body == "outbox" => vec![Wake::Outbox],
        TASKS_CHANNEL => vec![Wake::Tasks],
        EVENTS_CHANNEL => body
            .split(',')
            .filter_map(|id| Uuid::parse_str(id).ok())
            .map(Wake::RunEvents)
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(tasks: bool, outbox: bool, runs: usize) -> Pending {
        let mut p = Pending {
            tasks,
            outbox,
            ..Pending::default()
        };
        for i in 0..runs {
            p.runs.push(Uuid::from_u128(i as u128 + 1));
        }
        p
    }

    #[test]
    fn a_batch_round_trips_through_its_notifications_and_the_sender_skips_its_own() {
        let p = batch(true, true, 500);
        let (channels, payloads) = encode("me", &p);
        assert!(payloads.iter().all(|x| x.len() <= MAX_PAYLOAD_BYTES));
        // 500 run ids of 37 bytes do not fit one payload.
        assert!(channels.iter().filter(|c| **c == EVENTS_CHANNEL).count() >= 3);
        let mut got = Vec::new();
        for (c, x) in channels.iter().zip(&payloads) {
            assert!(
                decode("me", c, x).is_empty(),
                "own notification {x} was not skipped"
            );
            got.extend(decode("other", c, x));
        }
        assert_eq!(got[0], Wake::Tasks);
        assert_eq!(got[1], Wake::Outbox);
        let runs: Vec<Wake> = p.runs.iter().copied().map(Wake::RunEvents).collect();
        assert_eq!(&got[2..], &runs[..]);
    }

    #[test]
    fn the_older_payloads_without_a_sender_are_read() {
        let run = Uuid::from_u128(7);
        assert_eq!(decode("me", TASKS_CHANNEL, ""), vec![Wake::Tasks]);
        assert_eq!(decode("me", TASKS_CHANNEL, "outbox"), vec![Wake::Outbox]);
        assert_eq!(
            decode("me", EVENTS_CHANNEL, &run.to_string()),
            vec![Wake::RunEvents(run)]
        );
        assert!(decode("me", "elsewhere", "x:").is_empty());
        assert!(decode("me", EVENTS_CHANNEL, "x:not-a-uuid").is_empty());
    }
}
