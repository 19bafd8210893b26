//! Parameters the model does not supply (a non-`model` `source:`, or
//! `hidden: true`, in a tool's `parameters:` block): a call that names one
//! is refused, and each one is filled in when the call is proposed, so the
//! arguments recorded in `tool_call_scheduled` are the ones the tool gets.
//!
//! Pure, like the rest of the machine: every value comes from the run's
//! state (its recorded events) and the call being proposed, none from a
//! clock: a `source: runtime` time (`time`, `date`, `unix_ms`) is the
//! transition's time the store handed in ([`RunState::now`]), and lands in
//! the recorded arguments like every other value. A `source: config`
//! parameter gets the placeholder
//! `{{config.NAME}}`; the worker puts the value in at dispatch
//! (`ToolCallSpec::config_params`), so no event holds it.

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Map, Value};

use belay_definitions::expr::ExprError;
use belay_definitions::model::{AuthField, InjectedParam, ParamSource, RuntimeField, ToolDef};

/// What a call knows about itself and its run, for `source: runtime` and
/// `source: auth`.
///
/// [`RunState::now`]: super::RunState::now
pub(super) struct CallFacts<'a> {
    /// The run's id.
    pub run_id: &'a str,
    /// The node the call belongs to.
    pub node_id: &'a str,
    /// The call's id.
    pub call_id: &'a str,
    /// The call's idempotency key.
    pub idempotency_key: &'a str,
    /// The run's tenant.
    pub tenant: &'a str,
    /// Who started the run.
    pub caller: &'a str,
    /// The time the call is proposed ([`RunState::now`](super::RunState::now)).
    pub now: Option<DateTime<Utc>>,
}

/// The injected parameters among `args`' keys, in the tool's order: the
/// model (or a workflow's `args`) may not set them.
pub(super) fn sent_anyway<'d>(def: &'d ToolDef, args: &Map<String, Value>) -> Vec<&'d str> {
    def.injected
        .iter()
        .filter(|p| args.contains_key(&p.name))
        .map(|p| p.name.as_str())
        .collect()
}

/// The refusal for [`sent_anyway`] parameters, as the model reads it.
pub(super) fn not_yours(names: &[&str]) -> String {
    let list: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    format!(
        "arguments may not include {}: the system supplies {}; call the tool without {}",
        list.join(", "),
        if names.len() == 1 { "it" } else { "them" },
        if names.len() == 1 { "it" } else { "them" },
    )
}

/// The JSON placeholder a `source: config` parameter carries until the
/// worker resolves it.
pub(super) fn config_placeholder(name: &str) -> String {
    format!("{{{{config.{name}}}}}")
}

/// Fill every injected parameter of `def` into `args` (the model's
/// arguments, defaults filled in). `document` is the run's state document;
/// `expr` and `lookup` read it with the model's arguments at `.args`.
///
/// A source that gives `null` (or a lookup that misses) falls back to the
/// parameter's default; with none, a required parameter is an error and an
/// optional one is left out. Errors name the parameter and its source,
/// never a value (the text goes back to the model, from which the values
/// are hidden).
pub(super) fn inject(
    def: &ToolDef,
    args: &mut Map<String, Value>,
    document: &Value,
    facts: &CallFacts<'_>,
) -> Result<(), String> {
    if def.injected.is_empty() {
        return Ok(());
    }
    let mut with_args = document.clone();
    if let Value::Object(map) = &mut with_args {
        map.insert("args".into(), Value::Object(args.clone()));
    }
    let mut filled = Vec::with_capacity(def.injected.len());
    for param in &def.injected {
        let value = source_value(param, document, &with_args, facts)?;
        let value = match value {
            Value::Null => param.default.clone().unwrap_or(Value::Null),
            v => v,
        };
        if value.is_null() {
            if param.required {
                return Err(format!(
                    "parameter `{}` ({}) has no value here and no default",
                    param.name,
                    describe(&param.source)
                ));
            }
            continue;
        }
        if let Some(schema) = def
            .input_schema
            .get("properties")
            .and_then(|p| p.get(&param.name))
            && belay_definitions::validate_json(schema, &value).is_err()
        {
            return Err(format!(
                "parameter `{}` ({}) got a value that does not match its type",
                param.name,
                describe(&param.source)
            ));
        }
        filled.push((param.name.clone(), value));
    }
    args.extend(filled);
    Ok(())
}

