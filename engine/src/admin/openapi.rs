//! The OpenAPI 3.1 document of the admin endpoint, served at
//! [`OPENAPI_PATH`](super::OPENAPI_PATH). Paths are built from the same
//! constants the router uses, so the two cannot drift apart silently; a test
//! checks that every entry of [`ROUTES`](super::ROUTES) is described.

use serde_json::{Value, json};

use super::keys::{
    KEY_REVOKE_PATH, KEYS_PATH, MAX_KEY_GRANTS, MAX_KEY_LIFETIME_SECS, MAX_PRINCIPAL_BYTES,
};
use super::{
    MAX_BODY_BYTES, MAX_OPERATOR_BYTES, MAX_REASON_BYTES, MCP_TOOL_ACCEPT_PATH, MCP_TOOL_PATH,
    MCP_TOOLS_PATH, OPENAPI_PATH, RUN_CALL_FAIL_PATH, RUN_CANCEL_PATH, RUN_PATH, RUN_PAUSE_PATH,
    RUN_RESUME_PATH, TOOL_CALLS_PATH, UNCERTAIN_LIST_PATH, UNCERTAIN_PATH, UNCERTAIN_RESOLVE_PATH,
};
use crate::audit::{DEFAULT_TOOL_CALLS_LIMIT, MAX_TOOL_CALLS_LIMIT};

fn error_response(description: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    })
}

fn ok(description: &str, schema: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}
    })
}

fn refs(codes: &[&str]) -> serde_json::Map<String, Value> {
    codes
        .iter()
        .map(|c| {
            let name = match *c {
                "400" => "BadRequest",
                "401" => "Unauthorized",
                "403" => "Forbidden",
                "404" => "NotFound",
                "409" => "Conflict",
                "413" => "PayloadTooLarge",
                "415" => "UnsupportedMediaType",
                "422" => "Unprocessable",
                _ => "Unavailable",
            };
            (
                (*c).to_owned(),
                json!({"$ref": format!("#/components/responses/{name}")}),
            )
        })
        .collect()
}

fn responses(success: Value, errors: &[&str]) -> Value {
    let mut map = refs(errors);
    map.insert("200".into(), success);
    Value::Object(map)
}

fn body(schema: &str) -> Value {
    json!({
        "required": true,
        "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}
    })
}

fn param(name: &str) -> Value {
    json!({"$ref": format!("#/components/parameters/{name}")})
}

fn query(name: &str, schema: Value, description: &str) -> Value {
    json!({"name": name, "in": "query", "required": false, "schema": schema, "description": description})
}

fn run_control(op: &str, summary: &str, description: &str) -> Value {
    json!({"post": {
        "operationId": op,
        "summary": summary,
        "description": description,
        "tags": ["runs"],
        "parameters": [param("tenant"), param("run_id")],
        "requestBody": body("RunControlRequest"),
        "responses": responses(ok("The run afterwards.", "Run"),
            &["400", "401", "403", "404", "409", "413", "415", "503"]),
    }})
}

