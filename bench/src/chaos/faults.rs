//! The faults: a schedule drawn from the seed before anything starts
//! ([`plan`]), and the [`Injector`] that applies it to the supervisor, the
//! proxies and the PostgreSQL cluster while runs go on. Between faults the
//! injector keeps the supervisor ticking (killed processes come back after
//! their downtime). Every fault applied is one line of `faults.log` in the
//! log folder, with its time from the start.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::postgres::{self, Cluster};
use super::procs::Supervisor;
use super::proxy::Proxy;
use super::rng::Rng;

/// A proxied link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// Workers and clients to engine `i`.
    Engine(usize),
    /// Engines to PostgreSQL.
    Postgres,
    /// Workers to the tool server (and the model).
    Tools,
}

/// One fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL an engine; start it again after `down_ms`.
    KillEngine {
        /// Which.
        engine: usize,
        /// Downtime, ms.
        down_ms: u64,
    },
    /// SIGKILL a worker; start a new one in its place after `down_ms`.
    KillWorker {
        /// Which.
        worker: usize,
        /// Downtime, ms.
        down_ms: u64,
    },
    /// Restart the PostgreSQL cluster in immediate mode.
    RestartPostgres,
    /// Close every connection of a link at once.
    Drop(Link),
    /// Forward nothing on a link for `ms`.
    Stall {
        /// Which.
        link: Link,
        /// How long, ms.
        ms: u64,
    },
}

impl Fault {
    /// The fault's kind, as the report counts it.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::KillEngine { .. } => "engine SIGKILL",
            Fault::KillWorker { .. } => "worker SIGKILL",
            Fault::RestartPostgres => "PostgreSQL restart (immediate)",
            Fault::Drop(Link::Engine(_)) => "dropped connections, workers/clients to engine",
            Fault::Drop(Link::Postgres) => "dropped connections, engines to PostgreSQL",
            Fault::Drop(Link::Tools) => "dropped connections, workers to tool server",
            Fault::Stall {
                link: Link::Engine(_),
                ..
            } => "stalled connections, workers/clients to engine",
            Fault::Stall {
                link: Link::Postgres,
                ..
            } => "stalled connections, engines to PostgreSQL",
            Fault::Stall {
                link: Link::Tools, ..
            } => "stalled connections, workers to tool server",
        }
    }
}

/// A fault and when it happens, ms after the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Planned {
    /// ms after the start of the fault phase.
    pub at_ms: u64,
    /// What.
    pub fault: Fault,
}

/// What shapes the schedule.
#[derive(Debug, Clone, Copy)]
pub struct PlanOptions {
    /// The seed.
    pub seed: u64,
    /// Length of the fault phase, ms.
    pub duration_ms: u64,
    /// Mean time between two faults, ms.
    pub mean_interval_ms: u64,
    /// Engines.
    pub engines: usize,
    /// Workers.
    pub workers: usize,
    /// Whether to restart PostgreSQL.
    pub pg_restarts: bool,
    /// The engines' lease, ms (stalls last up to two of them).
    pub lease_ms: u64,
}

/// Least time between two PostgreSQL restarts, ms: the cluster's recovery
/// and the engines' reconnection take a few seconds.
const PG_RESTART_SPACING_MS: u64 = 15_000;

/// The fault schedule of `options`: the same options give the same list.
/// The workers-to-tool-server link is dropped but never stalled: a stalled
/// request delivered after its probe looked for it would be a second
/// request no engine could have prevented.
pub fn plan(options: &PlanOptions) -> Vec<Planned> {
    let mut rng = Rng::new(options.seed);
    let mean = options.mean_interval_ms.max(1);
    let mut at = rng.between(mean / 2, mean + mean / 2);
    let mut last_pg = None::<u64>;
    let mut faults = Vec::new();
    // Weights, in order: kill engine, kill worker, restart PostgreSQL,
    // drop engine link, stall engine link, drop PostgreSQL link, stall it,
    // drop tool link.
    let weights = [3, 4, 2 * u64::from(options.pg_restarts), 3, 2, 2, 1, 2];
    while at < options.duration_ms {
        let fault = match rng.weighted(&weights) {
            0 => Fault::KillEngine {
                engine: rng.below(options.engines as u64) as usize,
                down_ms: rng.between(0, 3_000),
            },
            1 => Fault::KillWorker {
                worker: rng.below(options.workers as u64) as usize,
                down_ms: rng.between(0, 3_000),
            },
            2 if last_pg.is_some_and(|t| at < t + PG_RESTART_SPACING_MS) => {
                Fault::Drop(Link::Postgres)
            }
            2 => {
                last_pg = Some(at);
                Fault::RestartPostgres
            }
            3 => Fault::Drop(Link::Engine(rng.below(options.engines as u64) as usize)),
            4 => Fault::Stall {
                link: Link::Engine(rng.below(options.engines as u64) as usize),
                ms: rng.between(300, 2 * options.lease_ms),
            },
            5 => Fault::Drop(Link::Postgres),
            6 => Fault::Stall {
                link: Link::Postgres,
                ms: rng.between(300, 2 * options.lease_ms),
            },
            _ => Fault::Drop(Link::Tools),
        };
        faults.push(Planned { at_ms: at, fault });
        at += rng.between(mean / 2, mean + mean / 2);
    }
    faults
}

