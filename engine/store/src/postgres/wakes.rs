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
//! Only to listeners that exist: sending costs a statement and a commit,
//! plus a wake-up of every listening backend, and a lone engine's own
//! notifications only come back to it to be skipped (below peak load that
//! was about one statement per step). So a relay whose process listens
//! ([`WakeRelay::listening`]) sends wake-ups only while it has heard another
//! process within [`PEER_TTL`]: every listening process says [`HELLO`] when
//! its `LISTEN` starts and every [`PRESENCE_EVERY`], and answers another's
//! hello with [`HERE`] at once, so a replica that starts is known to the
//! others within a round trip, and knows them. Any notification from
//! another process (a wake-up, or the older payloads of a previous release)
//! counts as hearing it. A relay whose process does not listen (a store
//! used without a coordinator) always sends, as before. During a rolling
//! upgrade from a release that does not say hello, a replica of that
//! release is heard only while it sends wake-ups of its own: once it has
//! been idle for [`PEER_TTL`], the new replicas stop sending it theirs and
//! its claimers find new tasks by their once-a-second look (measured by a
//! reviewer: first steps of 0.3 s instead of a few ms), until it sends
//! again or is replaced. A lost `LISTEN` connection (sqlx reconnects it)
//! says hello again and wakes every local waiter to look.
//!
//! [`Pg::listen`] relays them to the coordinator: this process's own as
//! they commit, other processes' through `LISTEN`.
//!
//! Delivery is best effort: a crash between commit and send, or a failed
//! send (logged at warn), loses wake-ups. That is safe because every waiter
//! looks again on its own at least every second: claim long-polls
//! (`Coordinator::claim`), `WatchRun` streams and the MCP server's waits.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgListener, PgPool};
use tokio::sync::{broadcast, mpsc};
use uuid::Uuid;

use super::Pg;
use crate::rows::StoreError;
use crate::transition::{TasksWakeSeq, Wake, Wakes};

/// Channel notified when tasks become claimable or outbox rows are written.
pub const TASKS_CHANNEL: &str = "belay_tasks";
/// Channel notified when runs get events (payload: run ids).
pub const EVENTS_CHANNEL: &str = "belay_events";

/// Largest payload of one notification, bytes (PostgreSQL's limit is 8000).
pub const MAX_PAYLOAD_BYTES: usize = 7_000;

/// Body of the notification a listening process sends on
/// [`TASKS_CHANNEL`] when its `LISTEN` starts and every [`PRESENCE_EVERY`]
/// (`<instance>:hello`): "I listen; send me your wake-ups".
pub const HELLO: &str = "hello";
/// Body of the answer to another process's [`HELLO`] (`<instance>:here`),
/// so that a replica that starts learns of the running ones at once.
pub const HERE: &str = "here";
/// How often a listening process says [`HELLO`].
pub const PRESENCE_EVERY: Duration = Duration::from_secs(10);
/// How long after last hearing another process a relay still sends it
/// wake-ups: three missed hellos.
pub const PEER_TTL: Duration = Duration::from_secs(30);

/// How long the sender waits, once woken, for more wake-ups to send in
/// the same statement: what a wake-up for another replica may be late by.
/// Measured with two engines at half of their peak (belay-bench, E2/N4,
/// `--rate 42`): 8.5 → 6.8 transactions per step, step p99 28.8 → 16-20
/// ms; at peak 4.8 → 3.6 transactions per step. A lone engine does not
/// wait (it sends no wake-ups).
pub const COALESCE: Duration = Duration::from_millis(2);

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
    /// Say [`HELLO`] (`Some(true)`) or [`HERE`] (`Some(false)`).
    presence: Option<bool>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        !self.tasks && !self.outbox && self.runs.is_empty() && self.presence.is_none()
    }

    /// The wake-ups alone, presence left out (no other process listens).
    fn without_wakes(self) -> Pending {
        Pending {
            presence: self.presence,
            ..Pending::default()
        }
    }
}

/// What this process knows of the other listening processes.
#[derive(Debug, Default, Clone, Copy)]
struct Peers {
    /// This process's `LISTEN` connection is up.
    listening: bool,
    /// When another process was last heard.
    last_heard: Option<Instant>,
}

