//! The figures behind the engine's database gauges (`/metrics`): the backlog
//! of ready tasks, open uncertain outcomes, and paused and waiting runs by
//! reason. The statements are in the backends (`postgres/gauges.rs`,
//! `sqlite/gauges.rs`); both classify a run's free-text `status_reason`
//! with the same SQL ([`PAUSED_REASON_SQL`], [`WAITING_REASON_SQL`]), so a
//! label never carries a run's own ids and its values are bounded.

/// SQL (both dialects): the reason label of a paused run from
/// `runs.status_reason`: `uncertain_outcome` when an uncertain outcome holds
/// it (`RunState::refresh_pause` writes `uncertain outcome: …`), else
/// `operator`.
pub(crate) const PAUSED_REASON_SQL: &str = "CASE WHEN status_reason LIKE 'uncertain outcome:%' THEN 'uncertain_outcome' ELSE 'operator' END";

/// SQL (both dialects): the reason label of a waiting run from
/// `runs.status_reason`, as `RunState::waiting_reason` words it: one of
/// `confirmation`, `input`, `callback`, `child_run`, `approval`, `signal`,
/// `timer`, else `other`.
pub(crate) const WAITING_REASON_SQL: &str = "CASE
    WHEN status_reason LIKE '% waits for a confirmation %' THEN 'confirmation'
    WHEN status_reason LIKE '% waits for input %' THEN 'input'
    WHEN status_reason LIKE '% waits for its callback%' THEN 'callback'
    WHEN status_reason LIKE '% waits for child run %' THEN 'child_run'
    WHEN status_reason LIKE '% waits for an approval %' THEN 'approval'
    WHEN status_reason LIKE '% waits for signal %' THEN 'signal'
    WHEN status_reason LIKE '% waits for a timer%' THEN 'timer'
    ELSE 'other' END";

/// SQL (either dialect): the pool task `t` names, from its `pool:<name>`
/// requirement ([`POOL_TAG_PREFIX`]), "" for none; `tags` is the dialect's
/// row source of `t.requires` and `tag` its column.
pub(crate) fn task_pool_sql(tags: &str, tag: &str) -> String {
    format!(
        "COALESCE((SELECT substr({tag}, {start}) FROM {tags} WHERE {tag} LIKE '{POOL_TAG_PREFIX}%' LIMIT 1), '')",
        start = POOL_TAG_PREFIX.len() + 1,
    )
}

/// The prefix of a pool requirement (`belay_proto::pools::pool_tag`).
pub const POOL_TAG_PREFIX: &str = "pool:";

/// The pool `requires` (a task's requirements) names, "" for none: the
/// `pool` label of the backlog gauge, as [`task_pool_sql`] computes it.
pub fn pool_of(requires: &[String]) -> &str {
    requires
        .iter()
        .find_map(|tag| tag.strip_prefix(POOL_TAG_PREFIX))
        .unwrap_or("")
}

/// The database's figures for the gauges, each a list of `(label value,
/// count)` pairs (the backlog by `(kind, pool, count)`); a label value with
/// no rows is absent (the engine shows it as 0 once it has seen it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GaugeCounts {
    /// Ready, unclaimed tasks that are claimable now (their backoff is
    /// over and their run admits tasks), by kind (`model_call`,
    /// `tool_call`) and the pool they name ("" for none, [`pool_of`]):
    /// the backlog workers have not taken yet.
    pub tasks_ready: Vec<(String, String, i64)>,
    /// Open uncertain outcomes, by tenant.
    pub uncertain_open: Vec<(String, i64)>,
    /// Paused runs, by reason ([`PAUSED_REASON_SQL`]).
    pub runs_paused: Vec<(String, i64)>,
    /// Waiting runs, by reason ([`WAITING_REASON_SQL`]).
    pub runs_waiting: Vec<(String, i64)>,
}

/// Connections of the store's pools (for SQLite, its writer and readers
/// together).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolConnections {
    /// Open and idle.
    pub idle: u32,
    /// Open and handed out.
    pub in_use: u32,
}

/// `(gauge, label value, pool, count)` rows of a backend's statement into
/// [`GaugeCounts`], in label order; `pool` is the second label of the
/// backlog's rows, "" in the others. A row of an unknown gauge is ignored.
pub(crate) fn sort_counts(mut rows: Vec<(String, String, String, i64)>) -> GaugeCounts {
    rows.sort();
    let mut out = GaugeCounts::default();
    for (gauge, label, pool, count) in rows {
        let list = match gauge.as_str() {
            "ready" => {
                out.tasks_ready.push((label, pool, count));
                continue;
            }
            "uncertain" => &mut out.uncertain_open,
            "paused" => &mut out.runs_paused,
            "waiting" => &mut out.runs_waiting,
            _ => continue,
        };
        list.push((label, count));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_label_is_the_pool_a_task_names() {
        let tags = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            pool_of(&tags(&["mcp:a", &belay_proto::pools::pool_tag("gpu")])),
            "gpu"
        );
        assert_eq!(pool_of(&tags(&["mcp:a", "http_base_url"])), "");
        assert_eq!(pool_of(&[]), "");
    }

    #[test]
    fn backlog_rows_keep_their_pool_and_the_others_ignore_it() {
        let row = |g: &str, l: &str, p: &str, n| (g.to_owned(), l.to_owned(), p.to_owned(), n);
        let counts = sort_counts(vec![
            row("ready", "tool_call", "gpu", 2),
            row("uncertain", "acme", "", 1),
            row("ready", "tool_call", "", 3),
        ]);
        assert_eq!(
            counts.tasks_ready,
            [
                ("tool_call".to_owned(), String::new(), 3),
                ("tool_call".to_owned(), "gpu".to_owned(), 2)
            ]
        );
        assert_eq!(counts.uncertain_open, [("acme".to_owned(), 1)]);
    }
}