/// Applies a schedule.
pub struct Injector<'a> {
    /// The engines and workers.
    pub supervisor: &'a mut Supervisor,
    /// Engines to PostgreSQL.
    pub pg_proxy: &'a Proxy,
    /// Workers to the tool server.
    pub tool_proxy: &'a Proxy,
    /// The cluster to restart (`None`: PostgreSQL restarts are off).
    pub cluster: Option<Cluster>,
    /// The database's direct URL (to wait for PostgreSQL after a restart).
    pub database_url: String,
    /// Faults applied, by kind.
    pub applied: BTreeMap<&'static str, u64>,
    /// Faults that found nothing to act on (a process already down, a
    /// restart still under way), by kind.
    pub skipped: BTreeMap<&'static str, u64>,
    /// Restarts of PostgreSQL that failed.
    pub pg_errors: Vec<String>,
    restarting: Option<JoinHandle<Result<Duration>>>,
    log: Option<std::fs::File>,
}

impl<'a> Injector<'a> {
    /// An injector that logs to `faults.log` in `log_dir`.
    ///
    /// Errors: the log cannot be created.
    pub fn new(
        supervisor: &'a mut Supervisor,
        pg_proxy: &'a Proxy,
        tool_proxy: &'a Proxy,
        cluster: Option<Cluster>,
        database_url: String,
        log_dir: &Path,
    ) -> Result<Injector<'a>> {
        let path = log_dir.join("faults.log");
        let log =
            std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Injector {
            supervisor,
            pg_proxy,
            tool_proxy,
            cluster,
            database_url,
            applied: BTreeMap::new(),
            skipped: BTreeMap::new(),
            pg_errors: Vec::new(),
            restarting: None,
            log: Some(log),
        })
    }

    /// Applies `schedule` from `start` on, ticking the supervisor between
    /// faults, until `until`.
    ///
    /// Errors: a process that cannot be spawned.
    pub async fn run(
        &mut self,
        schedule: &[Planned],
        start: Instant,
        until: Instant,
    ) -> Result<()> {
        for planned in schedule {
            let due = start + Duration::from_millis(planned.at_ms);
            if due > until {
                break;
            }
            self.tick_until(due).await?;
            self.apply(planned, start).await?;
        }
        self.tick_until(until).await
    }

    /// Ticks the supervisor every 50 ms until `due`.
    ///
    /// Errors: a process that cannot be spawned.
    pub async fn tick_until(&mut self, due: Instant) -> Result<()> {
        loop {
            self.supervisor.tick()?;
            self.reap_restart().await;
            let now = Instant::now();
            if now >= due {
                return Ok(());
            }
            tokio::time::sleep((due - now).min(Duration::from_millis(50))).await;
        }
    }

    async fn reap_restart(&mut self) {
        if self
            .restarting
            .as_ref()
            .is_some_and(JoinHandle::is_finished)
            && let Some(handle) = self.restarting.take()
        {
            match handle.await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => self.pg_errors.push(format!("{e:#}")),
                Err(e) => self.pg_errors.push(format!("the restart task failed: {e}")),
            }
        }
    }

    fn note(&mut self, start: Instant, text: &str) {
        if let Some(log) = &mut self.log {
            let _ = writeln!(log, "{:>9.3}s {text}", start.elapsed().as_secs_f64());
        }
    }

    async fn apply(&mut self, planned: &Planned, start: Instant) -> Result<()> {
        let kind = planned.fault.kind();
        let acted = match planned.fault {
            Fault::KillEngine { engine, down_ms } => {
                self.supervisor
                    .kill_engine(engine, Duration::from_millis(down_ms))
                    .await
            }
            Fault::KillWorker { worker, down_ms } => {
                self.supervisor
                    .kill_worker(worker, Duration::from_millis(down_ms))
                    .await
            }
            Fault::RestartPostgres => self.restart_postgres(),
            Fault::Drop(link) => {
                self.proxy(link).drop_all();
                true
            }
            Fault::Stall { link, ms } => {
                self.proxy(link).stall_for(Duration::from_millis(ms));
                true
            }
        };
        let counts = if acted {
            &mut self.applied
        } else {
            &mut self.skipped
        };
        *counts.entry(kind).or_insert(0) += 1;
        let text = format!(
            "{}{:?}",
            if acted { "" } else { "(skipped) " },
            planned.fault
        );
        self.note(start, &text);
        Ok(())
    }

    fn proxy(&self, link: Link) -> &Proxy {
        match link {
            Link::Engine(i) => &self.supervisor.engine_proxies()[i],
            Link::Postgres => self.pg_proxy,
            Link::Tools => self.tool_proxy,
        }
    }

    fn restart_postgres(&mut self) -> bool {
        let Some(cluster) = self.cluster.clone() else {
            return false;
        };
        if self.restarting.is_some() {
            return false;
        }
        let url = self.database_url.clone();
        self.restarting = Some(tokio::spawn(async move {
            let took = postgres::restart(&cluster).await?;
            postgres::wait_ready(&url, Duration::from_secs(60)).await?;
            Ok(took)
        }));
        true
    }

    /// Ends every stall, waits for a PostgreSQL restart under way, and
    /// makes sure PostgreSQL answers.
    ///
    /// Errors: PostgreSQL does not answer.
    pub async fn calm(&mut self) -> Result<()> {
        for i in 0..self.supervisor.engine_count() {
            self.supervisor.engine_proxies()[i].unstall();
        }
        self.pg_proxy.unstall();
        self.tool_proxy.unstall();
        if let Some(handle) = self.restarting.take() {
            match handle.await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => self.pg_errors.push(format!("{e:#}")),
                Err(e) => self.pg_errors.push(format!("the restart task failed: {e}")),
            }
        }
        postgres::ensure_up(self.cluster.as_ref(), &self.database_url).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(seed: u64, pg_restarts: bool) -> PlanOptions {
        PlanOptions {
            seed,
            duration_ms: 120_000,
            mean_interval_ms: 1_500,
            engines: 2,
            workers: 3,
            pg_restarts,
            lease_ms: 2_000,
        }
    }

    #[test]
    fn a_seed_gives_one_schedule_with_every_kind_of_fault() {
        let a = plan(&options(9, true));
        assert_eq!(a, plan(&options(9, true)));
        assert_ne!(a, plan(&options(10, true)));
        assert!((50..=110).contains(&a.len()), "{} faults", a.len());
        let kinds: std::collections::BTreeSet<&str> = a.iter().map(|p| p.fault.kind()).collect();
        assert_eq!(kinds.len(), 8, "{kinds:?}");
        assert!(a.windows(2).all(|w| w[0].at_ms < w[1].at_ms));
        assert!(a.iter().all(|p| p.at_ms < 120_000));
        let restarts: Vec<u64> = a
            .iter()
            .filter(|p| p.fault == Fault::RestartPostgres)
            .map(|p| p.at_ms)
            .collect();
        assert!(
            restarts
                .windows(2)
                .all(|w| w[1] - w[0] >= PG_RESTART_SPACING_MS)
        );
        for p in &a {
            match p.fault {
                Fault::KillEngine { engine, .. } => assert!(engine < 2),
                Fault::KillWorker { worker, .. } => assert!(worker < 3),
                Fault::Stall { link, ms } => {
                    assert_ne!(link, Link::Tools);
                    assert!((300..=4_000).contains(&ms));
                }
                _ => {}
            }
        }
    }

    #[test]
    fn without_pg_restarts_none_is_planned() {
        assert!(
            plan(&options(9, false))
                .iter()
                .all(|p| p.fault != Fault::RestartPostgres)
        );
    }
}
