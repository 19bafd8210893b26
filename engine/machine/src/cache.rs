//! The durable result cache of `hints.cacheable: true` tools, as the
//! machine sees it: which calls may use it, the key of a call, and what a
//! hit records. The entries live in the store (table `tool_cache`); the
//! machine only asks for a lookup and a write as commands, so it stays pure
//! and a replay never consults the cache:
//!
//! - When a call of a cacheable tool is launched (after the four checks of
//!   a proposal, after a confirmation if the tool asks for one), the
//!   decision carries [`Command::LookupToolCache`](super::Command) right
//!   before the call's `ScheduleTask`. The store looks the key up in the
//!   same transaction; on a hit it leaves the task out and decides
//!   [`Input::ToolCacheHit`](super::Input) on the state after the first
//!   decision, whose `tool_call_completed` (with `cached`) is written in
//!   the same transaction: no task, no worker, no dispatch.
//! - A successful result of a cacheable call (worker, callback or late
//!   result; scrubbed; never an error, a refusal or an uncertain outcome;
//!   never a hit, a probe, or a call that asked a person for input) emits
//!   [`Command::StoreToolCache`](super::Command), written in the
//!   transaction that records it.
//!
//! Key: SHA-256 of (tenant, tool name, the pinned definition's content
//! hash, the arguments the tool receives — parameter sources filled in — as
//! canonical JSON). A new definition of the tool never hits an older one's
//! entries, and two tenants never share one.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::plan::Pinned;
use belay_definitions::model::ToolDef;

/// How long a cached result is served when neither the tool
/// (`hints.cache_ttl`) nor the engine (`--tool-cache-ttl-ms`) says: 5
/// minutes.
pub const DEFAULT_TOOL_CACHE_TTL_MS: u64 = 300_000;

/// Largest result kept in the cache, bytes of JSON: a larger one is
/// recorded in its run as usual and not cached.
pub const MAX_CACHED_RESULT_BYTES: usize = 1024 * 1024;

/// Most cache hits applied in one transition: the hit of a tool node can
/// start the next node, whose call can hit too; past this many, a call is
/// scheduled as a task (a loop over a cached tool node cannot turn inside
/// one transaction).
pub const MAX_CACHE_HITS_PER_TRANSITION: usize = 16;

/// Marks a `tool_call_completed` whose result came from the cache: where
/// the entry came from. Added for issue 4 (result cache).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CachedResult {
    /// The entry's key (hex SHA-256; see the module doc).
    pub key: String,
    /// The run whose call stored the result.
    pub stored_by_run: String,
    /// That call's id.
    pub stored_by_call: String,
    /// When it was stored, by the engine's clock (RFC 3339).
    pub stored_at: String,
    /// When it stops being served (RFC 3339).
    pub expires_at: String,
}

/// A cache entry as the store found it, for [`Input::ToolCacheHit`](super::Input).
#[derive(Debug, Clone, PartialEq)]
pub struct CacheEntry {
    /// Its key.
    pub key: String,
    /// The result.
    pub result: Value,
    /// The run whose call stored it.
    pub stored_by_run: String,
    /// That call's id.
    pub stored_by_call: String,
    /// When it was stored.
    pub stored_at: DateTime<Utc>,
    /// When it expires.
    pub expires_at: DateTime<Utc>,
}

/// The cache key of a call of `tool` with `arguments` in `tenant`'s run.
pub fn key(tenant: &str, tool: &Pinned<ToolDef>, arguments: &Value) -> String {
    let mut text = String::from("belay.tool_cache.v1\n");
    for part in [tenant, &tool.def.name, &tool.content_hash] {
        // Lengths first: no two different tuples give the same text.
        text.push_str(&format!("{}:{part}\n", part.len()));
    }
    canonical_json(arguments, &mut text);
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// `value` as compact JSON with every object's keys in byte order, whatever
/// order the map keeps them in.
pub fn canonical_json(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                canonical_json(&map[k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical_json(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_json_sorts_keys_at_every_level() {
        let mut out = String::new();
        canonical_json(
            &json!({"b": [ {"y": 1, "x": "é\"q"} ], "a": null, "c": {"z": true, "a": 1.5}}),
            &mut out,
        );
        assert_eq!(
            out,
            r#"{"a":null,"b":[{"x":"é\"q","y":1}],"c":{"a":1.5,"z":true}}"#
        );
    }
}
