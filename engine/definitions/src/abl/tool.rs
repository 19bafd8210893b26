//! One tool: [`parse_tool`] reads its signature, its properties
//! (`read_props.rs`) and its `parameters:` (`parameters.rs`), checks what
//! its binding type requires and allows, and assembles the `ToolDef`; a
//! tool with any error is left out of the output.

use crate::model::{ConfirmationDef, RepeatSafety, ToolBindingDef, ToolDef};
use crate::signature::{self, Direction, Field, check_input_type, parse_signature};
use crate::{NameAt, check_name};

use super::behaviour::check_side_effect_hints;
use super::headers::merge_headers;
use super::http::{check_path_params, http_request_options, join_base_url};
use super::lines::{Block, Cx};
use super::mcp::check_mcp_props;
use super::parameters::{apply_parameters, check_injected_use, check_injected_use_in_variants};
use super::props::{BindingType, FileDefaults};
use super::read_props::read_props;
use super::{
    DEFAULT_CALLBACK_TIMEOUT_SECONDS, DEFAULT_CALLBACK_URL_FIELD, DEFAULT_TIMEOUT_MS, cache,
    http_variants, mcp_resource, retry, sandbox, secrets, visibility,
};

pub(super) fn parse_tool(block: &Block, defaults: &FileDefaults, cx: &mut Cx<'_>) {
    let line = &block.line;
    let errors_before = cx.out.errors.len();
    let signature = match parse_signature(&line.text, line.col()) {
        Ok(s) => Some(s),
        Err(e) => {
            cx.error(line.no, e.column, e.message);
            None
        }
    };
    // The name is known even when the rest of the signature is broken, so
    // agents that list the tool do not get a second, misleading error.
    let name: String = line
        .text
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    if let Some(message) = check_name("tool", &name) {
        cx.error(line.no, line.col(), message);
    }
    cx.out.declared.push(NameAt {
        name: name.clone(),
        line: line.no,
        column: line.col(),
    });
    let mut signature = signature;
    if let Some(sig) = &mut signature {
        // The file's named types, substituted.
        let types = std::mem::take(&mut cx.types);
        // Parameters whose type names a type: their defaults were checked
        // against an opaque schema when parsed, so again once expanded.
        let named: Vec<bool> = sig
            .params
            .iter()
            .map(|p| {
                let mut refs = Vec::new();
                signature::named_refs(&p.ty, &mut refs);
                !refs.is_empty()
            })
            .collect();
        for ty in sig
            .params
            .iter_mut()
            .map(|p| &mut p.ty)
            .chain([&mut sig.returns])
        {
            if let Err(e) = signature::expand_named(ty, &types) {
                cx.error(line.no, e.column, e.message);
            }
        }
        cx.types = types;
        for (p, named) in sig.params.iter().zip(named) {
            if let Err(e) = check_input_type(&p.ty) {
                cx.error(line.no, e.column, e.message);
            } else if named
                && let Some(d) = &p.default
                && let Err(e) = signature::check_default(&p.ty, d, p.column)
            {
                // A named type's default is checked once the type is known.
                cx.error(
                    line.no,
                    e.column,
                    format!("parameter `{}`: {}", p.name, e.message),
                );
            }
        }
    }

    let mut props = read_props(block.children.iter(), cx);

    let mut injected = Vec::new();
    let mut untraced = Vec::new();
    if let Some(sig) = &mut signature
        && let Some(params_block) = props.parameters
    {
        (injected, untraced) = apply_parameters(params_block, &mut sig.params, &name, cx);
    }
    check_injected_use(&injected, &props, &name, cx);
    check_side_effect_hints(&props, cx);

    if let (Some(sig), Some(c)) = (&signature, &props.confirmation) {
        for (param, pline, pcol) in &c.immutable {
            if !sig.params.iter().any(|p| &p.name == param) {
                cx.error(
                    *pline,
                    *pcol,
                    format!(
                        "`immutable_params` names `{param}`, which is not a parameter of `{name}`"
                    ),
                );
            }
        }
    }
    let missing = |cx: &mut Cx<'_>, what: &str| {
        cx.error(
            line.no,
            line.col(),
            format!("tool `{name}` is missing {what}"),
        );
    };
    match props.binding_type {
        None => missing(cx, "`type: http` (how the tool is called)"),
        Some(BindingType::Http | BindingType::AsyncWebhook)
            if !props.present.contains("endpoint") =>
        {
            missing(cx, "`endpoint:`")
        }
        Some(BindingType::AsyncWebhook) if !props.present.contains("method") => missing(
            cx,
            "`method:` (`POST`, `PUT` or `PATCH`: an async webhook sends a body with the callback URL)",
        ),
        Some(BindingType::Workflow) if !props.present.contains("workflow_id") => {
            missing(cx, "`workflow_id:` (the workflow a call starts)")
        }
        Some(BindingType::Mcp) if !props.present.contains("server") => missing(
            cx,
            "`server:` (the MCP server's logical name, as the worker's MCP configuration names it)",
        ),
        _ => {}
    }
    check_mcp_props(&props, &name, line, cx);
    sandbox::check(&props, signature.as_ref(), &name, line, cx);
    if props.binding_type == Some(BindingType::Workflow) {
        for key in ["rate_limit", "circuit_breaker", "pool"] {
            if props.present.contains(key) {
                cx.error(
                    line.no,
                    line.col(),
                    format!(
                        "tool `{name}` is `type: workflow`: `{key}:` applies to tools a worker calls (`type: http`, `async_webhook` or `mcp`)"
                    ),
                );
            }
        }
        for key in ["endpoint", "method", "headers", "timeout"] {
            if props.present.contains(key) {
                cx.error(
                    line.no,
                    line.col(),
                    format!(
                        "tool `{name}` is `type: workflow`: `{key}:` applies to `type: http` only"
                    ),
                );
            }
        }
        if let (Some(sig), false) = (&signature, props.param_mapping.is_empty()) {
            for (key, param) in &props.param_mapping {
                if !sig.params.iter().any(|p| &p.name == param) {
                    cx.error(
                        line.no,
                        line.col(),
                        format!("`param_mapping` maps `{key}` from `{param}`, which is not a parameter of `{name}`"),
                    );
                }
            }
        }
        if let Some(w) = &props.workflow_id {
            cx.out.workflow_refs.push(w.clone());
        }
        if let Some((config, at_line, at_col)) = &props.workflow_timeout_config {
            cx.out
                .config_timeouts
                .push((name.clone(), config.clone(), *at_line, *at_col));
        }
    } else {
        for key in ["workflow_id", "mode", "timeout_ms", "param_mapping"] {
            if props.present.contains(key) {
                cx.error(
                    line.no,
                    line.col(),
                    format!("`{key}:` applies to `type: workflow` tools only"),
                );
            }
        }
    }
    if props.binding_type == Some(BindingType::AsyncWebhook) {
        if let Some(method) = &props.method
            && !["POST", "PUT", "PATCH"].contains(&method.as_str())
        {
            cx.error(
                props.method_at.0,
                props.method_at.1,
                format!(
                    "tool `{name}` is `type: async_webhook`: `method: {method}` sends no body to carry the callback URL (expected POST, PUT or PATCH)"
                ),
            );
        }
        if let (Some(sig), Some((field, fline, fcol))) = (&signature, &props.callback_url_field) {
            let first = field.split('.').next().unwrap_or_default();
            if sig.params.iter().any(|p| p.name == first) {
                cx.error(
                    *fline,
                    *fcol,
                    format!(
                        "`callback_url_field: {field}` would overwrite the parameter `{first}` of `{name}`; pick a field no parameter uses"
                    ),
                );
            }
        }
    } else {
        for key in ["callback_url_field", "timeout_seconds"] {
            if props.present.contains(key) {
                cx.error(
                    line.no,
                    line.col(),
                    format!("`{key}:` applies to `type: async_webhook` tools only"),
                );
            }
        }
    }
    if !props.present.contains("permission") {
        missing(
            cx,
            "`permission:` (the one permission a call needs, e.g. `crm.write`)",
        );
    }
    // An MCP tool may leave it to the server's hints (resolved when a run
    // starts; `never` without a trusted hint).
    let from_server =
        !props.present.contains("repeat_safety") && props.binding_type == Some(BindingType::Mcp);
    // Reading a resource changes nothing: idempotent, not the server's hints.
    let from_server = from_server && props.resource.is_none();
    if !props.present.contains("repeat_safety") && props.resource.is_some() {
        props.repeat_safety = Some(RepeatSafety::Idempotent);
    } else if from_server {
        props.repeat_safety = Some(RepeatSafety::Never);
    } else if props.binding_type == Some(BindingType::Sandbox)
        && !props.present.contains("repeat_safety")
    {
        // A pure computation: running it again is harmless.
        props.repeat_safety = Some(RepeatSafety::Idempotent);
    } else if !props.present.contains("repeat_safety") {
        missing(
            cx,
            "`repeat_safety:` (`never`, `idempotent` or `reconcile`)",
        );
    }
    cache::check(
        &props,
        &injected,
        &name,
        props.present.contains("repeat_safety"),
        cx,
    );
    if let Some(probe) = &props.reconcile_with {
        if props
            .repeat_safety
            .is_some_and(|r| r != RepeatSafety::Reconcile)
        {
            cx.error(
                probe.line,
                probe.column,
                "`reconcile_with:` needs `repeat_safety: reconcile`",
            );
        }
        if probe.name == name {
            cx.error(
                probe.line,
                probe.column,
                format!("tool `{name}` cannot reconcile with itself"),
            );
        }
        cx.out.reconcile_refs.push((name.clone(), probe.clone()));
    }
    if let (Some(sig), Some((endpoint, eline, ecol))) = (&signature, &props.endpoint) {
        check_path_params(endpoint, *eline, *ecol, sig, cx);
    }
    if let Some((_, bline, bcol)) = &props.base_url {
        cx.error(
            *bline,
            *bcol,
            "`base_url:` is a file-level default: put it under `TOOLS:`, above the first tool",
        );
    }
    let mut placed_secrets = std::mem::take(&mut props.header_secrets);
    let request = http_request_options(
        &props,
        signature.as_ref(),
        &name,
        line,
        defaults,
        &mut placed_secrets,
        cx,
    );
    let (result_secrets, secret_access) =
        secrets::read_tool(&props, signature.as_ref(), &name, line, placed_secrets, cx);
    let request_variants = match (props.request_variants, props.binding_type) {
        (Some(block), Some(BindingType::Http)) => {
            let base_headers = merge_headers(&defaults.headers, props.headers.clone());
            let base = http_variants::BaseRequest {
                endpoint: props.endpoint.as_ref().map(|(e, _, _)| e.as_str()),
                method: props.method.as_deref().unwrap_or("POST"),
                headers: &base_headers,
                request: &request,
                body_type: props.body_type,
                body_mode: props.body_mode,
                body_template: props.body_template.as_ref(),
                base_url: defaults.base_url.as_deref(),
                xml_root: props.xml_root.as_ref().map(|(_, l, c)| (*l, *c)),
                body_schema: request
                    .body_schema
                    .as_ref()
                    .and(props.body_schema.as_ref())
                    .map(|(_, l, c)| (*l, *c)),
                broken: cx.out.errors.len() > errors_before,
            };
            let mut placed = Vec::new();
            let variants = http_variants::read_variants(
                block,
                &base,
                signature.as_ref(),
                &name,
                line,
                &mut placed,
                cx,
            );
            // A variant's `{{_secret.KEY}}` must be a key the tool reads, as
            // in its own headers and body template.
            for (key, kline, kcol) in placed {
                if !secret_access.contains(&key) {
                    cx.error(
                        kline,
                        kcol,
                        format!(
                            "`{{{{_secret.{key}}}}}`: `{key}` is not in the `SECRET_ACCESS: READ` list of `{name}`"
                        ),
                    );
                }
            }
            variants
        }
        (Some(block), Some(t)) if t != BindingType::Unsupported => {
            cx.error(
                block.line.no,
                block.line.col(),
                "`request_variants:` applies to `type: http` tools only",
            );
            Vec::new()
        }
        _ => Vec::new(),
    };
    check_injected_use_in_variants(&injected, &request_variants, &name, cx);
    let own_retry = std::mem::take(&mut props.retry);
    let retry_policy =
        retry::tool_policy(own_retry, &defaults.retry, props.binding_type, &name, cx);

    if cx.out.errors.len() > errors_before {
        return;
    }
    // No error was recorded, so every required piece is present; the
    // `let ... else` only satisfies the types.
    let (Some(sig), Some(permission), Some(repeat_safety)) =
        (signature, props.permission, props.repeat_safety)
    else {
        return;
    };
    // The file's defaults apply to HTTP requests only.
    let http_like = matches!(
        props.binding_type,
        Some(BindingType::Http | BindingType::AsyncWebhook)
    );
    let (headers, default_timeout_ms, default_rate_limit) = if http_like {
        (
            merge_headers(&defaults.headers, props.headers),
            defaults.timeout_ms,
            defaults.rate_limit,
        )
    } else {
        (props.headers, None, None)
    };
    // The tool's `timeout:`, then its `hints.timeout`, then the file's.
    let timeout_ms = props
        .timeout_ms
        .or(props.hints.timeout_ms)
        .or(default_timeout_ms)
        .unwrap_or(DEFAULT_TIMEOUT_MS);
    let method = props.method.unwrap_or_else(|| "POST".to_string());
    let endpoint = props
        .endpoint
        .map(|(e, _, _)| join_base_url(defaults.base_url.as_deref(), e));
    let binding = match (props.binding_type, endpoint, props.workflow_id) {
        (Some(BindingType::Mcp), _, _) => {
            let Some(server) = props.server else {
                return;
            };
            if let Some((template, line_no, col)) = props.resource {
                let Some(binding) = mcp_resource::binding(
                    server,
                    template,
                    timeout_ms,
                    &sig,
                    &props.present,
                    props.repeat_safety,
                )
                .map_err(|m| cx.error(line_no, col, m))
                .ok() else {
                    return;
                };
                binding
            } else {
                ToolBindingDef::Mcp {
                    server,
                    server_tool: props.server_tool.unwrap_or_else(|| sig.name.clone()),
                    headers,
                    timeout_ms,
                }
            }
        }
        (Some(BindingType::Http), Some(endpoint), _) => ToolBindingDef::Http {
            endpoint,
            method,
            headers,
            timeout_ms,
            request,
        },
        (Some(BindingType::Workflow), _, Some(workflow)) => ToolBindingDef::Workflow {
            workflow: workflow.name,
            mode: props.mode.unwrap_or_default(),
            timeout_ms: props.workflow_timeout_ms.or(props.hints.timeout_ms),
            param_mapping: props.param_mapping,
        },
        (Some(BindingType::Sandbox), _, _) => {
            let Some(binding) = sandbox::binding(
                &mut props.sandbox,
                &sig,
                props.timeout_ms.or(props.hints.timeout_ms),
            ) else {
                return;
            };
            ToolBindingDef::Sandbox(binding)
        }
        (Some(BindingType::AsyncWebhook), Some(endpoint), _) => ToolBindingDef::AsyncWebhook {
            endpoint,
            method,
            headers,
            timeout_ms,
            request,
            callback_url_field: props
                .callback_url_field
                .map(|(f, _, _)| f)
                .unwrap_or_else(|| DEFAULT_CALLBACK_URL_FIELD.to_string()),
            callback_timeout_ms: props
                .callback_timeout_seconds
                .unwrap_or(DEFAULT_CALLBACK_TIMEOUT_SECONDS)
                * 1000,
        },
        _ => return,
    };
    let model_input_schema = (!injected.is_empty()).then(|| {
        let visible: Vec<Field> = sig
            .params
            .iter()
            .filter(|p| !injected.iter().any(|(i, _)| i.name == p.name))
            .cloned()
            .collect();
        signature::input_schema(&visible)
    });
    let mut tool = ToolDef {
        name: sig.name,
        description: props.description.unwrap_or_default(),
        input_schema: signature::input_schema(&sig.params),
        output_schema: signature::type_schema(&sig.returns, Direction::Output),
        permission,
        repeat_safety,
        repeat_safety_from_server: from_server,
        scrub_secrets: props.scrub_secrets.unwrap_or(true),
        pii_access: props.pii_access.map(|(a, _, _)| a).unwrap_or_default(),
        reconcile_with: props.reconcile_with.map(|p| p.name),
        pool: props.pool,
        binding,
        confirmation: None,
        injected: injected.into_iter().map(|(i, _)| i).collect(),
        model_input_schema,
        hints: props.hints,
        effect: props.effect.map(|(e, _, _)| e),
        retry_policy,
        rate_limit: props.rate_limit.or(default_rate_limit),
        circuit_breaker: props.circuit_breaker,
        compaction: props.compaction,
        on_result: props.on_result,
        on_error: props.on_error,
        result_secrets,
        secret_access,
        process: props.process,
        request_variants,
        strict_schema: None,
        untraced: Vec::new(),
        sampling: props.sampling.map(|(def, _, _)| def),
        source_file: cx.file.to_string(),
        source_line: line.no,
    };
    if let Some((l, c)) = props.strict {
        match crate::strict::to_strict(&tool.name, tool.model_schema()) {
            Ok(schema) => tool.strict_schema = Some(schema),
            Err(e) => {
                cx.error(l, c, e.to_string());
                return;
            }
        }
    }
    // `when_side_effects` is settled here, once: the machine sees a tool
    // that always asks, or one that never does.
    let side_effects = tool.has_side_effects();
    tool.confirmation = props
        .confirmation
        .filter(|c| !c.when_side_effects || side_effects)
        .map(|c| ConfirmationDef {
            when_side_effects: c.when_side_effects,
            immutable_params: c.immutable.into_iter().map(|(p, _, _)| p).collect(),
            approver_grant: c.grant.unwrap_or_else(|| tool.permission.clone()),
        });
    if let (Some((access, l, c)), Some((name, ..))) = (props.pii_access, untraced.first())
        && (access.user || access.tools)
    {
        cx.error(
            l,
            c,
            format!(
                "`pii_access:` cannot give personal data to `{name}`, a `visibility.trace: false` parameter: its value is sealed in the run's vault as the model wrote it, before the engine could put the data back in place of a token"
            ),
        );
        return;
    }
    if !untraced.is_empty() {
        if !visibility::check_untraced(&tool, &untraced, cx) {
            return;
        }
        tool.untraced = untraced.into_iter().map(|(n, ..)| n).collect();
    }
    cx.out.tools.push(tool);
}
