//! `belay-bench --peer restate`: the same trivial-step workload on Belay and
//! on a peer engine, in one invocation: R runs of K durable steps with C in
//! flight, then runs one at a time, on each; prints each side's figures and
//! their ratios.
//!
//! Belay runs the loop shape (a workflow's `tool` node calls the no-op HTTP
//! tool K times, through a worker; [`crate::Shape::Loop`]); Restate a
//! TypeScript-SDK handler making K `ctx.run` steps ([`restate`]). The order
//! is Belay with C in flight, Restate (both rounds), Belay sequential, so a
//! drift of this machine's speed within the sitting shows up on both sides.

pub mod restate;

use anyhow::Result;

use crate::{BenchConfig, Report, Shape};

/// Which peer to measure beside Belay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Peer {
    /// Restate 1.7 with its TypeScript SDK 1.17.
    Restate,
}

/// What one `--peer` invocation measured.
pub struct Comparison {
    /// Belay, C in flight.
    pub belay_concurrent: Report,
    /// Belay, one run at a time.
    pub belay_sequential: Report,
    /// Restate, C in flight.
    pub restate_concurrent: restate::RestateRound,
    /// Restate, one invocation at a time.
    pub restate_sequential: restate::RestateRound,
}

/// Runs both workloads on both engines (see the module's docs).
/// `config` is Belay's concurrent round (its shape must be
/// [`Shape::Loop`]); the sequential rounds make `sequential_runs` runs each.
///
/// Errors: either engine fails a run or cannot start; the shape is not the
/// loop.
pub async fn compare(config: &BenchConfig, sequential_runs: u32) -> Result<Comparison> {
    anyhow::ensure!(
        config.shape == Shape::Loop,
        "--peer compares the loop shape (a workflow of K tool steps, no model): pass --shape loop"
    );
    eprintln!("belay, {} in flight ...", config.concurrency);
    let belay_concurrent = crate::run(config).await?;
    let log_dir = std::env::temp_dir().join(format!("belay_bench_peer_{}", uuid::Uuid::new_v4()));
    eprintln!("restate ({}) ...", log_dir.display());
    let peer = restate::Restate::start(&log_dir).await?;
    let rounds = async {
        let concurrent = peer
            .round(config.runs, config.tool_steps, config.concurrency)
            .await?;
        let sequential = peer.round(sequential_runs, config.tool_steps, 1).await?;
        anyhow::Ok((concurrent, sequential))
    }
    .await;
    peer.stop().await;
    let (restate_concurrent, restate_sequential) = rounds?;
    let _ = std::fs::remove_dir_all(&log_dir);
    eprintln!("belay, sequential ...");
    let sequential = BenchConfig {
        runs: sequential_runs,
        concurrency: 1,
        rate: None,
        ceiling_duration: std::time::Duration::ZERO,
        ..config.clone()
    };
    let belay_sequential = crate::run(&sequential).await?;
    Ok(Comparison {
        belay_concurrent,
        belay_sequential,
        restate_concurrent,
        restate_sequential,
    })
}

impl Comparison {
    /// Each side's figures, then the comparison, one `name: value` line each.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "belay, {} in flight:",
            self.restate_concurrent.concurrency
        )];
        lines.extend(self.belay_concurrent.lines());
        lines.push(String::new());
        lines.push("belay, sequential:".to_owned());
        lines.extend(self.belay_sequential.lines());
        lines.push(String::new());
        lines.extend(self.restate_concurrent.lines("concurrent"));
        lines.extend(self.restate_sequential.lines("sequential"));
        lines.push(String::new());
        lines.extend(self.ratios());
        lines
    }

    /// The comparison: Belay's figure, Restate's, and Belay's as a multiple
    /// of Restate's (above 1 is better for throughput, worse for time).
    pub fn ratios(&self) -> Vec<String> {
        let (bc, bs) = (&self.belay_concurrent, &self.belay_sequential);
        let (rc, rs) = (&self.restate_concurrent, &self.restate_sequential);
        let wall_ms = |r: &Report| 1000.0 * r.elapsed.as_secs_f64() / r.steps.max(1) as f64;
        let ratio = |a: f64, b: f64| a / b.max(f64::EPSILON);
        let belay_cpu = |r: &Report| {
            r.cpu.engines_ms.unwrap_or(0.0) + r.cpu.workers_ms.unwrap_or(0.0) + r.cpu.postgres_ms
        } / r.steps.max(1) as f64;
        vec![
            format!(
                "vs restate, {} in flight, steps/s: belay {:.1}, restate {:.1}, belay/restate {:.2}x",
                rc.concurrency,
                bc.steps_per_sec(),
                rc.steps_per_s,
                ratio(bc.steps_per_sec(), rc.steps_per_s)
            ),
            format!(
                "vs restate, sequential, wall ms per step: belay {:.3}, restate {:.3}, belay/restate {:.2}x",
                wall_ms(bs),
                rs.wall_ms_per_step,
                ratio(wall_ms(bs), rs.wall_ms_per_step)
            ),
            format!(
                "vs restate, sequential, belay step latency p50 {:.3} ms, restate ms per step beyond an invocation {:.3}, belay/restate {:.2}x",
                bs.step_latency.p50_ms,
                rs.marginal_ms_per_step,
                ratio(bs.step_latency.p50_ms, rs.marginal_ms_per_step)
            ),
            format!(
                "vs restate, {} in flight, cpu ms per step: belay (engines, workers, postgres) {:.3}, restate (server, service) {:.3}, belay/restate {:.2}x",
                rc.concurrency,
                belay_cpu(bc),
                rc.cpu_ms_per_step(),
                ratio(belay_cpu(bc), rc.cpu_ms_per_step())
            ),
        ]
    }
}