/// One parameter's value from its source (`null`: none).
fn source_value(
    param: &InjectedParam,
    document: &Value,
    with_args: &Value,
    facts: &CallFacts<'_>,
) -> Result<Value, String> {
    let failed = |e: ExprError| {
        // A jq runtime error may quote the value it choked on.
        let why = match e {
            ExprError::Runtime { .. } => "a jq error".to_owned(),
            other => other.to_string(),
        };
        format!(
            "parameter `{}` ({}) could not be computed: {why}",
            param.name,
            describe(&param.source)
        )
    };
    Ok(match &param.source {
        ParamSource::System { expr } => expr.eval(document).map_err(failed)?,
        ParamSource::Expr { expr } => expr.eval(with_args).map_err(failed)?,
        ParamSource::Lookup { key, table } => {
            let key = match key.eval(with_args).map_err(failed)? {
                Value::String(s) => s,
                Value::Null => return Ok(Value::Null),
                v @ (Value::Number(_) | Value::Bool(_)) => v.to_string(),
                _ => {
                    return Err(format!(
                        "parameter `{}` ({}): the key is not a string, number or boolean",
                        param.name,
                        describe(&param.source)
                    ));
                }
            };
            table.get(&key).cloned().unwrap_or(Value::Null)
        }
        ParamSource::Runtime { field } => match field {
            RuntimeField::RunId => Value::String(facts.run_id.to_owned()),
            RuntimeField::NodeId => Value::String(facts.node_id.to_owned()),
            RuntimeField::CallId => Value::String(facts.call_id.to_owned()),
            RuntimeField::IdempotencyKey => Value::String(facts.idempotency_key.to_owned()),
            RuntimeField::Tenant => Value::String(facts.tenant.to_owned()),
            RuntimeField::Time | RuntimeField::Date | RuntimeField::UnixMs => {
                facts.now.map_or(Value::Null, |now| time_value(*field, now))
            }
        },
        ParamSource::Auth { field } => Value::String(
            match field {
                AuthField::Caller => facts.caller,
                AuthField::Tenant => facts.tenant,
            }
            .to_owned(),
        ),
        ParamSource::Config { name } => Value::String(config_placeholder(name)),
        ParamSource::Literal { value } => value.clone(),
    })
}

/// A `source: runtime` time value of `now`: RFC 3339 UTC with ms, the UTC
/// date, or ms since the Unix epoch.
fn time_value(field: RuntimeField, now: DateTime<Utc>) -> Value {
    match field {
        RuntimeField::Date => Value::String(now.format("%Y-%m-%d").to_string()),
        RuntimeField::UnixMs => Value::from(now.timestamp_millis()),
        _ => Value::String(now.to_rfc3339_opts(SecondsFormat::Millis, true)),
    }
}

/// The time values of `def`'s `source: runtime` parameters in `recorded`
/// (a call's arguments as proposed) put back into `args`: a call's time is
/// when it was proposed, so an approver's edit, which fills the other
/// parameters in again, keeps it (the approver saw it).
pub(super) fn keep_proposal_time(def: &ToolDef, recorded: &Value, args: &mut Map<String, Value>) {
    for p in &def.injected {
        if let ParamSource::Runtime { field } = p.source
            && field.is_time()
            && let Some(v) = recorded.get(&p.name)
        {
            args.insert(p.name.clone(), v.clone());
        }
    }
}

/// `source: system \`.input.id\`` and the like, for messages.
fn describe(source: &ParamSource) -> String {
    match source {
        ParamSource::System { expr } => format!("`source: system` `{}`", expr.source()),
        ParamSource::Expr { expr } => format!("`source: expr` `{}`", expr.source()),
        ParamSource::Lookup { key, .. } => format!("`source: lookup` by `{}`", key.source()),
        ParamSource::Runtime { .. } => "`source: runtime`".to_owned(),
        ParamSource::Auth { .. } => "`source: auth`".to_owned(),
        ParamSource::Config { name } => format!("`source: config` `{name}`"),
        ParamSource::Literal { .. } => "a fixed `value:`".to_owned(),
    }
}

/// The names of `def`'s `source: config` parameters, for the task spec.
pub(super) fn config_params(def: &ToolDef) -> Vec<String> {
    def.injected
        .iter()
        .filter(|p| matches!(p.source, ParamSource::Config { .. }))
        .map(|p| p.name.clone())
        .collect()
}
