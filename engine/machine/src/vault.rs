//! The run's secret vault as the machine sees it (`RESULT_SECRETS` /
//! `SECRET_ACCESS`, the seed's SecretRef): which keys a producer's result
//! puts into the vault, which keys a consumer's dispatch reads, and when a
//! run's vault is dropped. Values pass through here only encrypted
//! ([`SealedSecret`], sealed by the coordinator, `belay_engine::vault`): the
//! machine never holds a value, and no event holds even a ciphertext (an
//! [`Event::SecretsVaulted`] names the keys and their options).
//!
//! The vault itself lives outside the history (table `run_secrets`): the
//! store writes a [`Command::VaultSecrets`] in the transaction that records
//! the result, reads and consumes in the dispatch's transaction
//! ([`Command::RestoreSecrets`]), and deletes the run's rows when the run
//! ends ([`Command::DropRunSecrets`]). Replay never needs a value: the
//! events say what was vaulted, and a value is only ever used by the
//! request being dispatched.

use std::fmt;

use belay_proto::wire::{ARG_KEY_PREFIX, secret_placeholder_name, split_placeholders};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::step::Step;
use super::{Command, Event, MachineError};
use belay_definitions::model::ToolDef;

/// One vaulted value, encrypted by the coordinator (AES-256-GCM, bound to
/// the run and key). `Debug` shows the key and sizes only.
#[derive(Clone, PartialEq, Eq)]
pub struct SealedSecret {
    /// The vault key.
    pub key: String,
    /// The 96-bit nonce it was sealed with.
    pub nonce: Vec<u8>,
    /// Ciphertext and tag.
    pub ciphertext: Vec<u8>,
}

impl fmt::Debug for SealedSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SealedSecret")
            .field("key", &self.key)
            .field(
                "ciphertext",
                &format_args!("<{} bytes>", self.ciphertext.len()),
            )
            .finish()
    }
}

/// One entry of [`Command::VaultSecrets`]: the sealed value and the options
/// of the tool's `RESULT_SECRETS` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VaultEntry {
    /// The value, sealed (its `key` is the vault key).
    pub sealed: SealedSecret,
    /// Seconds from now (the engine's clock) until it expires; `None`: at
    /// the end of the run.
    pub ttl_s: Option<u64>,
    /// Consumed by the first call that reads it.
    pub single_use: bool,
    /// The tools that may read it; empty: any tool whose `SECRET_ACCESS`
    /// lists the key.
    pub consumers: Vec<String>,
}

/// A key an [`Event::SecretsVaulted`] records: never its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VaultedKey {
    /// The vault key.
    pub key: String,
    /// The result field it was taken from.
    pub path: String,
    /// Seconds from this event's `recorded_at` until it expires; absent:
    /// at the end of the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_s: Option<u64>,
    /// Consumed by the first call that reads it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub single_use: bool,
    /// The tools that may read it (empty: any that lists it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consumers: Vec<String>,
}

impl Step {
    /// After a producer's result was recorded (a [`Event::ToolCallCompleted`]
    /// of `call_id`, not a probe's): its `RESULT_SECRETS` keys go into the
    /// vault. `sealed` are the values the worker took out of the result
    /// (sealed by the coordinator); one the tool does not declare is
    /// dropped, a declared key without a value (the result had no such
    /// field) is recorded as `absent`. A tool without `RESULT_SECRETS`
    /// costs nothing.
    pub(super) fn vault_result(
        &mut self,
        call_id: &str,
        sealed: Vec<SealedSecret>,
    ) -> Result<(), MachineError> {
        let completed = self
            .out
            .events
            .iter()
            .any(|e| matches!(e, Event::ToolCallCompleted { call_id: c, .. } if c == call_id));
        let Some(call) = self.state.tool_calls.get(call_id) else {
            return Ok(());
        };
        if !completed || call.probe_for.is_some() {
            return Ok(());
        }
        let tool = call.tool.clone();
        let declared = match self.plan()?.tools.get(&tool) {
            Some(t) if !t.def.result_secrets.is_empty() => t.def.result_secrets.clone(),
            _ => return Ok(()),
        };
        let mut keys = Vec::new();
        let mut absent = Vec::new();
        let mut entries = Vec::new();
        for def in declared {
            match sealed.iter().find(|s| s.key == def.key) {
                Some(value) => {
                    keys.push(VaultedKey {
                        key: def.key.clone(),
                        path: def.path.clone(),
                        ttl_s: def.ttl_s,
                        single_use: def.single_use,
                        consumers: def.consumers.clone(),
                    });
                    entries.push(VaultEntry {
                        sealed: value.clone(),
                        ttl_s: def.ttl_s,
                        single_use: def.single_use,
                        consumers: def.consumers,
                    });
                }
                None => absent.push(def.key),
            }
        }
        self.emit(Event::SecretsVaulted {
            call_id: call_id.to_owned(),
            tool: tool.clone(),
            keys,
            absent,
        });
        if !entries.is_empty() {
            self.command(Command::VaultSecrets {
                call_id: call_id.to_owned(),
                tool,
                entries,
            });
        }
        Ok(())
    }

