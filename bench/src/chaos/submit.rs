//! Submitting the runs while the faults go on: run `i` is started at `i /
//! runs` of the submission window, through the engines' proxies in turn,
//! with the idempotency key `chaos-<batch>-<i>`. A `StartRun` that fails
//! (an engine killed, a connection dropped, PostgreSQL restarting) is sent
//! again with the same key, to the next engine, until one answers: a run
//! the engine acknowledged must exist exactly once, whichever attempt
//! created it.

use std::time::Duration;

use belay_sdk::{Client, StartOptions};
use serde_json::json;
use tokio::time::Instant;
use uuid::Uuid;

use super::definitions::{PERMISSION, WORKFLOW};

/// How long one `StartRun` may take before it is sent again.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between two attempts.
const RETRY_PAUSE: Duration = Duration::from_millis(300);

/// What became of one run's submission.
#[derive(Debug, Clone)]
pub struct Submission {
    /// Its number.
    pub index: u32,
    /// The idempotency key every attempt sent.
    pub key: String,
    /// Every run id an attempt was answered with (one, when all is well).
    pub run_ids: Vec<Uuid>,
    /// Attempts made.
    pub attempts: u32,
    /// The last error, when no attempt was answered.
    pub last_error: Option<String>,
}

/// The idempotency key of run `index` of `batch`.
pub fn run_key(batch: &str, index: u32) -> String {
    format!("chaos-{batch}-{index}")
}

/// Submits `runs` runs spread over `window`, each retried until answered
/// or until `give_up_at`; returns them in order.
pub async fn submit_all(
    clients: Vec<Client>,
    runs: u32,
    window: Duration,
    give_up_at: Instant,
    batch: &str,
) -> Vec<Submission> {
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..runs {
        let at = start + window.mul_f64(f64::from(index) / f64::from(runs.max(1)));
        let clients = clients.clone();
        let key = run_key(batch, index);
        tasks.spawn(async move {
            tokio::time::sleep_until(at).await;
            submit_one(&clients, index, key, give_up_at).await
        });
    }
    let mut done = Vec::with_capacity(runs as usize);
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(submission) => done.push(submission),
            Err(e) => tracing::error!(error = %e, "a submitter panicked"),
        }
    }
    done.sort_by_key(|s| s.index);
    done
}

async fn submit_one(
    clients: &[Client],
    index: u32,
    key: String,
    give_up_at: Instant,
) -> Submission {
    let mut submission = Submission {
        index,
        key,
        run_ids: Vec::new(),
        attempts: 0,
        last_error: None,
    };
    let input = json!({ "i": index });
    loop {
        let client = &clients[(index + submission.attempts) as usize % clients.len()];
        submission.attempts += 1;
        let options = StartOptions {
            idempotency_key: submission.key.clone(),
            caller: "belay-chaos".to_owned(),
            caller_grants: vec![PERMISSION.to_owned()],
        };
        let answer =
            tokio::time::timeout(ATTEMPT_TIMEOUT, client.start_run(WORKFLOW, &input, options))
                .await;
        match answer {
            Ok(Ok((run, _))) => match Uuid::parse_str(&run.run_id) {
                Ok(id) => {
                    submission.run_ids.push(id);
                    submission.last_error = None;
                    return submission;
                }
                Err(e) => submission.last_error = Some(format!("run id {:?}: {e}", run.run_id)),
            },
            Ok(Err(e)) => submission.last_error = Some(e.to_string()),
            Err(_) => submission.last_error = Some("no answer within 10 s".to_owned()),
        }
        if Instant::now() + RETRY_PAUSE > give_up_at {
            return submission;
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}
