//! Where the CPU goes: CPU time (user + system) of the engines, the workers,
//! the bench process itself (scripted model, no-op tool, submissions and
//! polling) and PostgreSQL's server processes over the workload, read from
//! `/proc` (proc(5)), so the cost of a step can be split by process.
//!
//! `/proc/<pid>/stat` gives a process's `utime`, `stime` (fields 14, 15) and
//! its waited-for children's `cutime`, `cstime` (16, 17) in clock ticks of
//! `USER_HZ`, which is 100 per second on every architecture Linux runs on
//! today (`sysconf(_SC_CLK_TCK)`), so the resolution is 10 ms per process.
//! PostgreSQL's share is every process named `postgres` on the machine (its
//! backends, WAL writer, checkpointer, …) plus the postmaster's `cutime +
//! cstime`, which holds the backends that exited (the postmaster waits for
//! them); it includes other databases' activity, if any. The machine's busy
//! time is `/proc/stat`'s first line minus `idle` and `iowait`.

use std::path::Path;

use anyhow::{Context, Result, anyhow};

/// Clock ticks per second of `/proc` times (`USER_HZ`).
const TICKS_PER_SEC: f64 = 100.0;

/// CPU time of a process (`None`: this one), user + system, in ms; with
/// `children`, also the time of its exited, waited-for children.
///
/// Errors: `/proc/<pid>/stat` unreadable or malformed.
pub fn process_cpu_ms(pid: Option<u32>, children: bool) -> Result<f64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/stat"),
        None => "/proc/self/stat".to_owned(),
    };
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let (_, _, ticks) = parse_stat(&stat, children).ok_or_else(|| anyhow!("malformed {path}"))?;
    Ok(ticks as f64 * 1000.0 / TICKS_PER_SEC)
}

/// `(comm, ppid, ticks)` of one `/proc/<pid>/stat` line: `utime + stime`,
/// plus `cutime + cstime` with `children`. The command name is in
/// parentheses and may itself hold spaces and parentheses, so the fields are
/// counted from the last `)`.
fn parse_stat(stat: &str, children: bool) -> Option<(String, u32, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_owned();
    // Fields after the name start at field 3 (state).
    let rest: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    let field = |n: usize| -> Option<u64> { rest.get(n - 3)?.parse().ok() };
    let ppid = u32::try_from(field(4)?).ok()?;
    let mut ticks = field(14)? + field(15)?;
    if children {
        ticks += field(16)? + field(17)?;
    }
    Some((comm, ppid, ticks))
}

/// CPU time of PostgreSQL's server processes on this machine, ms: every
/// live `postgres` process, plus the exited backends the postmaster waited
/// for.
///
/// Errors: `/proc` unreadable.
pub fn postgres_cpu_ms() -> Result<f64> {
    let mut procs = Vec::new();
    for entry in std::fs::read_dir("/proc").context("reading /proc")? {
        let entry = entry.context("reading /proc")?;
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        // A process may exit between the listing and the read.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        if let Some((comm, ppid, _)) = parse_stat(&stat, false)
            && comm == "postgres"
        {
            procs.push((pid, ppid, stat));
        }
    }
    let pids: std::collections::HashSet<u32> = procs.iter().map(|p| p.0).collect();
    let mut ticks = 0_u64;
    for (_, ppid, stat) in &procs {
        // The postmaster is the `postgres` whose parent is not one.
        let postmaster = !pids.contains(ppid);
        if let Some((_, _, t)) = parse_stat(stat, postmaster) {
            ticks += t;
        }
    }
    Ok(ticks as f64 * 1000.0 / TICKS_PER_SEC)
}

/// The machine's busy and total CPU time since boot, ms (all cores), from
/// `/proc/stat`.
///
/// Errors: `/proc/stat` unreadable or malformed.
pub fn machine_cpu_ms() -> Result<(f64, f64)> {
    read_machine(Path::new("/proc/stat"))
}

fn read_machine(path: &Path) -> Result<(f64, f64)> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse_machine(&text).ok_or_else(|| anyhow!("malformed {}", path.display()))
}

/// `(busy, total)` in ms from `/proc/stat`'s `cpu` line: user nice system
/// idle iowait irq softirq steal (guest time is already in user).
fn parse_machine(text: &str) -> Option<(f64, f64)> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    if ticks.len() < 5 {
        return None;
    }
    let total: u64 = ticks.iter().sum();
    let busy = total - ticks[3] - ticks[4];
    let ms = |t: u64| t as f64 * 1000.0 / TICKS_PER_SEC;
    Some((ms(busy), ms(total)))
}