impl Peers {
    /// Whether wake-ups should be sent at `now` (module docs).
    fn send_wakes(&self, now: Instant) -> bool {
        !self.listening
            || self
                .last_heard
                .is_some_and(|t| now.saturating_duration_since(t) < PEER_TTL)
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
    /// Bumped whenever tasks may have become claimable here.
    tasks_seq: TasksWakeSeq,
    peers: Arc<Mutex<Peers>>,
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
            tasks_seq: TasksWakeSeq::default(),
            peers: Arc::new(Mutex::new(Peers::default())),
        };
        tokio::spawn(send_loop(
            pool,
            Arc::clone(&relay.instance),
            Arc::clone(&relay.pending),
            Arc::clone(&relay.peers),
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
            self.tasks_seq.bump();
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

    /// Count a moment tasks may have become claimable that no committed
    /// transition of this process announced ([`crate::Store::tasks_wake_seq`]).
    pub(crate) fn tasks_may_be_claimable(&self) {
        self.tasks_seq.bump();
    }

    /// [`crate::Store::tasks_wake_seq`].
    pub(crate) fn tasks_seq(&self) -> u64 {
        self.tasks_seq.get()
    }

    /// This process's own wake-ups, as they are committed.
    pub(crate) fn subscribe_local(&self) -> broadcast::Receiver<Wake> {
        self.local.subscribe()
    }

    /// The wake-ups a notification carries, or nothing when this process
    /// sent it (it had them locally). A notification from another process
    /// counts as hearing it; a [`HELLO`] is answered with [`HERE`].
    pub(crate) fn decode(&self, channel: &str, payload: &str) -> Vec<Wake> {
        let sender = payload.split_once(':');
        if sender.is_none_or(|(sender, _)| sender != &*self.instance) {
            lock(&self.peers).last_heard = Some(Instant::now());
            if channel == TASKS_CHANNEL && sender.is_some_and(|(_, body)| body == HELLO) {
                self.say(false);
            }
        }
        decode(&self.instance, channel, payload)
    }

    /// This process's `LISTEN` connection is up (`true`: say [`HELLO`]) or
    /// gone (`false`: send every wake-up until it is up again).
    pub(crate) fn listening(&self, up: bool) {
        lock(&self.peers).listening = up;
        if up {
            self.say(true);
        }
    }

    /// Queue a [`HELLO`] (`true`) or [`HERE`] (`false`).
    fn say(&self, hello: bool) {
        lock(&self.pending).presence.get_or_insert(hello);
        let _ = self.signal.try_send(());
    }
}

fn lock<T>(p: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Pending wake-ups and peers hold no invariant a panic could break.
    p.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn send_loop(
    pool: PgPool,
    instance: Arc<str>,
    pending: Arc<Mutex<Pending>>,
    peers: Arc<Mutex<Peers>>,
    mut signal: mpsc::Receiver<()>,
) {
    let mut presence = tokio::time::interval(PRESENCE_EVERY);
    presence.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            got = signal.recv() => if got.is_none() {
                return;
            },
            _ = presence.tick() => {
                if lock(&peers).listening {
                    lock(&pending).presence.get_or_insert(true);
                }
            }
        }
        let send_wakes = lock(&peers).send_wakes(Instant::now());
        if send_wakes {
            // Let the wake-ups of the next moment join this batch: below
            // peak load each transition was otherwise a statement of its
            // own, and a transaction on every other listener.
            tokio::time::sleep(COALESCE).await;
        }
        let mut batch = std::mem::take(&mut *lock(&pending));
        if !send_wakes {
            batch = batch.without_wakes();
        }
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
    if let Some(hello) = batch.presence {
        channels.push(TASKS_CHANNEL);
        payloads.push(format!("{instance}:{}", if hello { HELLO } else { HERE }));
    }
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
        TASKS_CHANNEL if body == HELLO || body == HERE => Vec::new(),
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

/// Tells the wake-up relay that `LISTEN` ended when dropped.
struct NotListeningOnDrop<'a>(&'a WakeRelay);

impl Drop for NotListeningOnDrop<'_> {
    fn drop(&mut self) {
        self.0.listening(false);
    }
}

/// Aborts a spawned task when dropped (the `LISTEN` reader of
/// [`Pg::listen`] ends with its caller).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Pg {
    /// Relay wake-ups to `on_wake` until the connection fails (the caller
    /// reconnects): this process's own as they commit, other processes'
    /// through `LISTEN` (module docs).
    pub(crate) async fn listen(
        &self,
        on_wake: &mut (dyn FnMut(Wake) + Send),
    ) -> Result<(), StoreError> {
        // Subscribed before LISTEN, so nothing committed here in between
        // is missed.
        let mut local = self.wakes.subscribe_local();
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen_all([TASKS_CHANNEL, EVENTS_CHANNEL]).await?;
        // Wake-ups from other processes may have been missed before this.
        self.wakes.tasks_may_be_claimable();
        // Others send their wake-ups once they hear this process say hello;
        // until the connection is up again, this one sends all of its own.
        self.wakes.listening(true);
        let _not_listening = NotListeningOnDrop(&self.wakes);
        // The listener runs in its own task and hands over through a
        // channel, so that waiting on both sources cancels only
        // cancel-safe receives.
        let (tx, mut remote) = tokio::sync::mpsc::channel::<Result<Vec<Wake>, StoreError>>(256);
        let relay = self.wakes.clone();
        let reader = tokio::spawn(async move {
            loop {
                let item = match listener.try_recv().await {
                    Ok(Some(n)) => {
                        let wakes = relay.decode(n.channel(), n.payload());
                        if wakes.contains(&Wake::Tasks) {
                            relay.tasks_may_be_claimable();
                        }
                        Ok(wakes)
                    }
                    // The connection was lost (sqlx reconnects it on its
                    // own): notifications sent meanwhile are gone, so
                    // everyone looks again, and others hear this process
                    // again (they may have stopped sending to it).
                    Ok(None) => {
                        tracing::warn!("LISTEN connection lost; reconnecting");
                        relay.tasks_may_be_claimable();
                        relay.listening(true);
                        Ok(vec![Wake::Tasks, Wake::Outbox])
                    }
                    Err(e) => Err(StoreError::from(e)),
                };
                let failed = item.is_err();
                if tx.send(item).await.is_err() || failed {
                    return;
                }
            }
        });
        let _abort = AbortOnDrop(reader);
        loop {
            tokio::select! {
                item = remote.recv() => match item {
                    Some(Ok(wakes)) => wakes.into_iter().for_each(&mut *on_wake),
                    Some(Err(e)) => return Err(e),
                    None => return Err(StoreError::Config("the LISTEN connection ended".into())),
                },
                wake = local.recv() => match wake {
                    Ok(w) => on_wake(w),
                    // Fell behind: some wake-ups were dropped; look again.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        self.wakes.tasks_may_be_claimable();
                        on_wake(Wake::Tasks);
                        on_wake(Wake::Outbox);
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                        return Err(StoreError::Config("the store was closed".into()));
                    }
                },
            }
        }
    }

    pub(crate) fn tasks_wake_seq(&self) -> u64 {
        self.wakes.tasks_seq()
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
    fn presence_is_said_first_and_is_no_wake_up() {
        let mut p = batch(true, false, 1);
        p.presence = Some(true);
        let (channels, payloads) = encode("me", &p);
        assert_eq!(channels[0], TASKS_CHANNEL);
        assert_eq!(payloads[0], "me:hello");
        assert!(decode("other", TASKS_CHANNEL, "me:hello").is_empty());
        assert!(decode("other", TASKS_CHANNEL, "me:here").is_empty());
        assert_eq!(
            decode("other", channels[1], &payloads[1]),
            vec![Wake::Tasks]
        );
        // Without wake-ups only the presence is left.
        let alone = p.without_wakes();
        assert_eq!(alone.presence, Some(true));
        assert!(!alone.tasks && alone.runs.is_empty() && !alone.is_empty());
        assert!(batch(true, true, 3).without_wakes().is_empty());
    }

    #[test]
    fn wake_ups_are_sent_while_not_listening_or_while_another_process_was_heard_lately() {
        let now = Instant::now() + PEER_TTL * 2;
        let mut peers = Peers::default();
        // A store used without a coordinator sends, as before.
        assert!(peers.send_wakes(now));
        peers.listening = true;
        // Listening and never heard anyone: nobody else listens.
        assert!(!peers.send_wakes(now));
        peers.last_heard = Some(now - PEER_TTL / 3);
        assert!(peers.send_wakes(now));
        peers.last_heard = Some(now - PEER_TTL);
        assert!(!peers.send_wakes(now));
    }

    #[tokio::test]
    async fn hearing_another_process_is_remembered_and_its_hello_answered() {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .connect_lazy("postgres://nobody@127.0.0.1:1/none")
            .expect("lazy pool");
        let relay = WakeRelay::start(pool);
        relay.listening(true);
        assert_eq!(lock(&relay.pending).presence, Some(true));
        lock(&relay.pending).presence = None;
        assert!(lock(&relay.peers).last_heard.is_none());
        // Its own hello is not hearing anyone.
        let own = format!("{}:hello", relay.instance);
        assert!(relay.decode(TASKS_CHANNEL, &own).is_empty());
        assert!(lock(&relay.peers).last_heard.is_none());
        assert_eq!(lock(&relay.pending).presence, None);
        // Another's hello is answered with `here`, and counts.
        assert!(relay.decode(TASKS_CHANNEL, "other:hello").is_empty());
        assert!(lock(&relay.peers).send_wakes(Instant::now()));
        assert_eq!(lock(&relay.pending).presence, Some(false));
        // An older release's payload (no sender) counts too.
        lock(&relay.peers).last_heard = None;
        assert_eq!(relay.decode(TASKS_CHANNEL, ""), vec![Wake::Tasks]);
        assert!(lock(&relay.peers).last_heard.is_some());
        relay.listening(false);
        assert!(!lock(&relay.peers).listening);
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