fn schemas() -> Value {
    let timestamp = json!({"type": "string", "format": "date-time"});
    let nullable_ts = json!({"type": ["string", "null"], "format": "date-time"});
    let mut map = serde_json::Map::new();
    map.insert("Error".into(), json!({
                    "type": "object",
                    "required": ["error"],
                    "properties": {"error": {
                        "type": "object",
                        "required": ["code", "message", "details"],
                        "properties": {
                            "code": {"type": "string", "enum": ["invalid_argument", "unauthorized", "forbidden", "not_found", "method_not_allowed", "conflict", "failed_precondition", "payload_too_large", "unsupported_media_type", "unprocessable", "unavailable", "internal"]},
                            "message": {"type": "string"},
                            "details": {"type": "array", "items": {"type": "string"}},
                        }
                    }}
                }));
    map.insert(
        "Attempt".into(),
        json!({
            "type": "object",
            "description": "One attempt of the call: its dispatch and failure, with timestamps.",
            "additionalProperties": true,
            "properties": {
                "attempt": {"type": "integer"},
                "worker_id": {"type": ["string", "null"]},
                "dispatched_at": nullable_ts,
                "error": {"type": ["string", "null"]},
            }
        }),
    );
    map.insert("UncertainOutcome".into(), json!({
                    "type": "object",
                    "required": ["uncertain_id", "tenant", "run_id", "task_id", "call_id", "node_id", "tool", "tool_version", "arguments", "idempotency_key", "attempts", "reason", "status", "created_at"],
                    "properties": {
                        "uncertain_id": {"type": "string", "format": "uuid"},
                        "tenant": {"type": "string"},
                        "run_id": {"type": "string", "format": "uuid"},
                        "task_id": {"type": "string", "format": "uuid"},
                        "call_id": {"type": "string"},
                        "node_id": {"type": "string"},
                        "tool": {"type": "string"},
                        "tool_version": {"type": "integer"},
                        "arguments": {"description": "The exact arguments sent."},
                        "idempotency_key": {"type": "string"},
                        "attempts": {"type": "array", "items": {"$ref": "#/components/schemas/Attempt"}},
                        "worker_id": {"type": ["string", "null"], "description": "The worker that dispatched the call."},
                        "reason": {"type": "string", "description": "Why the outcome is uncertain."},
                        "status": {"type": "string", "enum": ["open", "resolved"]},
                        "created_at": timestamp,
                        "resolution": {"type": ["object", "null"], "description": "As stored: `{\"resolution\": \"succeeded\", \"result\"}`, `{\"resolution\": \"failed\", \"error\"}` or `{\"resolution\": \"retry\", \"idempotency_key\", \"new_idempotency_key\"}`."},
                        "resolution_kind": {"type": ["string", "null"], "enum": ["succeeded", "failed", "retry", null]},
                        "resolved_by": {"type": ["string", "null"], "description": "`<token name>`, `<token name>/<operator>`, the late worker, or `probe:<tool>`."},
                        "resolved_at": nullable_ts,
                        "resolved_via": {"type": ["string", "null"], "enum": ["operator", "late_result", "probe", null]},
                        "resolution_reason": {"type": ["string", "null"]},
                        "probe": {"type": ["object", "null"], "description": "What a reconcile probe found: `{tool, outcome, detail, at}`."},
                        "discrepancy": {"type": ["array", "null"], "description": "Late results that arrived after the record was resolved; kept, never applied."},
                        "occurrence": {"type": "integer", "description": "1 for a call's first uncertain outcome, 2 if it became uncertain again after a retry, and so on."},
                    }
                }));
    map.insert("UncertainOutcomePage".into(), json!({
                    "type": "object",
                    "required": ["items", "next_page_token"],
                    "properties": {
                        "items": {"type": "array", "items": {"$ref": "#/components/schemas/UncertainOutcome"}},
                        "next_page_token": {"type": ["string", "null"], "description": "`null` on the last page."},
                    }
                }));
    map.insert(
        "ResolveRequest".into(),
        json!({
            "oneOf": [
                {"$ref": "#/components/schemas/ResolveSucceeded"},
                {"$ref": "#/components/schemas/ResolveFailed"},
                {"$ref": "#/components/schemas/ResolveRetry"},
            ],
            "discriminator": {"propertyName": "resolution", "mapping": {
                "succeeded": "#/components/schemas/ResolveSucceeded",
                "failed": "#/components/schemas/ResolveFailed",
                "retry": "#/components/schemas/ResolveRetry",
            }}
        }),
    );
    map.insert(
        "ResolveSucceeded".into(),
        json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["resolution", "result", "reason"],
            "properties": {
                "resolution": {"const": "succeeded"},
                "result": {"description": "The call's result; must match the tool's output type."},
                "reason": {"$ref": "#/components/schemas/Reason"},
                "operator": {"$ref": "#/components/schemas/Operator"},
            }
        }),
    );
    map.insert("ResolveFailed".into(), json!({
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["resolution", "error", "reason"],
                    "properties": {
                        "resolution": {"const": "failed"},
                        "error": {"type": "string", "minLength": 1, "description": "What the model or workflow sees as the tool's failure."},
                        "reason": {"$ref": "#/components/schemas/Reason"},
                        "operator": {"$ref": "#/components/schemas/Operator"},
                    }
                }));
    map.insert("ResolveRetry".into(), json!({
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["resolution", "reason"],
                    "properties": {
                        "resolution": {"const": "retry"},
                        "new_idempotency_key": {"type": "boolean", "default": false, "description": "Use a new idempotency key: only when the first call surely did nothing."},
                        "reason": {"$ref": "#/components/schemas/Reason"},
                        "operator": {"$ref": "#/components/schemas/Operator"},
                    }
                }));
    map.insert(
        "RunControlRequest".into(),
        json!({
            "type": "object",
            "additionalProperties": false,
            "required": ["reason"],
            "properties": {
                "reason": {"$ref": "#/components/schemas/Reason"},
                "operator": {"$ref": "#/components/schemas/Operator"},
            }
        }),
    );
    map.insert("Reason".into(), json!({"type": "string", "minLength": 1, "maxLength": MAX_REASON_BYTES, "description": "Why; recorded with the action."}));
    map.insert("Operator".into(), json!({"type": "string", "minLength": 1, "maxLength": MAX_OPERATOR_BYTES, "description": "Who, within the token's name: recorded as `<token name>/<operator>`."}));
    map.insert("Run".into(), json!({
                    "type": "object",
                    "required": ["run_id", "tenant", "workflow", "workflow_version", "status", "status_reason", "input", "idempotency_key", "caller", "last_seq", "created_at", "updated_at", "open_uncertain_outcomes"],
                    "properties": {
                        "run_id": {"type": "string", "format": "uuid"},
                        "tenant": {"type": "string"},
                        "workflow": {"type": "string"},
                        "workflow_version": {"type": "integer"},
                        "status": {"type": "string", "enum": ["pending", "running", "paused", "waiting", "completed", "failed", "cancelled"]},
                        "status_reason": {"type": "string"},
                        "input": {},
                        "output": {},
                        "idempotency_key": {"type": "string"},
                        "caller": {"type": "string"},
                        "last_seq": {"type": "integer"},
                        "created_at": timestamp,
                        "updated_at": timestamp,
                        "open_uncertain_outcomes": {"type": "array", "items": {"type": "string", "format": "uuid"}},
                    }
                }));
    let hash = json!({"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"});
    map.insert("McpToolPin".into(), json!({
        "type": "object",
        "description": "The definition of an MCP tool the tenant accepted: calls go through only while the server lists exactly this hash.",
        "required": ["tenant", "server", "tool", "definition_hash", "accepted_by", "reason", "accepted_at"],
        "properties": {
            "tenant": {"type": "string"},
            "server": {"type": "string"},
            "tool": {"type": "string"},
            "definition_hash": hash,
            "previous_hash": {"type": ["string", "null"], "description": "The hash accepted before this one."},
            "accepted_by": {"type": "string", "description": "`first use (worker <id>)` for the pin made at the tenant's first call, else `<token name>` or `<token name>/<operator>`."},
            "reason": {"type": "string"},
            "accepted_at": timestamp,
        }
    }));
    map.insert("McpToolListing".into(), json!({
        "type": "object",
        "description": "One definition of an MCP tool as a worker's MCP client listed and mapped it. Untrusted data from the server: shown for review, never run.",
        "required": ["server", "tool", "definition_hash", "definition", "suggested_repeat_safety", "protocol_version", "first_seen_at", "last_seen_at", "reported_by"],
        "properties": {
            "server": {"type": "string"},
            "tool": {"type": "string"},
            "definition_hash": hash,
            "definition": {"type": "object", "description": "`name`, `title`, `description`, `input_schema`, `output_schema`, `hints`, `definition_hash`."},
            "refusal": {"type": ["string", "null"], "description": "Why Belay cannot call this definition (its schema cannot be represented)."},
            "suggested_repeat_safety": {"type": "string", "enum": ["never", "idempotent"], "description": "What the server's hints suggest (`idempotent` only for a server the worker's configuration trusts); the tool's declared `repeat_safety:` is what applies."},
            "protocol_version": {"type": "string"},
            "first_seen_at": timestamp,
            "last_seen_at": timestamp,
            "reported_by": {"type": "string", "description": "The worker whose report last listed it."},
        }
    }));
    map.insert("McpTool".into(), json!({
        "type": "object",
        "required": ["server", "tool", "status", "pinned", "listed"],
        "properties": {
            "server": {"type": "string"},
            "tool": {"type": "string"},
            "status": {"type": "string", "enum": ["pinned", "changed", "unpinned", "unlisted"], "description": "`pinned`: the newest listing is the accepted definition; `changed`: it is not, and calls are refused until one is accepted; `unpinned`: the tenant's first call will pin the definition listed then; `unlisted`: pinned, but no worker reported it."},
            "pinned": {"oneOf": [{"$ref": "#/components/schemas/McpToolPin"}, {"type": "null"}]},
            "listed": {"oneOf": [{"$ref": "#/components/schemas/McpToolListing"}, {"type": "null"}], "description": "The newest listing any worker reported."},
        }
    }));
    map.insert("McpToolDetail".into(), json!({
        "allOf": [{"$ref": "#/components/schemas/McpTool"}, {
            "type": "object",
            "required": ["history"],
            "properties": {"history": {"type": "array", "items": {"$ref": "#/components/schemas/McpToolListing"}, "description": "Every definition reported, newest listing first."}}
        }]
    }));
    map.insert("McpToolPage".into(), json!({
        "type": "object",
        "required": ["items"],
        "properties": {"items": {"type": "array", "items": {"$ref": "#/components/schemas/McpTool"}}}
    }));
    map.insert("AcceptMcpToolRequest".into(), json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["definition_hash", "reason"],
        "properties": {
            "definition_hash": {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$", "description": "A definition a worker reported (see `history`)."},
            "reason": {"$ref": "#/components/schemas/Reason"},
            "operator": {"$ref": "#/components/schemas/Operator"},
        }
    }));
    map.insert("ToolCall".into(), json!({
        "type": "object",
        "description": "One tool call a run proposed, derived from the run's events: what was asked, what the engine decided, and how it ended.",
        "required": ["run_id", "seq", "call_id", "tool", "tool_version", "node", "arguments", "caller", "tenant", "decision", "refusal", "confirmation", "outcome", "result", "cached", "error", "proposed_at", "ended_at"],
        "properties": {
            "run_id": {"type": "string", "format": "uuid"},
            "seq": {"type": "integer", "description": "Seq of the proposal event (`tool_call_scheduled` or `tool_call_refused`) in the run's history."},
            "call_id": {"type": ["string", "null"], "description": "`<node>.t<n>`; `null` for a refused call, which never got one."},
            "tool": {"type": "string", "description": "The tool's name; for a refused call, as the model wrote it."},
            "tool_version": {"type": ["integer", "null"], "description": "Version of the pinned tool definition; `null` for a refused call."},
            "node": {"type": "string", "description": "The node that proposed the call."},
            "arguments": {"description": "A scheduled call: the arguments as validated and sent (an approver's edit, if any). A refused call: the arguments as the model wrote them (the JSON they parse to, else the text itself)."},
            "caller": {"type": "string", "description": "Who started the run."},
            "tenant": {"type": "string"},
            "decision": {"type": "string", "enum": ["scheduled", "refused"]},
            "refusal": {
                "type": ["object", "null"],
                "description": "Why the call was refused; the reason went back to the model as the call's result.",
                "required": ["check", "reason"],
                "properties": {
                    "check": {"type": "string", "description": "`not_on_list`, `invalid_arguments`, `permission`, `budget`, `no_progress`, `truncated`, `loop_policy`, `parameter_source` (a parameter the tool supplies itself could not be filled in) or `request_variant` (a `when:` of the tool's `request_variants:` failed or gave no boolean)."},
                    "reason": {"type": "string"},
                }
            },
            "confirmation": {
                "type": ["object", "null"],
                "description": "A person's decision on a call of a tool with `confirmation:`; `null` while undecided or when none was needed.",
                "required": ["approved", "by", "edited"],
                "properties": {
                    "approved": {"type": "boolean"},
                    "by": {"type": "string"},
                    "edited": {"type": "boolean", "description": "Whether the approver edited the arguments (`arguments` shows the edit)."},
                }
            },
            "variant": {"type": "string", "description": "The `request_variants:` item whose request the call sends (chosen when it was scheduled, or again for an approver's edit). Absent when the tool has none or none applied (the tool's own request)."},
            "outcome": {"type": "string", "enum": ["completed", "failed", "uncertain", "open"], "description": "`completed`: succeeded (or resolved as succeeded); `failed`: failed for good, declined, resolved as failed, or refused; `uncertain`: the outcome is unknown and unresolved; `open`: not ended yet (running, awaiting a confirmation, or retried after an uncertain outcome)."},
            "result": {"description": "The result of a completed call, whole; `null` otherwise."},
            "cached": {
                "type": ["object", "null"],
                "description": "Set when the result came from the tenant's result cache (`hints.cacheable: true`): the tool was not called. Where the entry came from; `null` otherwise.",
                "required": ["key", "stored_by_run", "stored_by_call", "stored_at", "expires_at"],
                "properties": {
                    "key": {"type": "string", "description": "The cache key: hex SHA-256 of the tenant, the tool, its definition's content hash and the arguments."},
                    "stored_by_run": {"type": "string", "format": "uuid", "description": "The run whose call stored the result."},
                    "stored_by_call": {"type": "string", "description": "That call's id."},
                    "stored_at": {"type": "string", "format": "date-time"},
                    "expires_at": {"type": "string", "format": "date-time"},
                }
            },
            "error": {"type": ["string", "null"], "description": "What the model or workflow was told of a failed call (a refused call: the refusal's reason)."},
            "proposed_at": timestamp,
            "ended_at": {"type": ["string", "null"], "format": "date-time", "description": "When the call completed or failed (a refused call: when it was refused)."},
        }
    }));
    map.insert("ToolCallPage".into(), json!({
        "type": "object",
        "required": ["items", "next_page_token"],
        "properties": {
            "items": {"type": "array", "items": {"$ref": "#/components/schemas/ToolCall"}},
            "next_page_token": {"type": ["string", "null"], "description": "`null` on the last page."},
        }
    }));
    Value::Object(with_key_schemas(with_error_kind(map)))
}

