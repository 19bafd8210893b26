//! The principals of recently verified credentials, kept for a short time
//! (`--key-cache-ms`, default 1 s) so that a worker's stream of requests
//! does not cost one `principals` lookup each: at a few thousand requests a
//! second the lookup was about two of every five PostgreSQL transactions
//! of a step (issue 23).
//!
//! What this trades: a key revoked through *this* engine is forgotten at
//! once ([`KeyCache::forget_key`]); one revoked through another replica,
//! or straight in the database, stops working here within the time to
//! live. A key with an expiry is never kept (its expiry is judged by the
//! database's clock, which this cache cannot read), and neither is a
//! refusal: a wrong or unknown key is looked up every time. Entries are
//! keyed by the SHA-256 of the whole presented credential, so only the
//! exact text that was verified finds one. A time to live of zero turns
//! the cache off.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use std::time::Instant;

use sha2::{Digest, Sha256};

use super::Principal;

/// Most entries kept; past this, expired entries are dropped, and if that
/// is not enough, all of them (a fleet has far fewer live keys).
const MAX_ENTRIES: usize = 4_096;

/// Verified credentials' principals, each until its time to live passes.
#[derive(Debug)]
pub struct KeyCache {
    ttl: Duration,
    entries: Mutex<HashMap<[u8; 32], Cached>>,
    /// Read for every `get` and `put`: the system's monotonic clock, or a
    /// test's.
    now: fn() -> Instant,
}

#[derive(Debug, Clone)]
struct Cached {
    principal: Principal,
    /// The key id it was looked up by (what a revocation names).
    key_id: String,
    until: Instant,
}

impl KeyCache {
    /// A cache keeping each entry for `ttl` (zero: nothing is kept).
    pub fn new(ttl: Duration) -> KeyCache {
        KeyCache {
            ttl,
            entries: Mutex::new(HashMap::new()),
            now: Instant::now,
        }
    }

    /// The principal `credential` (the presented text) proved less than a
    /// time to live ago, if any.
    pub fn get(&self, credential: &str) -> Option<Principal> {
        if self.ttl.is_zero() {
            return None;
        }
        let digest = digest(credential);
        let mut entries = self.entries();
        match entries.get(&digest) {
            Some(c) if c.until > (self.now)() => Some(c.principal.clone()),
            Some(_) => {
                entries.remove(&digest);
                None
            }
            None => None,
        }
    }

    /// Keeps `principal`, which `credential` proved just now by the stored
    /// row of `key_id`.
    pub fn put(&self, credential: &str, key_id: &str, principal: &Principal) {
        if self.ttl.is_zero() {
            return;
        }
        let now = (self.now)();
        let mut entries = self.entries();
        if entries.len() >= MAX_ENTRIES {
            entries.retain(|_, c| c.until > now);
            if entries.len() >= MAX_ENTRIES {
                entries.clear();
            }
        }
        entries.insert(
            digest(credential),
            Cached {
                principal: principal.clone(),
                key_id: key_id.to_owned(),
                until: now + self.ttl,
            },
        );
    }

    /// Drops every entry of `key_id` (it was revoked through this engine).
    pub fn forget_key(&self, key_id: &str) {
        self.entries().retain(|_, c| c.key_id != key_id);
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Cached>> {
        // Every operation leaves the map consistent: ignore poisoning.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn digest(credential: &str) -> [u8; 32] {
    Sha256::digest(credential.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{Role, Tenants};
    use std::cell::Cell;

    thread_local! {
        /// The test clock: a fixed origin plus what `advance` added.
        static OFFSET: Cell<Duration> = const { Cell::new(Duration::ZERO) };
        static ORIGIN: Instant = Instant::now();
    }

    fn test_now() -> Instant {
        ORIGIN.with(|o| *o) + OFFSET.with(Cell::get)
    }

    fn advance(by: Duration) {
        OFFSET.with(|o| o.set(o.get() + by));
    }

    fn cache(ttl: Duration) -> KeyCache {
        KeyCache {
            now: test_now,
            ..KeyCache::new(ttl)
        }
    }

    fn worker() -> Principal {
        Principal {
            id: "pool-a".into(),
            credential: "k1".into(),
            role: Role::Worker,
            tenants: Tenants::Only(vec!["a".into()]),
            grants: vec![],
        }
    }

    #[test]
    fn an_entry_lives_for_its_ttl_and_only_for_the_exact_credential() {
        let cache = cache(Duration::from_secs(1));
        cache.put("belay_k1_secret", "k1", &worker());
        assert_eq!(
            cache.get("belay_k1_secret").map(|p| p.id),
            Some("pool-a".into())
        );
        assert!(cache.get("belay_k1_secreT").is_none(), "another secret");
        advance(Duration::from_millis(999));
        assert!(cache.get("belay_k1_secret").is_some());
        advance(Duration::from_millis(1));
        assert!(
            cache.get("belay_k1_secret").is_none(),
            "a revocation elsewhere shows once the ttl has passed"
        );
    }

    #[test]
    fn a_revocation_here_is_forgotten_at_once_and_zero_keeps_nothing() {
        let cache = cache(Duration::from_secs(60));
        cache.put("belay_k1_secret", "k1", &worker());
        cache.put("belay_k2_secret", "k2", &worker());
        cache.forget_key("k1");
        assert!(cache.get("belay_k1_secret").is_none());
        assert!(cache.get("belay_k2_secret").is_some());
        let off = KeyCache::new(Duration::ZERO);
        off.put("belay_k1_secret", "k1", &worker());
        assert!(off.get("belay_k1_secret").is_none());
    }

    #[test]
    fn a_full_cache_drops_the_expired_then_everything() {
        let cache = cache(Duration::from_secs(1));
        for i in 0..MAX_ENTRIES {
            cache.put(&format!("belay_k{i}_s"), &format!("k{i}"), &worker());
        }
        advance(Duration::from_secs(2));
        cache.put("belay_new_s", "new", &worker());
        assert_eq!(cache.entries().len(), 1, "the expired ones went first");
        for i in 0..MAX_ENTRIES {
            cache.put(&format!("belay_j{i}_s"), &format!("j{i}"), &worker());
        }
        assert!(cache.entries().len() <= MAX_ENTRIES);
    }
}
