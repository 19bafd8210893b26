//! Webhook notifications: delivers the outbox rows the engine writes when a
//! run pauses on an uncertain outcome (`notifications`, see
//! [`store::NotificationRow`](crate::store::NotificationRow)).
//!
//! Delivery is at least once: a receiver must deduplicate by the
//! `Belay-Delivery` header (the notification id, also the body's `id`).
//! Each attempt POSTs
//! `{"id": uuid, "type": kind, "created_at": RFC 3339, "data": payload}`
//! with `Content-Type: application/json`, `Belay-Delivery: <id>` and
//! `Belay-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`,
//! the signature scheme of Stripe webhooks
//! (<https://docs.stripe.com/webhooks#verify-manually>): receivers recompute
//! the HMAC over the timestamp, a dot and the raw body, compare in constant
//! time, and reject old timestamps to stop replays ([`verify_signature`]).
//!
//! A 2xx answer delivers the notification; anything else (other statuses,
//! timeouts after [`REQUEST_TIMEOUT`], connection errors; redirects are not
//! followed) schedules the next attempt after [`backoff_after`] (1 s
//! doubling, at most 10 min) until [`MAX_ATTEMPTS`], after which delivery is
//! abandoned (`failed_at`, with `last_error`). The loop runs in the
//! background and never blocks a run transition: rows are claimed in their
//! own short transaction, and no lock is held during HTTP requests.

use std::time::Duration;

use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::Sha256;

use crate::store::{NotificationRow, Store, StoreError};

/// Attempts before delivery is abandoned.
pub const MAX_ATTEMPTS: i32 = 12;
/// Delay after the first failed attempt.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// Longest delay between attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(600);
/// Timeout of one HTTP request (connect, send, answer).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a claim hides a row from other replicas; longer than
/// [`REQUEST_TIMEOUT`], so only a replica that died mid-delivery lets it pass.
pub const CLAIM_LEASE: Duration = Duration::from_secs(60);
/// Most notifications claimed (and delivered concurrently) per round.
pub const BATCH: i64 = 16;
/// Longest excerpt of a receiver's answer kept in `last_error`, bytes.
const ERROR_EXCERPT_BYTES: usize = 300;

/// Errors of the notifier.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// The webhook URL or secret is unusable.
    #[error("invalid webhook configuration: {0}")]
    Config(String),
    /// The HTTP client could not be built.
    #[error("building the webhook HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    /// Claiming or recording a delivery failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The delay before attempt `failed_attempts + 1`, after `failed_attempts`
/// (≥ 1) failures: `FIRST_BACKOFF * 2^(failed_attempts - 1)`, at most
/// [`MAX_BACKOFF`]; 1 s, 2 s, 4 s, ... 512 s, then 600 s.
pub fn backoff_after(failed_attempts: u32) -> Duration {
    let exp = failed_attempts.saturating_sub(1).min(20);
    (FIRST_BACKOFF * (1u32 << exp)).min(MAX_BACKOFF)
}

fn mac(secret: &[u8], timestamp: i64, body: &[u8]) -> Hmac<Sha256> {
    // HMAC accepts keys of any length; `new_from_slice` cannot fail for it.
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC takes keys of any length"),
    };
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// The `Belay-Signature` header value for `body` sent at `timestamp` (unix
/// seconds): `t=<timestamp>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`
/// (Stripe's scheme).
pub fn sign(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    let digest = mac(secret, timestamp, body).finalize().into_bytes();
    format!("t={timestamp},v1={}", hex::encode(digest))
}

/// Check a `Belay-Signature` header against the raw `body`, in constant
/// time; any of several `v1=` entries may match (secret rotation). Returns
/// the signed timestamp (unix seconds) when valid, so the receiver can
/// refuse old ones (Stripe suggests a tolerance of 5 minutes).
pub fn verify_signature(secret: &[u8], header: &str, body: &[u8]) -> Option<i64> {
    let mut timestamp = None;
    let mut signatures = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", t)) => timestamp = t.parse::<i64>().ok(),
            Some(("v1", sig)) => signatures.extend(hex::decode(sig).ok()),
            _ => {}
        }
    }
    let t = timestamp?;
    signatures
        .iter()
        .any(|sig| mac(secret, t, body).verify_slice(sig).is_ok())
        .then_some(t)
}

/// An error and its causes, `outer: cause: root` (reqwest's own message
/// alone, "error sending request", does not say what went wrong).
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Delivers due notifications to one webhook URL.
#[derive(Clone)]
pub struct Notifier {
    url: reqwest::Url,
    secret: Vec<u8>,
    http: reqwest::Client,
    store: Store,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("url", &self.url.as_str())
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// Check a webhook configuration: `url` must be an absolute http or https
/// URL, `secret` non-empty. Returns the parsed URL.
/// Errors: [`NotifyError::Config`] saying which (never echoing the secret).
pub fn check_config(url: &str, secret: &str) -> Result<reqwest::Url, NotifyError> {
    let parsed = reqwest::Url::parse(url)
        .map_err(|e| NotifyError::Config(format!("webhook URL {url:?}: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(NotifyError::Config(format!(
            "webhook URL {url:?} must be http or https"
        )));
    }
    if secret.is_empty() {
        return Err(NotifyError::Config(
            "the webhook secret must not be empty".into(),
        ));
    }
    Ok(parsed)
}