    /// At a dispatch of `call_id`: the vault keys its tool's
    /// `SECRET_ACCESS` lists, read (and single-use ones consumed) in the
    /// dispatch's transaction and handed to the worker. None for a tool
    /// that reads nothing.
    pub(super) fn restore_secrets(&mut self, call_id: &str, tool: &str) {
        let def = self
            .state
            .plan
            .as_ref()
            .and_then(|p| p.tools.get(tool))
            .map(|t| &t.def);
        let mut keys = def.map(|d| d.secret_access.clone()).unwrap_or_default();
        // The call's own `visibility.trace: false` arguments.
        if let (Some(def), Some(call)) = (def, self.state.tool_calls.get(call_id)) {
            keys.extend(restore_keys(def, &call.arguments));
        }
        if !keys.is_empty() {
            self.command(Command::RestoreSecrets {
                call_id: call_id.to_owned(),
                tool: tool.to_owned(),
                keys,
            });
        }
    }

    /// Whether any tool of the run's plan puts values into the vault (so
    /// its end must drop them).
    pub(super) fn plan_vaults(&self) -> bool {
        self.state.plan.as_ref().is_some_and(|p| {
            p.tools
                .values()
                .any(|t| !t.def.result_secrets.is_empty() || !t.def.untraced.is_empty())
        })
    }

    /// Right after a call's [`Event::ToolCallScheduled`]: its
    /// `visibility.trace: false` arguments (their sealed values, by
    /// parameter) go into the run's vault in this transaction, readable by
    /// this tool only, never consumed (a retry reads them again), until the
    /// run ends; [`Event::SecretsVaulted`] names the keys (path
    /// `args.<param>`).
    pub(super) fn vault_arguments(
        &mut self,
        call_id: &str,
        tool: &str,
        values: Vec<(String, SealedSecret)>,
    ) {
        if values.is_empty() {
            return;
        }
        let consumers = vec![tool.to_owned()];
        let keys = values
            .iter()
            .map(|(param, sealed)| VaultedKey {
                key: sealed.key.clone(),
                path: format!("args.{param}"),
                ttl_s: None,
                single_use: false,
                consumers: consumers.clone(),
            })
            .collect();
        self.emit(Event::SecretsVaulted {
            call_id: call_id.to_owned(),
            tool: tool.to_owned(),
            keys,
            absent: Vec::new(),
        });
        let entries = values
            .into_iter()
            .map(|(_, sealed)| VaultEntry {
                sealed,
                ttl_s: None,
                single_use: false,
                consumers: consumers.clone(),
            })
            .collect();
        self.command(Command::VaultSecrets {
            call_id: call_id.to_owned(),
            tool: tool.to_owned(),
            entries,
        });
    }
}

/// The vault keys a dispatch of a call of `def` with `arguments` (as
/// recorded: with placeholders) reads back.
pub(super) fn restore_keys(def: &ToolDef, arguments: &Value) -> Vec<String> {
    def.untraced
        .iter()
        .filter_map(|p| arguments.get(p).and_then(placeholder_key))
        .map(str::to_owned)
        .collect()
}

/// The vault key of `value` when it is exactly one `{{_secret.<key>}}`
/// placeholder of an untraced argument.
pub(super) fn placeholder_key(value: &Value) -> Option<&str> {
    let text = value.as_str()?;
    let inner = text.strip_prefix("{{")?.strip_suffix("}}")?;
    // One placeholder, nothing around it.
    if split_placeholders(text).ok()?.len() != 1 {
        return None;
    }
    secret_placeholder_name(inner.trim()).filter(|k| k.starts_with(ARG_KEY_PREFIX))
}
