//! `hints.cacheable` and `hints.cache_ttl` of a tool in a `.tools.abl` file
//! (seed `abl-tools.md`: "Hints", "Caching hints"; `cache_ttl` is a Belay
//! extension), checked when the file is parsed. What a cached call does at
//! run time is `belay_machine::cache`.
//!
//! Rules:
//! - `cacheable: true` says a call's result may be served again, for the
//!   same tenant, to a call of the same tool definition with the same
//!   arguments. That is only true of a tool that changes nothing, so it is
//!   refused on a tool that says it has side effects (`effect:
//!   state_write`/`side_effect`, `hints.side_effects: true`), on one that is
//!   not `repeat_safety: idempotent` (`never` and `reconcile` are for tools
//!   whose effect must not happen twice, which a cache would hide; an MCP
//!   tool that leaves repeat safety to its server must declare it), on a
//!   `type: workflow` tool (a call starts a child run), and with
//!   `scrub_secrets: false` (the cache keeps results outside the run, for
//!   every run of the tenant, and keeps only scrubbed ones).
//! - A parameter the engine fills with something unique to each call
//!   (`source: runtime` `call_id`, `idempotency_key`, `time`, `unix_ms`)
//!   makes every call's arguments, and so its key, different: the cache
//!   could never serve it, so `cacheable: true` is refused with it too
//!   (`date`, `run_id`, `node_id` and `tenant` repeat, and are allowed).
//! - `cache_ttl:` (how long an entry is served: ms, or text like `30s`,
//!   `5m`, `1h`; at most 7 days) needs `cacheable: true`. Without it, the
//!   engine's `--tool-cache-ttl-ms` applies.
//! - An HTTP tool whose method may change something (`POST`, the default,
//!   `PUT`, `PATCH`, `DELETE`) must say it does not (`effect: read_only` or
//!   `hints.side_effects: false`) to be cacheable; `GET` need not. (A `request_variants:` item's method is not
//!   judged: the base request's is.)
//! - `cacheable: false` (or nothing) never caches.

use super::super::model::{
    Effect, InjectedParam, MAX_CACHE_TTL_MS, ParamSource, RepeatSafety, RuntimeField,
};
use super::lines::Cx;
use super::props::{BindingType, Props};

/// `hints.cache_ttl`'s value, ms; the error says what is wrong with it.
pub(super) fn parse_ttl(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let ms = if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        text.parse::<u64>().ok()
    } else {
        match humantime::parse_duration(text) {
            Ok(d) => Some(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            Err(e) => {
                return Err(format!(
                    "`cache_ttl: {text}` is not a duration ({e}): write ms as a number, or text like `30s`, `5m`, `1h`"
                ));
            }
        }
    };
    match ms {
        Some(0) => Err(
            "`cache_ttl` must be more than 0 (leave `cacheable: true` out to cache nothing)".into(),
        ),
        Some(ms) if ms <= MAX_CACHE_TTL_MS => Ok(ms),
        _ => Err(format!(
            "`cache_ttl: {text}` is longer than 7 days, the longest a result is served from the cache"
        )),
    }
}

/// Checks `hints.cacheable` and `hints.cache_ttl` of tool `name` against
/// its other properties and its `injected` parameters (see the module's
/// rules). `repeat_safety_written`: the tool wrote `repeat_safety:` (an MCP
/// tool may leave it to its server).
pub(super) fn check(
    props: &Props<'_>,
    injected: &[(InjectedParam, (u32, u32))],
    name: &str,
    repeat_safety_written: bool,
    cx: &mut Cx<'_>,
) {
    let cacheable = props.hints.cacheable == Some(true);
    if !cacheable {
        if let Some(&(line, col)) = props.hint_at.get("cache_ttl") {
            cx.error(
                line,
                col,
                "`hints.cache_ttl` goes with `hints.cacheable: true`: without it nothing is cached",
            );
        }
        return;
    }
    let Some(&(line, col)) = props.hint_at.get("cacheable") else {
        return;
    };
    let mut refuse = |why: String| {
        cx.error(
            line,
            col,
            format!(
                "`cacheable: true` does not fit tool `{name}`: {why}; a cached result is served instead of calling the tool"
            ),
        )
    };
    match props.effect {
        Some((effect @ (Effect::StateWrite | Effect::SideEffect), _, _)) => refuse(format!(
            "it declares `effect: {}`",
            if effect == Effect::StateWrite {
                "state_write"
            } else {
                "side_effect"
            }
        )),
        _ if props.hints.side_effects == Some(true) => {
            refuse("it declares `hints.side_effects: true`".into())
        }
        _ => {}
    }
    // An HTTP method that may change something (POST, the default, PUT,
    // PATCH, DELETE) needs the tool to say it does not.
    let declares_read = matches!(props.effect, Some((Effect::ReadOnly, _, _)))
        || props.hints.side_effects == Some(false);
    if matches!(
        props.binding_type,
        Some(BindingType::Http | BindingType::AsyncWebhook)
    ) && !declares_read
    {
        let method = props.method.as_deref().unwrap_or("POST");
        if method != "GET" {
            refuse(format!(
                "it sends `{method}`{}, which may change something; declare `effect: read_only` (or `hints.side_effects: false`) if it does not",
                if props.method.is_none() {
                    " (the default method)"
                } else {
                    ""
                }
            ));
        }
    }
    // A cached result would skip the vault: a producer's hit puts nothing
    // into it, and a consumer's key (its arguments) leaves out the secret
    // its request carried, so an authenticated result would be served to a
    // run without the secret.
    if props.result_secrets.is_some() {
        refuse("it declares `RESULT_SECRETS:`, and a cached result would put nothing into the run's vault".into());
    }
    if props.secret_access.is_some() {
        refuse("it declares `SECRET_ACCESS:`, and the cache key (its arguments) leaves out the secret its request carries".into());
    }
    match (props.repeat_safety, repeat_safety_written) {
        (Some(RepeatSafety::Idempotent), true) => {}
        (Some(r @ (RepeatSafety::Never | RepeatSafety::Reconcile)), true) => refuse(format!(
            "it is `repeat_safety: {}` (a call whose effect must not happen twice); only an `idempotent` tool that changes nothing may be cached",
            r.as_str()
        )),
        (_, false) if props.binding_type == Some(BindingType::Mcp) => refuse(
            "it leaves its repeat safety to the MCP server's hints; declare `repeat_safety: idempotent`".into(),
        ),
        _ => {}
    }
    if props.binding_type == Some(BindingType::Workflow) {
        refuse("it is `type: workflow`, and each call starts a child run".into());
    }
    for (param, _) in injected {
        let unique = match param.source {
            ParamSource::Runtime {
                field: RuntimeField::CallId,
            } => "call_id",
            ParamSource::Runtime {
                field: RuntimeField::IdempotencyKey,
            } => "idempotency_key",
            ParamSource::Runtime {
                field: RuntimeField::Time,
            } => "time",
            ParamSource::Runtime {
                field: RuntimeField::UnixMs,
            } => "unix_ms",
            _ => continue,
        };
        refuse(format!(
            "its parameter `{}` is `source: runtime` `value: {unique}`, different in every call, so no two calls have the same arguments (the cache key) and none would ever be served",
            param.name
        ));
    }
    if props.scrub_secrets == Some(false) {
        refuse("it says `scrub_secrets: false`, and the cache keeps only scrubbed results (it keeps them outside the run, for every run of the tenant)".into());
    }
}