impl Notifier {
    /// A notifier posting to `url` (http or https) signed with `secret`
    /// (non-empty). Errors: [`NotifyError::Config`], [`NotifyError::Client`].
    pub fn new(store: Store, url: &str, secret: &str) -> Result<Notifier, NotifyError> {
        let parsed = check_config(url, secret)?;
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("belay-engine/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(NotifyError::Client)?;
        Ok(Notifier {
            url: parsed,
            secret: secret.as_bytes().to_vec(),
            http,
            store,
        })
    }

    /// Claim the due notifications (at most [`BATCH`]), POST each once
    /// (concurrently), and record the outcomes. Returns how many were
    /// delivered (2xx). A failed POST is not an error: it is recorded on the
    /// row and retried later.
    ///
    /// Errors: [`NotifyError::Store`] when claiming or recording fails (a
    /// delivery whose outcome could not be recorded is retried after
    /// [`CLAIM_LEASE`]: at least once).
    pub async fn deliver_due_once(&self) -> Result<usize, NotifyError> {
        let rows = self
            .store
            .claim_due_notifications(BATCH, CLAIM_LEASE.as_millis() as i64)
            .await?;
        let outcomes = futures_util::future::join_all(rows.iter().map(|row| self.post(row))).await;
        let mut delivered = 0;
        for (row, outcome) in rows.iter().zip(outcomes) {
            match outcome {
                Ok(()) => {
                    self.store
                        .mark_notification_delivered(row.notification_id)
                        .await?;
                    delivered += 1;
                    tracing::info!(notification_id = %row.notification_id, run_id = %row.run_id, attempt = row.attempts, "webhook delivered");
                }
                Err(error) => {
                    let retry = (row.attempts < MAX_ATTEMPTS)
                        .then(|| backoff_after(row.attempts.max(1) as u32).as_millis() as i64);
                    self.store
                        .record_notification_failure(
                            row.notification_id,
                            row.attempts,
                            &error,
                            retry,
                        )
                        .await?;
                    match retry {
                        Some(ms) => {
                            tracing::warn!(notification_id = %row.notification_id, attempt = row.attempts, retry_in_ms = ms, %error, "webhook delivery failed; will retry")
                        }
                        None => {
                            tracing::error!(notification_id = %row.notification_id, attempt = row.attempts, %error, "webhook delivery abandoned after {MAX_ATTEMPTS} attempts")
                        }
                    }
                }
            }
        }
        Ok(delivered)
    }

    /// One POST; `Err` describes the failure for `last_error`.
    async fn post(&self, row: &NotificationRow) -> Result<(), String> {
        let body = json!({
            "id": row.notification_id,
            "type": row.kind,
            "created_at": row.created_at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            "data": row.payload,
        })
        .to_string()
        .into_bytes();
        let signature = sign(&self.secret, chrono::Utc::now().timestamp(), &body);
        let response = self
            .http
            .post(self.url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("Belay-Signature", signature)
            .header("Belay-Delivery", row.notification_id.to_string())
            .body(body)
            .send()
            .await
            .map_err(|e| error_chain(&e.without_url()))?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let text = response.text().await.unwrap_or_default();
        let excerpt = crate::machine::normalize::truncate_str(text.trim(), ERROR_EXCERPT_BYTES);
        Err(if excerpt.is_empty() {
            format!("HTTP {status}")
        } else {
            format!("HTTP {status}: {excerpt}")
        })
    }

    /// Run [`Notifier::deliver_due_once`] every `interval` (again at once
    /// while a full batch was delivered) until the handle is aborted; errors
    /// are logged, never fatal.
    pub fn spawn(self, interval: Duration) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval.max(Duration::from_millis(10)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                loop {
                    match self.deliver_due_once().await {
                        Ok(n) if n as i64 >= BATCH => continue,
                        Ok(_) => break,
                        Err(e) => {
                            tracing::warn!(error = %e, "webhook delivery round failed");
                            break;
                        }
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_one_second_up_to_ten_minutes() {
        let secs: Vec<u64> = (1..=12).map(|n| backoff_after(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 600, 600]);
        assert_eq!(backoff_after(0), FIRST_BACKOFF);
        assert_eq!(backoff_after(u32::MAX), MAX_BACKOFF);
    }

    #[test]
    fn signatures_follow_the_stripe_scheme() {
        // HMAC-SHA256("whsec", "1700000000.{}"), computed independently:
        // printf '1700000000.{}' | openssl dgst -sha256 -hmac whsec
        let header = sign(b"whsec", 1_700_000_000, b"{}");
        assert_eq!(
            header,
            "t=1700000000,v1=7d44587dddbaf4c7f70fef20f48cd594834ffea1641e3ac227b84408298738af"
        );
        assert_eq!(
            verify_signature(b"whsec", &header, b"{}"),
            Some(1_700_000_000)
        );
        assert_eq!(verify_signature(b"other", &header, b"{}"), None);
        assert_eq!(verify_signature(b"whsec", &header, b"{ }"), None);
        let rotated = format!("t=1700000000,v1=00ff,{}", &header[13..]);
        assert_eq!(
            verify_signature(b"whsec", &rotated, b"{}"),
            Some(1_700_000_000)
        );
        assert_eq!(verify_signature(b"whsec", "v1=00", b"{}"), None);
    }
}
