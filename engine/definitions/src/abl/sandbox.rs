//! `type: sandbox` tools of a `.tools.abl` file (seed `abl-tools.md`,
//! "Code tools (sandbox)"): inline JavaScript or Python code that a worker
//! runs in an isolated sandbox (`worker/src/sandbox_tool.rs`).
//!
//! - `runtime: javascript | python` and `code:` are required. `code:` is
//!   usually a `|` block scalar (`block_scalar.rs`), or one quoted line.
//! - The code is the body of a function whose parameters are the tool's
//!   declared parameters, by name; what it returns is the result (checked
//!   against the declared return type like every tool's). So no parameter
//!   may be named like a reserved word of the runtime's language.
//! - `timeout:` (wall clock) and `memory_mb:` are optional: without them
//!   the worker's defaults apply (`--sandbox-timeout-ms`,
//!   `--sandbox-memory-mb`).
//! - The code computes and cannot reach the world (no network, no files
//!   outside its fresh working directory), so `repeat_safety:` defaults to
//!   `idempotent`, `reconcile` is refused (there is nothing to reconcile
//!   with), and the properties of requests (`endpoint:`, `method:`,
//!   `headers:`, `server:`, `SECRET_ACCESS:`, ...) do not apply.

use belay_proto::wire::{SandboxBinding, SandboxRuntime};

use super::super::model::RepeatSafety;
use super::super::signature::Signature;
use super::block_scalar;
use super::lines::{Block, Cx, KeyValue, Line, keyword, scalar};
use super::props::{BindingType, Props};

/// Smallest `memory_mb:` accepted: Node.js needs about 48 MiB to start.
pub(super) const MIN_MEMORY_MB: u64 = 64;

/// Largest `memory_mb:` accepted (16 GiB).
pub(super) const MAX_MEMORY_MB: u64 = 16_384;

/// Largest sandbox `timeout:` accepted, ms (10 minutes): a tool call holds
/// a worker slot and a lease while it runs.
pub(super) const MAX_TIMEOUT_MS: u64 = 600_000;

/// Longest `code:` accepted, in bytes.
pub(super) const MAX_CODE_BYTES: usize = 100_000;

/// Reserved words of JavaScript (strict mode, inside an async function)
/// that cannot name a parameter.
const JS_RESERVED: &[&str] = &[
    "arguments",
    "await",
    "break",
    "case",
    "catch",
    "class",
    "const",
    "continue",
    "debugger",
    "default",
    "delete",
    "do",
    "else",
    "enum",
    "eval",
    "export",
    "extends",
    "false",
    "finally",
    "for",
    "function",
    "if",
    "implements",
    "import",
    "in",
    "instanceof",
    "interface",
    "let",
    "new",
    "null",
    "package",
    "private",
    "protected",
    "public",
    "return",
    "static",
    "super",
    "switch",
    "this",
    "throw",
    "true",
    "try",
    "typeof",
    "var",
    "void",
    "while",
    "with",
    "yield",
];

/// Keywords of Python 3 (and the soft keywords that cannot be names).
const PY_RESERVED: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield",
];

/// Properties that say how to reach a service: they do not apply to code.
const REQUEST_PROPERTIES: &[&str] = &[
    "endpoint",
    "method",
    "headers",
    "server",
    "server_tool",
    "SECRET_ACCESS",
    "request_variants",
];

/// `runtime:`, `code:` and `memory_mb:` as read (each `None` when absent
/// or refused).
#[derive(Default)]
pub(super) struct SandboxProps {
    runtime: Option<SandboxRuntime>,
    code: Option<String>,
    memory_mb: Option<u64>,
}

