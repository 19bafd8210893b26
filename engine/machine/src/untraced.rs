//! `visibility: {trace: false}` parameters at run time: values the model
//! supplies that no record of the run may hold (events, the model's
//! recorded turn and transcript, task specs, the audit, logs, the admin
//! endpoint), and that the tool still receives.
//!
//! The path of one value:
//! 1. The coordinator, receiving a model's answer, calls [`take_untraced`]
//!    before anything is recorded: each such argument of each proposed
//!    call is taken out of the arguments' text and replaced by the
//!    placeholder `{{_secret.<key>}}` of a key unique to the model call,
//!    the call's position in the answer and the parameter ([`arg_key`]);
//!    the coordinator seals the values (`belay_engine::vault`) and hands them in
//!    with [`super::Input::ModelCallCompletedUntraced`]. Without a vault
//!    key it hands in none.
//! 2. Check 2 runs on the arguments with the placeholders (the parameter
//!    is a `string`); then [`sealed_for`] checks that each placeholder has
//!    its sealed value, else the call is refused (check `vault`) before it
//!    can act. The call is scheduled with the placeholders in its
//!    arguments, and in the same transaction the values go into the run's
//!    vault (`Command::VaultSecrets`, table `run_secrets`), so an engine
//!    crash between scheduling and dispatch loses nothing;
//!    `Event::SecretsVaulted` names the keys (path `args.<param>`).
//! 3. Each dispatch reads the call's keys ([`restore_keys`](super::vault::restore_keys), with
//!    `Command::RestoreSecrets`; never consumed, so a retry of an
//!    idempotent call gets them again) and hands them to the worker, which
//!    puts each value in place of its placeholder just before the request.
//!    The run's vault is dropped when the run ends.
//!
//! Pure code: the machine holds only sealed values.

use belay_proto::wire::ModelCallResult;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::state::RunState;
use super::vault::{SealedSecret, placeholder_key};
use belay_definitions::model::ToolDef;

pub use belay_proto::wire::ARG_KEY_PREFIX;

/// What an untraced argument that is not a string becomes in the record:
/// check 2 accepts it as text, and [`sealed_for`] then refuses the call
/// (`invalid_arguments`: the parameter must be a string), without the
/// value ever being recorded.
pub const NOT_A_STRING: &str = "[REDACTED:trace]";

/// What the recorded arguments of a proposed call become when they hold
/// untraced parameters but are not a JSON object: check 2 refuses them as
/// not JSON, and the text the model sent is in no record.
pub const UNREADABLE: &str = "[REDACTED:trace] arguments that are not a JSON object";

/// The vault key of parameter `param` of the `index`-th call the model
/// proposed in model call `model_call_id`: unique in the run, at most 29
/// characters, a valid vault key.
pub fn arg_key(model_call_id: &str, index: usize, param: &str) -> String {
    let mut hash = Sha256::new();
    hash.update(model_call_id.as_bytes());
    hash.update([0]);
    hash.update(index.to_string().as_bytes());
    hash.update([0]);
    hash.update(param.as_bytes());
    let digest = hash.finalize();
    let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
    format!("{ARG_KEY_PREFIX}{hex}")
}

/// The tool named `name` in the run's plan, if it has untraced parameters.
fn untraced_tool<'s>(state: &'s RunState, name: &str) -> Option<&'s ToolDef> {
    state
        .plan
        .as_ref()?
        .tools
        .get(name)
        .map(|t| &t.def)
        .filter(|d| !d.untraced.is_empty())
}

/// Takes the untraced arguments out of `result` (the answer of model call
/// `model_call_id`), before anything of it is recorded: each string value
/// is replaced by its `{{_secret.<key>}}` placeholder and returned as
/// `(key, value)`; a value that is not a string becomes [`NOT_A_STRING`],
/// arguments that are not a JSON object become [`UNREADABLE`]. Calls of
/// tools without untraced parameters are left as they are.
pub fn take_untraced(
    state: &RunState,
    model_call_id: &str,
    result: &mut ModelCallResult,
) -> Vec<(String, String)> {
    let mut taken = Vec::new();
    for (index, call) in result.tool_calls.iter_mut().enumerate() {
        let Some(def) = untraced_tool(state, &call.name) else {
            continue;
        };
        let text = if call.arguments.trim().is_empty() {
            "{}"
        } else {
            call.arguments.as_str()
        };
        let Ok(Value::Object(mut map)) = serde_json::from_str::<Value>(text) else {
            call.arguments = UNREADABLE.to_owned();
            continue;
        };
        let mut changed = false;
        for param in &def.untraced {
            let Some(value) = map.get_mut(param) else {
                continue;
            };
            changed = true;
            match std::mem::take(value) {
                Value::String(s) => {
                    let key = arg_key(model_call_id, index, param);
                    *value = Value::String(format!("{{{{_secret.{key}}}}}"));
                    taken.push((key, s));
                }
                // `null` says nothing; anything else is the model's mistake,
                // kept out of the record all the same.
                Value::Null => *value = Value::Null,
                _ => *value = Value::String(NOT_A_STRING.to_owned()),
            }
        }
        if changed {
            call.arguments = Value::Object(map).to_string();
        }
    }
    taken
}

/// For a call of `def` with (validated) `arguments`: the sealed value of
/// each untraced argument present, with the parameter it belongs to, from
/// `sealed` (what the coordinator sealed for this answer); or why the
/// call is refused: `("invalid_arguments", …)` for a value that is not a
/// string, `("vault", …)` for one the engine could not keep (no vault
/// key). Nothing of a value is in a reason.
pub(super) fn sealed_for(
    def: &ToolDef,
    arguments: &Value,
    sealed: &[SealedSecret],
) -> Result<Vec<(String, SealedSecret)>, (&'static str, String)> {
    let mut out = Vec::new();
    for param in &def.untraced {
        let Some(value) = arguments.get(param) else {
            continue;
        };
        if value.is_null() {
            continue;
        }
        let Some(key) = placeholder_key(value) else {
            return Err((
                "invalid_arguments",
                format!(
                    "`{param}` must be a string (its value is not recorded: `{param}` has `visibility.trace: false`)"
                ),
            ));
        };
        let Some(secret) = sealed.iter().find(|s| s.key == key) else {
            return Err((
                "vault",
                format!(
                    "tool `{}` takes `{param}` with `visibility.trace: false`, and this engine has no vault key to keep the value out of the run's records; the call was not made (the operator sets BELAY_VAULT_KEY)",
                    def.name
                ),
            ));
        };
        out.push((param.clone(), secret.clone()));
    }
    Ok(out)
}

/// The tool and the first parameter of call `call_id` whose value is in
/// the run's vault (a `visibility.trace: false` argument), if any: its
/// dispatch needs the vault key.
pub fn vaulted_argument(state: &RunState, call_id: &str) -> Option<(String, String)> {
    let call = state.tool_calls.get(call_id)?;
    let def = untraced_tool(state, &call.tool)?;
    def.untraced
        .iter()
        .find(|p| {
            call.arguments
                .get(p.as_str())
                .and_then(placeholder_key)
                .is_some()
        })
        .map(|p| (def.name.clone(), p.clone()))
}
