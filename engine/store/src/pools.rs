//! Worker pools (issue 21), what both backends share: which ready tasks a
//! claim may take ([`ClaimFilter`]), the workers that claimed lately
//! ([`LiveWorker`], table `workers`), and the ready tasks none of them can
//! take ([`UnclaimableTask`], with why). The tags are those of
//! `belay_proto::pools`; the SQL is in `postgres/workers.rs` and
//! `sqlite/workers.rs`.

use uuid::Uuid;

/// Which ready tasks a claim may take.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClaimFilter<'a> {
    /// Only tasks of these tenants (`None`: any tenant; an empty list: none).
    pub tenants: Option<&'a [String]>,
    /// Only tasks whose requirements are all among these capability tags
    /// (`None`: any task, what a worker older than worker pools claims).
    pub capabilities: Option<&'a [String]>,
}

/// A worker that claimed within the liveness window (`workers` row).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveWorker {
    /// Its worker id.
    pub worker_id: String,
    /// The capability tags it claimed with; `None`: it named none (an
    /// older worker, which takes any task).
    pub capabilities: Option<Vec<String>>,
    /// The tenants its key serves; `None`: every tenant.
    pub tenants: Option<Vec<String>>,
}

impl LiveWorker {
    /// Whether this worker serves tenant `tenant`.
    pub fn serves(&self, tenant: &str) -> bool {
        self.tenants
            .as_ref()
            .is_none_or(|t| t.iter().any(|x| x == tenant))
    }

    /// Whether it has the tag `tag` (a worker without capabilities has all).
    pub fn has(&self, tag: &str) -> bool {
        self.capabilities
            .as_ref()
            .is_none_or(|c| c.iter().any(|x| x == tag))
    }
}

/// A ready task no live worker can take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnclaimableTask {
    /// Task id.
    pub task_id: Uuid,
    /// Its run.
    pub run_id: Uuid,
    /// Its tenant.
    pub tenant: String,
    /// `model_call` or `tool_call`.
    pub kind: String,
    /// Every requirement of the task.
    pub requires: Vec<String>,
    /// The requirements no live worker serving the tenant has; empty when
    /// each is held by some worker but none has them all, or when no
    /// worker serving the tenant is live.
    pub missing: Vec<String>,
    /// For people: `no live worker has mcp:time`.
    pub reason: String,
}

/// The columns of a ready task the unclaimable queries read.
pub(crate) struct ReadyTask {
    pub(crate) task_id: Uuid,
    pub(crate) run_id: Uuid,
    pub(crate) tenant: String,
    pub(crate) kind: String,
    pub(crate) requires: Vec<String>,
}

impl ReadyTask {
    /// The task, judged against the live workers (which the query found
    /// unable to take it): what is missing and why.
    pub(crate) fn unclaimable(self, live: &[LiveWorker]) -> UnclaimableTask {
        let serving: Vec<&LiveWorker> = live.iter().filter(|w| w.serves(&self.tenant)).collect();
        let missing: Vec<String> = if serving.is_empty() {
            Vec::new()
        } else {
            self.requires
                .iter()
                .filter(|r| !serving.iter().any(|w| w.has(r)))
                .cloned()
                .collect()
        };
        let reason = if serving.is_empty() {
            format!("no live worker serves tenant `{}`", self.tenant)
        } else if !missing.is_empty() {
            format!("no live worker has {}", missing.join(", "))
        } else {
            format!("no live worker has all of {}", self.requires.join(", "))
        };
        UnclaimableTask {
            task_id: self.task_id,
            run_id: self.run_id,
            tenant: self.tenant,
            kind: self.kind,
            requires: self.requires,
            missing,
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(caps: Option<&[&str]>, tenants: Option<&[&str]>) -> LiveWorker {
        let strings = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
        LiveWorker {
            worker_id: "w".into(),
            capabilities: caps.map(strings),
            tenants: tenants.map(strings),
        }
    }

    fn task(requires: &[&str]) -> ReadyTask {
        ReadyTask {
            task_id: Uuid::nil(),
            run_id: Uuid::nil(),
            tenant: "acme".into(),
            kind: "tool_call".into(),
            requires: requires.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn the_reason_names_what_no_live_worker_of_the_tenant_has() {
        let none = task(&["mcp:a"]).unclaimable(&[]);
        assert_eq!(none.reason, "no live worker serves tenant `acme`");
        let other_tenant = [worker(None, Some(&["beta"]))];
        assert!(task(&[]).unclaimable(&other_tenant).missing.is_empty());
        let live = [
            worker(Some(&["mcp:a"]), None),
            worker(Some(&["pool:p"]), Some(&["acme"])),
            worker(Some(&["mcp:b"]), Some(&["beta"])),
        ];
        let t = task(&["mcp:a", "mcp:b"]).unclaimable(&live);
        assert_eq!(t.missing, ["mcp:b"]);
        assert_eq!(t.reason, "no live worker has mcp:b");
        let t = task(&["mcp:a", "pool:p"]).unclaimable(&live);
        assert!(t.missing.is_empty());
        assert_eq!(t.reason, "no live worker has all of mcp:a, pool:p");
    }
}