/// Reads `runtime:`, `code:` or `memory_mb:` (whatever the tool's type:
/// [`check`] refuses them on other types).
pub(super) fn read_prop(
    block: &Block,
    kv: &KeyValue<'_>,
    props: &mut SandboxProps,
    cx: &mut Cx<'_>,
) {
    let line = &block.line;
    match kv.key {
        "runtime" => {
            let choices = [
                ("javascript", SandboxRuntime::Javascript),
                ("python", SandboxRuntime::Python),
            ];
            props.runtime = keyword(block, kv, &choices, cx);
        }
        "code" => {
            let code = if block_scalar::is_indicator(kv.value) {
                // Read with the file's lines.
                match cx.block_scalars.get(&line.no).map(|b| b.text.clone()) {
                    Some(Ok(text)) => Some(text),
                    Some(Err(problems)) => {
                        for (no, col, message) in problems {
                            cx.error(no, col, message);
                        }
                        None
                    }
                    None => None,
                }
            } else {
                scalar(block, kv, cx)
            };
            let Some(code) = code else { return };
            if code.trim().is_empty() {
                cx.error(
                    line.no,
                    kv.value_col,
                    "`code` is empty: write the body of the tool's function",
                );
            } else if code.len() > MAX_CODE_BYTES {
                cx.error(
                    line.no,
                    kv.value_col,
                    format!(
                        "`code` is {} bytes, more than {MAX_CODE_BYTES}: a tool's code must stay small",
                        code.len()
                    ),
                );
            } else if code.contains('\0') {
                cx.error(line.no, kv.value_col, "`code` contains a NUL character");
            } else {
                props.code = Some(code);
            }
        }
        _ => {
            let Some(s) = scalar(block, kv, cx) else {
                return;
            };
            match s.parse::<u64>() {
                Ok(mb) if (MIN_MEMORY_MB..=MAX_MEMORY_MB).contains(&mb) => {
                    props.memory_mb = Some(mb);
                }
                _ => cx.error(
                    line.no,
                    kv.value_col,
                    format!(
                        "`memory_mb` must be a whole number of megabytes from {MIN_MEMORY_MB} to {MAX_MEMORY_MB}, not `{s}`"
                    ),
                ),
            }
        }
    }
}

/// The checks of a tool's properties that depend on `type: sandbox`: its
/// required properties, the ones that do not apply, its repeat safety and
/// its parameter names; on any other type, that the sandbox properties
/// are absent.
pub(super) fn check(
    props: &Props<'_>,
    sig: Option<&Signature>,
    name: &str,
    line: &Line,
    cx: &mut Cx<'_>,
) {
    if props.binding_type != Some(BindingType::Sandbox) {
        for key in ["runtime", "code", "memory_mb"] {
            if props.present.contains(key) {
                cx.error(
                    line.no,
                    line.col(),
                    format!("`{key}:` applies to `type: sandbox` tools only"),
                );
            }
        }
        return;
    }
    if !props.present.contains("runtime") {
        cx.error(
            line.no,
            line.col(),
            format!("tool `{name}` is missing `runtime:` (`javascript` or `python`)"),
        );
    }
    if !props.present.contains("code") {
        cx.error(
            line.no,
            line.col(),
            format!(
                "tool `{name}` is missing `code:` (the body of its function, usually a `|` block)"
            ),
        );
    }
    for key in REQUEST_PROPERTIES {
        if props.present.contains(*key) {
            cx.error(
                line.no,
                line.col(),
                format!(
                    "tool `{name}` is `type: sandbox`: `{key}:` does not apply (its code runs in the worker's sandbox, which has no network)"
                ),
            );
        }
    }
    if props.repeat_safety == Some(RepeatSafety::Reconcile) {
        cx.error(
            line.no,
            line.col(),
            format!(
                "tool `{name}` is `type: sandbox`: its code has no effect outside the sandbox to reconcile; use `repeat_safety: idempotent` (the default) or `never`"
            ),
        );
    }
    if let Some(ms) = props.timeout_ms.or(props.hints.timeout_ms)
        && ms > MAX_TIMEOUT_MS
    {
        cx.error(
            line.no,
            line.col(),
            format!(
                "tool `{name}`: a sandbox `timeout` may be at most {MAX_TIMEOUT_MS} ms (10 minutes), not {ms}"
            ),
        );
    }
    if let (Some(sig), Some(runtime)) = (sig, props.sandbox.runtime) {
        let (reserved, language) = match runtime {
            SandboxRuntime::Javascript => (JS_RESERVED, "JavaScript"),
            SandboxRuntime::Python => (PY_RESERVED, "Python"),
        };
        for p in &sig.params {
            if reserved.contains(&p.name.as_str()) {
                cx.error(
                    line.no,
                    p.column,
                    format!(
                        "parameter `{}` of `{name}` is a reserved word in {language}: rename it (the code sees each parameter as a variable of its name)",
                        p.name
                    ),
                );
            }
        }
    }
}

/// The binding of a tool whose properties [`check`] found complete;
/// `None` if one is missing (reported already).
pub(super) fn binding(
    props: &mut SandboxProps,
    sig: &Signature,
    timeout_ms: Option<u64>,
) -> Option<SandboxBinding> {
    Some(SandboxBinding {
        runtime: props.runtime?,
        code: props.code.take()?,
        params: sig.params.iter().map(|p| p.name.clone()).collect(),
        timeout_ms,
        memory_mb: props.memory_mb,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "sandbox_tests.rs"]
mod tests;