/// CPU time read at one moment, ms: the fleet's engines and workers (`None`
/// when they run inside the bench process), the bench process, PostgreSQL,
/// and the machine's busy and total time.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuReading {
    /// Engines' CPU time, summed, ms; `None` in-process.
    pub engines_ms: Option<f64>,
    /// Workers' CPU time, summed, ms; `None` in-process.
    pub workers_ms: Option<f64>,
    /// The bench process's own CPU time, ms.
    pub bench_ms: f64,
    /// PostgreSQL's server processes, ms.
    pub postgres_ms: f64,
    /// The machine's busy time, ms, all cores.
    pub machine_busy_ms: f64,
    /// The machine's total time, ms, all cores.
    pub machine_total_ms: f64,
}

impl CpuReading {
    /// Reads everything but the fleet (`engines_ms`, `workers_ms` are left
    /// `None` for the caller to fill).
    ///
    /// Errors: `/proc` unreadable.
    pub fn read_base() -> Result<CpuReading> {
        let (machine_busy_ms, machine_total_ms) = machine_cpu_ms()?;
        Ok(CpuReading {
            engines_ms: None,
            workers_ms: None,
            bench_ms: process_cpu_ms(None, false)?,
            postgres_ms: postgres_cpu_ms()?,
            machine_busy_ms,
            machine_total_ms,
        })
    }

    /// What was spent from `earlier` to `self`.
    pub fn since(&self, earlier: &CpuReading) -> CpuReading {
        let diff = |a: Option<f64>, b: Option<f64>| Some(a? - b?);
        CpuReading {
            engines_ms: diff(self.engines_ms, earlier.engines_ms),
            workers_ms: diff(self.workers_ms, earlier.workers_ms),
            bench_ms: self.bench_ms - earlier.bench_ms,
            postgres_ms: self.postgres_ms - earlier.postgres_ms,
            machine_busy_ms: self.machine_busy_ms - earlier.machine_busy_ms,
            machine_total_ms: self.machine_total_ms - earlier.machine_total_ms,
        }
    }

    /// One line: CPU ms per step by process, and how busy the machine was.
    pub fn per_step_line(&self, steps: u64) -> String {
        let steps = steps.max(1) as f64;
        let per = |ms: f64| format!("{:.3}", ms / steps);
        let fleet = match (self.engines_ms, self.workers_ms) {
            (Some(e), Some(w)) => format!("engines {}, workers {}, ", per(e), per(w)),
            _ => "engines and workers in the bench process, ".to_owned(),
        };
        let accounted = self.engines_ms.unwrap_or(0.0)
            + self.workers_ms.unwrap_or(0.0)
            + self.bench_ms
            + self.postgres_ms;
        format!(
            "cpu ms per step: {fleet}bench (model, tool, client) {}, postgres {}, sum {}, \
             machine busy {} ({:.0}% of {:.0} cores)",
            per(self.bench_ms),
            per(self.postgres_ms),
            per(accounted),
            per(self.machine_busy_ms),
            100.0 * self.machine_busy_ms / self.machine_total_ms.max(f64::EPSILON),
            cores(),
        )
    }
}

fn cores() -> f64 {
    std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_count_from_the_last_parenthesis() {
        // A command name with a space and a parenthesis of its own.
        let line = "4242 (post gres) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 \
                    250 50 7 3 20 0 1 0 100 1000 10";
        assert_eq!(
            parse_stat(line, false),
            Some(("post gres) x".to_owned(), 1, 300))
        );
        assert_eq!(
            parse_stat(line, true),
            Some(("post gres) x".to_owned(), 1, 310))
        );
        assert_eq!(parse_stat("4242 (trunc", false), None);
    }

    #[test]
    fn machine_busy_leaves_out_idle_and_iowait() {
        let text = "cpu  100 5 50 800 40 2 3 0 0 0\ncpu0 1 1 1 1 1 1 1 1 1 1\n";
        assert_eq!(parse_machine(text), Some((1600.0, 10000.0)));
        assert_eq!(parse_machine("cpu0 1 2 3\n"), None);
    }

    #[test]
    fn own_cpu_time_is_readable() -> Result<()> {
        let ms = process_cpu_ms(None, false)?;
        assert!(ms >= 0.0);
        let (busy, total) = machine_cpu_ms()?;
        assert!(busy <= total && total > 0.0);
        Ok(())
    }
}
