//! Which `request_variants:` item a call of a `type: http` tool sends
//! (seed: abl-tools › Request variants).
//!
//! The choice is made once, in the transition that schedules the call
//! (or approves it, with the approver's arguments), from the arguments as
//! they will be sent: the variants are tried in file order, and the first
//! whose `when` gives `true` is chosen; when none does, the one with
//! `default: true`; when there is none, the tool's own request. Its name
//! is recorded in the event (`tool_call_scheduled.variant`,
//! `confirmation_decided.variant`, `reconcile_probe_scheduled.variant`),
//! the call's state keeps it, and the task spec carries the chosen
//! request with the name (`ToolCallSpec.variant`): the worker sends what
//! the spec says, and a spec built again for the same call (a new
//! idempotency key, an answered question) uses the recorded name without
//! evaluating again. A replay folds the events and evaluates nothing.
//!
//! A `when` that fails (a jq error, or a value other than `true` or
//! `false`) chooses nothing: the call is refused before anything is sent
//! (`request_variant`, told to the model), since sending the tool's own
//! request instead could send it where the author meant it not to go.

use belay_proto::wire::{HttpBinding, ToolBinding};
use serde_json::Value;

use belay_definitions::model::{RequestVariantDef, ToolDef};

/// The name of the variant `def` sends for `arguments`; `None` when the
/// tool has no variants or none applies and there is no default. `Err`
/// says why no choice could be made.
pub(super) fn choose(def: &ToolDef, arguments: &Value) -> Result<Option<String>, String> {
    for variant in &def.request_variants {
        let Some(when) = &variant.when else {
            continue;
        };
        match when.eval(arguments) {
            Ok(Value::Bool(true)) => return Ok(Some(variant.name.clone())),
            Ok(Value::Bool(false)) => {}
            Ok(other) => {
                let mut shown = other.to_string();
                if shown.len() > 100 {
                    shown = format!("{}…", shown.chars().take(100).collect::<String>());
                }
                return Err(format!(
                    "the `when` of request variant `{}` of tool `{}` gave {shown}, not true or false",
                    variant.name, def.name
                ));
            }
            Err(e) => {
                return Err(format!(
                    "the `when` of request variant `{}` of tool `{}` failed: {e}",
                    variant.name, def.name
                ));
            }
        }
    }
    Ok(def
        .request_variants
        .iter()
        .find(|v| v.default)
        .map(|v| v.name.clone()))
}

/// The variant of `def` named `name`.
pub(super) fn named<'d>(def: &'d ToolDef, name: &str) -> Option<&'d RequestVariantDef> {
    def.request_variants.iter().find(|v| v.name == name)
}

/// `binding` (the tool's `type: http` request) as `variant` sends it.
pub(super) fn apply(binding: ToolBinding, variant: &RequestVariantDef) -> ToolBinding {
    match binding {
        ToolBinding::Http(base) => ToolBinding::Http(HttpBinding {
            endpoint: variant.endpoint.clone(),
            method: variant.method.clone(),
            headers: variant.headers.clone(),
            timeout_ms: base.timeout_ms,
            request: variant.request.clone(),
        }),
        other => other,
    }
}