/// `map` with the `error_kind` of a `ToolCall` (issue 22).
fn with_error_kind(mut map: serde_json::Map<String, Value>) -> serde_json::Map<String, Value> {
    if let Some(Value::Object(properties)) = map
        .get_mut("ToolCall")
        .and_then(|t| t.get_mut("properties"))
    {
        properties.insert(
            "error_kind".into(),
            json!({
                "type": "string",
                "enum": ["tool_error", "protocol_error", "transport"],
                "description": "A failed `type: mcp` call: which kind of failure ended it. `tool_error`: the tool ran and reported failure (`isError: true`); `protocol_error`: the server answered with a JSON-RPC error or an answer that is not a usable result; `transport`: no answer (not sent, lost, timed out). Absent for other calls."
            }),
        );
    }
    map
}

/// `map` with the schemas of the key routes.
fn with_key_schemas(mut map: serde_json::Map<String, Value>) -> serde_json::Map<String, Value> {
    let timestamp = json!({"type": "string", "format": "date-time"});
    let nullable_ts = json!({"type": ["string", "null"], "format": "date-time"});
    let key_properties = json!({
        "key_id": {"type": "string", "description": "The key's public id (16 hex digits)."},
        "principal": {"type": "string"},
        "role": {"type": "string", "enum": ["client", "worker", "approver", "operator", "admin"]},
        "tenants": {"type": "array", "items": {"type": "string"}, "description": "`[\"*\"]` for every tenant."},
        "grants": {"type": "array", "items": {"type": "string"}},
        "description": {"type": "string"},
        "cert_subject": {"type": ["string", "null"]},
        "created_by": {"type": "string"},
        "created_at": timestamp,
        "expires_at": nullable_ts,
        "revoked_at": nullable_ts,
        "status": {"type": "string", "enum": ["active", "revoked", "expired"]},
    });
    map.insert(
        "Key".into(),
        json!({
            "type": "object",
            "description": "A principal and its credential; never the secret or its hash.",
            "properties": key_properties,
        }),
    );
    let mut created = key_properties.as_object().cloned().unwrap_or_default();
    created.insert("key".into(), json!({"type": ["string", "null"], "description": "`belay_<key id>_<secret>`, shown only in this response; `null` for a certificate principal."}));
    map.insert(
        "CreatedKey".into(),
        json!({"type": "object", "properties": created}),
    );
    map.insert("KeyPage".into(), json!({
        "type": "object",
        "required": ["items"],
        "properties": {"items": {"type": "array", "items": {"$ref": "#/components/schemas/Key"}}},
    }));
    map.insert("CreateKeyRequest".into(), json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["principal", "role"],
        "properties": {
            "principal": {"type": "string", "maxLength": MAX_PRINCIPAL_BYTES, "pattern": "^[A-Za-z0-9._@-]+$", "description": "Who the key proves; recorded in events as who acted."},
            "role": {"type": "string", "enum": ["client", "worker", "approver", "operator", "admin"]},
            "tenants": {"type": "array", "items": {"type": "string"}, "description": "Tenants it acts for, `[\"*\"]` for every tenant; default the caller's one tenant. An operator may only name its own tenants."},
            "grants": {"type": "array", "maxItems": MAX_KEY_GRANTS, "items": {"type": "string"}, "description": "Its permissions: the caller leg of a call's permission check, and what it holds as an approver."},
            "description": {"type": "string"},
            "expires_in_seconds": {"type": "integer", "minimum": 1, "maximum": MAX_KEY_LIFETIME_SECS, "description": "Lifetime from now by the database clock; default: no expiry."},
            "cert_subject": {"type": "string", "description": "Authenticate a client certificate with this RFC 4514 subject (over mTLS) instead of a key; no secret is made."},
        }
    }));
    map
}

/// The path items of the key routes.
fn key_paths(paths: &mut serde_json::Map<String, Value>) {
    paths.insert(KEYS_PATH.into(), json!({
        "get": {
            "operationId": "listKeys",
            "summary": "The keys the caller may manage: every key for an admin (`tenant` narrows), the keys of its tenant for an operator.",
            "tags": ["keys"],
            "parameters": [query("tenant", json!({"type": "string"}), "Only keys of this tenant.")],
            "responses": responses(ok("The keys, oldest first, with their status.", "KeyPage"), &["400", "401", "403", "503"]),
        },
        "post": {
            "operationId": "createKey",
            "summary": "Create an API key; the key is in this response only (only its hash is stored).",
            "description": "An admin makes keys of any role for any tenants; an operator keys of its own tenants and of any role but `admin`. Effective at once, on every engine.",
            "tags": ["keys"],
            "requestBody": body("CreateKeyRequest"),
            "responses": {
                "201": {"description": "The key.", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/CreatedKey"}}}},
                "400": {"$ref": "#/components/responses/BadRequest"},
                "401": {"$ref": "#/components/responses/Unauthorized"},
                "403": {"$ref": "#/components/responses/Forbidden"},
                "409": {"$ref": "#/components/responses/Conflict"},
                "413": {"$ref": "#/components/responses/PayloadTooLarge"},
                "415": {"$ref": "#/components/responses/UnsupportedMediaType"},
                "503": {"$ref": "#/components/responses/Unavailable"},
            },
        },
    }));
    paths.insert(KEY_REVOKE_PATH.into(), json!({"post": {
        "operationId": "revokeKey",
        "summary": "Revoke a key: its next request is refused (401), on every engine. Revoking twice keeps the first time.",
        "tags": ["keys"],
        "parameters": [{"name": "key_id", "in": "path", "required": true, "schema": {"type": "string"}}],
        "responses": responses(ok("The key, revoked.", "Key"), &["400", "401", "403", "404", "503"]),
    }}));
}

/// The document (OpenAPI 3.1.0, JSON).
pub fn document() -> Value {
    let mut paths = serde_json::Map::new();
    paths.insert(OPENAPI_PATH.into(), json!({"get": {
        "operationId": "getOpenApi",
        "summary": "This document.",
        "tags": ["meta"],
        "security": [],
        "responses": {"200": {"description": "The OpenAPI document.", "content": {"application/json": {"schema": {"type": "object"}}}}},
    }}));
    paths.insert(super::METRICS_PATH.into(), json!({"get": {
        "operationId": "getMetrics",
        "summary": "The engine's Prometheus metrics (text exposition format 0.0.4). Public: Prometheus scrapes without a credential.",
        "tags": ["meta"],
        "security": [],
        "responses": {"200": {"description": "The metrics.", "content": {"text/plain": {"schema": {"type": "string"}}}}},
    }}));
    paths.insert(UNCERTAIN_LIST_PATH.into(), json!({"get": {
        "operationId": "listUncertainOutcomes",
        "summary": "A page of a tenant's uncertain outcomes, newest first.",
        "tags": ["uncertain-outcomes"],
        "parameters": [
            param("tenant"),
            query("status", json!({"type": "string", "enum": ["open", "resolved", "any"], "default": "open"}), "Which records; default `open`."),
            query("tool", json!({"type": "string"}), "Only records of this tool."),
            query("run_id", json!({"type": "string", "format": "uuid"}), "Only records of this run."),
            query("older_than_ms", json!({"type": "integer", "minimum": 0}), "Only records created at least this many milliseconds ago."),
            query("newer_than_ms", json!({"type": "integer", "minimum": 0}), "Only records created at most this many milliseconds ago."),
            query("page_size", json!({"type": "integer", "minimum": 0, "maximum": 500, "default": 50}), "Records per page, 1 to 500; 0 means 50."),
            query("page_token", json!({"type": "string"}), "`next_page_token` of the previous page."),
        ],
        "responses": responses(ok("A page.", "UncertainOutcomePage"), &["400", "401", "403", "503"]),
    }}));
    paths.insert(UNCERTAIN_PATH.into(), json!({"get": {
        "operationId": "getUncertainOutcome",
        "summary": "One uncertain outcome: the call, its exact arguments, idempotency key, every attempt, and its resolution if any.",
        "tags": ["uncertain-outcomes"],
        "parameters": [param("tenant"), param("id")],
        "responses": responses(ok("The record.", "UncertainOutcome"), &["400", "401", "403", "404", "503"]),
    }}));
    paths.insert(UNCERTAIN_RESOLVE_PATH.into(), json!({"post": {
        "operationId": "resolveUncertainOutcome",
        "summary": "Resolve an open uncertain outcome; appends events and resumes the run when nothing else holds it.",
        "description": "`succeeded` uses `result` as the tool's result (validated against the tool's output type: 422 lists every violation); `failed` makes the model or workflow see `error` as the tool's failure; `retry` schedules the call again with the same idempotency key, or a new one (`new_idempotency_key: true`) when the operator is sure the first call did nothing. Recorded with who (`<token name>` or `<token name>/<operator>`), when and why. A record resolved already, or concurrently by someone else, gets 409 and nothing changes; another tenant's record is 404.",
        "tags": ["uncertain-outcomes"],
        "parameters": [param("tenant"), param("id")],
        "requestBody": body("ResolveRequest"),
        "responses": responses(ok("The record, resolved.", "UncertainOutcome"),
            &["400", "401", "403", "404", "409", "413", "415", "422", "503"]),
    }}));
    paths.insert(
        RUN_PATH.into(),
        json!({"get": {
            "operationId": "getRun",
            "summary": "One run, with the ids of its open uncertain outcomes.",
            "tags": ["runs"],
            "parameters": [param("tenant"), param("run_id")],
            "responses": responses(ok("The run.", "Run"), &["400", "401", "403", "404", "503"]),
        }}),
    );
    paths.insert(
        RUN_PAUSE_PATH.into(),
        run_control(
            "pauseRun",
            "Operator pause: the run's tasks are not claimed until resumed.",
            "409 when the run is finished or already paused by an operator.",
        ),
    );
    paths.insert(RUN_RESUME_PATH.into(), run_control("resumeRun", "Lift an operator pause.", "A run with open uncertain outcomes stays paused until they are resolved; 409 when the run is not paused by an operator."));
    paths.insert(
        RUN_CANCEL_PATH.into(),
        run_control(
            "cancelRun",
            "Cancel a run that has not finished.",
            "The reason is recorded with who cancelled; 409 when the run is finished.",
        ),
    );
    paths.insert(RUN_CALL_FAIL_PATH.into(), json!({"post": {
        "operationId": "failWaitingCall",
        "summary": "Fail a call that waits outside any task: an accepted async webhook whose callback never came, or a sync child run (which is cancelled).",
        "description": "The run goes on as if the call's timeout had fired: an agent sees the failure, a tool node takes its `on_error`. 409 when the call is not open or does not wait for a callback or a child, or the run is finished.",
        "tags": ["runs"],
        "parameters": [param("tenant"), param("run_id"), param("call_id")],
        "requestBody": body("RunControlRequest"),
        "responses": responses(ok("The run afterwards.", "Run"),
            &["400", "401", "403", "404", "409", "413", "415", "503"]),
    }}));
    paths.insert(MCP_TOOLS_PATH.into(), json!({"get": {
        "operationId": "listMcpTools",
        "summary": "The tenant's MCP tools: every tool a worker reported and every tool the tenant pinned, with the accepted and the newest listed definition.",
        "tags": ["mcp-tools"],
        "parameters": [
            param("tenant"),
            query("status", json!({"type": "string", "enum": ["pinned", "changed", "unpinned", "unlisted", "any"], "default": "any"}), "Only tools in this state; `changed` lists the definitions waiting for an operator."),
            query("server", json!({"type": "string"}), "Only tools of this server."),
        ],
        "responses": responses(ok("The tools, by server and tool.", "McpToolPage"), &["400", "401", "403", "503"]),
    }}));
    paths.insert(MCP_TOOL_PATH.into(), json!({"get": {
        "operationId": "getMcpTool",
        "summary": "One MCP tool, with every definition workers reported for it.",
        "tags": ["mcp-tools"],
        "parameters": [param("tenant"), param("server"), param("tool")],
        "responses": responses(ok("The tool.", "McpToolDetail"), &["400", "401", "403", "404", "503"]),
    }}));
    paths.insert(MCP_TOOL_ACCEPT_PATH.into(), json!({"post": {
        "operationId": "acceptMcpTool",
        "summary": "Accept a reported definition of an MCP tool for the tenant's runs.",
        "description": "Later calls of the tool go through while its server lists exactly this definition (the previous hash is kept as `previous_hash`). The hash must be one a worker reported (404 otherwise, naming those reported); a definition Belay refuses to call is 409. Recorded with who (`<token name>` or `<token name>/<operator>`), when and why.",
        "tags": ["mcp-tools"],
        "parameters": [param("tenant"), param("server"), param("tool")],
        "requestBody": body("AcceptMcpToolRequest"),
        "responses": responses(ok("The tool, with its new pin.", "McpTool"),
            &["400", "401", "403", "404", "409", "413", "415", "503"]),
    }}));
    paths.insert(TOOL_CALLS_PATH.into(), json!({"get": {
        "operationId": "listToolCalls",
        "summary": "A page of the tool calls the tenant's runs proposed, newest first: arguments, caller, decision (scheduled or refused, and why), confirmation and outcome of each.",
        "description": "Derived from the runs' events alone, so it says what the history says. Every parameter is checked: a wrong one is 400 naming it.",
        "tags": ["tool-calls"],
        "parameters": [
            param("tenant"),
            query("tool", json!({"type": "string"}), "Only calls of this tool (a refused call: the name the model wrote)."),
            query("run_id", json!({"type": "string", "format": "uuid"}), "Only calls of this run."),
            query("decision", json!({"type": "string", "enum": ["scheduled", "refused"]}), "Only scheduled, or only refused, calls; both when absent."),
            query("limit", json!({"type": "integer", "minimum": 1, "maximum": MAX_TOOL_CALLS_LIMIT, "default": DEFAULT_TOOL_CALLS_LIMIT}), "Calls per page."),
            query("page_token", json!({"type": "string"}), "`next_page_token` of the previous page."),
        ],
        "responses": responses(ok("A page.", "ToolCallPage"), &["400", "401", "403", "503"]),
    }}));
    key_paths(&mut paths);

    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Belay admin API",
            "version": "v1",
            "description": format!("Operator endpoint of the Belay engine: uncertain outcomes, run controls, MCP tool definitions and the audit of tool calls. Every route but this document needs `Authorization: Bearer <API key or configured token>` of an operator or admin; an operator acts for its own tenants only. Request bodies are JSON of at most {MAX_BODY_BYTES} bytes; unknown fields are refused. Errors are `{{\"error\": {{\"code\", \"message\", \"details\"}}}}`."),
        },
        "security": [{"bearer": []}],
        "tags": [
            {"name": "uncertain-outcomes", "description": "Tool calls that may have acted but whose result was lost."},
            {"name": "runs", "description": "Operator run controls."},
            {"name": "mcp-tools", "description": "Definitions of MCP tools: the one each tenant accepted (pinned) and the ones workers list; a changed definition is refused until accepted."},
            {"name": "tool-calls", "description": "The audit of tool calls: every call a tenant's runs proposed, and what became of it."},
            {"name": "keys", "description": "API keys: principals with a role, tenants and grants."},
            {"name": "meta"},
        ],
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "description": "An API key (`belay_<key id>_<secret>`, see the keys routes) or a token of `BELAY_ADMIN_TOKENS` (`name:token[:tenant]`: an admin for `*`, else an operator of its tenant)."}},
            "parameters": {
                "tenant": {"name": "tenant", "in": "path", "required": true, "schema": {"type": "string"}},
                "id": {"name": "id", "in": "path", "required": true, "description": "Uncertain outcome id.", "schema": {"type": "string", "format": "uuid"}},
                "run_id": {"name": "run_id", "in": "path", "required": true, "schema": {"type": "string", "format": "uuid"}},
                "call_id": {"name": "call_id", "in": "path", "required": true, "description": "A tool call of the run (`<node>.t<n>`, as in its events).", "schema": {"type": "string"}},
                "server": {"name": "server", "in": "path", "required": true, "description": "The MCP server's logical name.", "schema": {"type": "string"}},
                "tool": {"name": "tool", "in": "path", "required": true, "description": "The tool's name on the server.", "schema": {"type": "string"}},
            },
            "responses": {
                "BadRequest": error_response("`invalid_argument`: malformed JSON (with line and column), unknown field, wrong type, missing field, bad query or path parameter (a malformed UUID), empty `reason`."),
                "Unauthorized": {
                    "description": "`unauthorized`: missing or wrong bearer token. Nothing was changed.",
                    "headers": {"WWW-Authenticate": {"schema": {"type": "string"}, "description": "`Bearer realm=\"belay-admin\"`"}},
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
                },
                "Forbidden": error_response("`forbidden`: the principal's role or tenants do not allow this. Nothing was changed."),
                "NotFound": error_response("`not_found`: no such record or run for this tenant (another tenant's record is not found)."),
                "Conflict": error_response("`conflict`: the uncertain outcome is already resolved; `failed_precondition`: the run's state does not allow this (finished, not paused, already paused). Nothing was changed."),
                "PayloadTooLarge": error_response("`payload_too_large`: the body is larger than the limit."),
                "UnsupportedMediaType": error_response("`unsupported_media_type`: the body is not `application/json`."),
                "Unprocessable": error_response("`unprocessable`: the result does not match the tool's output type; `details` lists every violation (`<json pointer>: <message>`). Nothing was changed."),
                "Unavailable": error_response("`unavailable`: the engine's database is unavailable; retry later."),
            },
            "schemas": schemas(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::super::ROUTES;
    use super::*;

    #[test]
    fn every_route_is_documented_with_its_method() {
        let doc = document();
        for (method, path) in ROUTES {
            let op = &doc["paths"][*path][method.to_lowercase()];
            assert!(op.is_object(), "{method} {path} is not documented");
            assert!(
                op["responses"]["200"].is_object() || op["responses"]["201"].is_object(),
                "{method} {path}"
            );
        }
        let mut paths: Vec<&str> = ROUTES.iter().map(|(_, p)| *p).collect();
        paths.dedup();
        assert_eq!(
            doc["paths"].as_object().map(|p| p.len()),
            Some(paths.len()),
            "one path item per route path"
        );
    }
}
