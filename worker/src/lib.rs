//! Belay worker: claims tasks from the engine over gRPC (`belay.v1.WorkerService`),
//! performs them, and reports back. Workers hold no durable state.
//!
//! - [`model`]: `model_call` tasks against OpenAI Chat Completions (or a
//!   compatible server) or Anthropic Messages ([`ModelClient`], chosen by
//!   [`ModelProvider`]).
//! - [`http_tool`]: `tool_call` tasks with an HTTP binding ([`HttpToolClient`]).
//! - [`ssrf`]: which addresses tool requests may reach ([`NetworkPolicy`]):
//!   public ones, and the non-public ones the configuration allowlists.
//! - [`engine_client`]: the gRPC client, with backoff for reports
//!   ([`EngineClient`]).
//! - [`runner`]: the claim / heartbeat / perform / report loop ([`run`]).
//! - [`capabilities`]: what the worker tells the engine it can run, sent
//!   with every claim (worker pools).
//! - [`config`]: the settings, [`WorkerConfig`].
//! - [`placeholders`]: `{{config.NAME}}` values ([`placeholders::ConfigValues`])
//!   and their one resolver, for HTTP tools and MCP servers.
//! - [`oauth2`]: OAuth 2.0 client-credentials tokens for `auth:
//!   oauth2_client` HTTP tools and `oauth` MCP servers, cached per worker.
//! - [`oauth_discovery`]: where an MCP server's token endpoint is, found
//!   from its protected-resource metadata (RFC 9728) and its authorization
//!   server's metadata (RFC 8414), through the [`ssrf`] policy.
//! - [`mcp`]: the MCP client ([`mcp::McpClient`]): servers by logical name,
//!   tool discovery pinned by hash, calls with typed outcomes.
//! - [`mcp_tool`]: `tool_call` tasks with an MCP binding ([`mcp_tool::McpTools`]):
//!   servers connected at start, tools reported to the engine, calls
//!   dispatched with the definition hash and checked against the pin.
//! - [`sandbox_tool`]: `tool_call` tasks with a sandbox binding
//!   ([`sandbox_tool::SandboxTools`]): inline JavaScript or Python run by
//!   Node.js or CPython under bubblewrap, with no network, no host files,
//!   a cleared environment and memory and time limits.
//! - [`json_text`]: JSON text from outside made decodable where that needs
//!   no guess (lone surrogate escapes and bytes that are not UTF-8 become
//!   U+FFFD), for MCP servers' lines and model providers' answers.
//! - [`sampling`]: an MCP server's `sampling/createMessage` during a
//!   granted call, made with the worker's model client
//!   ([`sampling::ModelSampler`]).
//!
//! Every failure is reported with a [`belay_proto::v1::FailureClass`] saying
//! whether the effect may have happened: `NOT_SENT` (provably nothing was
//! sent), `MAY_HAVE_ACTED` (repeat safety decides), `REJECTED` (a definite
//! refusal, not retried). A tool's side effect starts only after the engine
//! accepted `DispatchToolCall`.
//!
//! # In detail (moved from ARCHITECTURE.md)
//!
//! Claims tasks, heartbeats leases, calls `DispatchToolCall` before any tool
//! acts, performs model calls (OpenAI Chat Completions or Anthropic Messages,
//! `--model-provider`) and HTTP tool
//! calls with reqwest (sending `Idempotency-Key`; for `type: async_webhook` it
//! puts the callback URL the dispatch returned into the body at
//! `callback_url_field`), and reports results with a
//! failure class (`not_sent`, `may_have_acted`, `rejected`).
//! `http_tool.rs` builds a request in `prepare` (no I/O, before dispatch):
//! path parameters, `query_params`, body by `body_type`/`body_mode`/
//! `body_template`, headers with `{{config.NAME}}` resolved
//! (`placeholders.rs`, the one resolver, shared with `mcp/config.rs`; values
//! from `BELAY_TOOL_CONFIG_<NAME>`, then the `--mcp-config` `config` map;
//! `resolve_arguments` fills the spec's `config_params` in `runner.rs`
//! before dispatch, for HTTP and MCP calls alike),
//! auth headers; an unresolvable placeholder is `NOT_SENT` before dispatch.
//! `http_tool/xml.rs`: `body_type: xml` bodies (JSON → elements under a root)
//! and XML answers (→ JSON), with quick-xml; `http_tool/body_schema.rs`:
//! `body_schema` defaults filled, then checked before dispatch
//! (`BodySchema`, `REJECTED`); `http_tool/tls.rs`: `--tls-profiles`
//! (client certificate, key, CA bundle), one reqwest client per profile built
//! by the same `tool_client_builder` (the SSRF resolver, no redirects, no
//! proxy); a server refusing the client certificate is recognised from the
//! rustls alert (`ClientCertificate`, `REJECTED`), a profile this worker lacks
//! is `UnknownTlsProfile` (`NOT_SENT`).
//! `oauth2.rs`: client-credentials tokens (RFC 6749 §4.4), cached per
//! (token URL, client id, scopes, RFC 8707 `resource`) with an injectable
//! `Clock`, one fetch shared by concurrent calls, fetched again once after a
//! 401 (`execute`); the client authenticates with HTTP Basic, or in the body
//! (`ClientAuth::Post`) when discovered metadata offers only that; the answer
//! is read up to 64 KiB (`MAX_TOKEN_ANSWER_BYTES`, `http_util::read_capped`),
//! `expires_in` as a number or a numeric string; also the bearer tokens of MCP
//! servers configured with `oauth` (`mcp/rmcp_client.rs`).
//! `oauth_discovery.rs`: where an MCP server's token endpoint is, when its
//! `oauth` names none (MCP authorization 2025-06-18+): `Challenge::parse` reads
//! the `WWW-Authenticate: Bearer` of its 401; `Discovery::discover` fetches the
//! protected-resource metadata (RFC 9728: the challenge's `resource_metadata`,
//! else the well-known URIs, path inserted then root), refuses one whose
//! `resource` is not the server's URL, then the authorization server metadata
//! (RFC 8414, then OpenID Connect) of the first 4 `authorization_servers`
//! (`MAX_AUTHORIZATION_SERVERS`), refusing an issuer mismatch, a missing
//! `token_endpoint` or no `client_credentials` grant; typed `DiscoveryError`s
//! name the URL (`NoUsableAuthorizationServer` lists each server tried and
//! why). `AuthorizationError` (discovery, token, or `TokenRefused`: a fresh
//! token answered 401) is what `McpError::Authorization` carries. Its reqwest client is `http_tool`'s `tool_client_builder`
//! (the SSRF resolver, no redirects, no proxy), answers are capped at 256 KiB
//! (`http_util::read_capped`, shared with `http_tool` and `oauth2.rs`).
//! rmcp's own discovery (feature `auth`) is not used: it brings the `oauth2`
//! crate and an address policy of its own that would refuse an allowlisted
//! private authorization server.
//! **Invariant:** every URL a server names goes through the worker's
//! `NetworkPolicy`; no token or secret in an error or a log.
//! **Invariant:** a configured value is never logged, put in an error or a
//! spec, and a placeholder is never sent as it is.
//! `ssrf.rs`: where tool requests may go (`NetworkPolicy`). `classify` names
//! the special-purpose range of an address (RFC 6890 and its successors: RFC
//! 1918, 6598, 3927, 4193, 4291, …; an IPv6 form that carries an IPv4 address,
//! `::ffff:127.0.0.1`, NAT64, 6to4, is judged by that address); the CIDR blocks
//! of `--allow-private-network` / `BELAY_ALLOW_PRIVATE_NETWORKS` allow some.
//! `CheckedResolver` is the tool client's DNS resolver (reqwest's `Resolve`
//! hook): it refuses a name if any of its addresses is refused and hands the
//! client only the addresses it checked, so nothing is resolved twice; an IP
//! literal, which no resolver sees, is checked by `HttpToolClient::prepare`,
//! before dispatch. Either refusal is `HttpToolError::Refused` (`REJECTED`,
//! nothing sent). Tool requests follow no redirects (a 3xx is
//! `HttpToolError::Redirect`) and ignore proxy variables, so the checked
//! address is the one connected to.
//! **Invariant:** a tool request connects only to an address the policy
//! allowed; the model provider and MCP server URLs are operator configuration
//! and are not checked.
//! `untraced.rs` (`restore_arguments`): after dispatch, each top-level
//! argument that is exactly `{{_secret._arg_<hex>}}` (a `visibility.trace:
//! false` value) is replaced by the value the dispatch handed out before the
//! request is built again; one without a value fails the call `NOT_SENT`.
//! `runner.rs` also carries the run secret vault: a tool with `SECRET_ACCESS`
//! gets its values from the dispatch and its request is prepared again with
//! them (`HttpToolClient::prepare_with_secrets`: `{{_secret.KEY}}` in headers
//! and the body template only, a missing key the empty string; the MCP
//! client's per-call headers through `CallRequest.secrets`); a producer's
//! result has its `result_secrets` taken out (`report_result`) and sent beside
//! it; what a tool answers is reported with those values redacted
//! (`Redactions`: `[REDACTED:config]`, `[REDACTED:secret]`,
//! `[REDACTED:vaulted]`). `placeholders::resolve_with_secrets` resolves
//! `{{config.NAME}}` and `{{_secret.KEY}}` in one pass, so a value is never
//! read as a placeholder.
//! `runner.rs`: the claim / heartbeat / perform / report loop (until a claim
//! has been answered, at start or after an outage, a claim does not long-poll,
//! so `/readyz` turns ready within a round trip); every claimed
//! task (a model call, or one of the tool calls a model proposed in a turn) is
//! its own tokio task, so the calls of one turn run at once, up to
//! `--concurrency` (`worker/tests/runner.rs`,
//! `tool_calls_of_one_turn_run_at_the_same_time`). It writes each claim's
//! outcome and the start of shutdown into `WorkerConfig.health`.
//! `health.rs`: the worker's readiness (`HealthState`, a `watch` channel:
//! starting, ready, engine unreachable since/why, stopping) and the axum
//! server of `--health-listen` (`/livez`, `/readyz`, `/metrics`) for a pod's
//! probes and Prometheus. `metrics.rs`: the worker's Prometheus metrics
//! (`WorkerMetrics`, held by `HealthState`; slots, tasks, claims).
//! `model.rs`: `ModelClient`, one HTTP client for both providers: sending,
//! timeouts, the API-key header and the failure class of every status and
//! transport error (429, and Anthropic's 529 overloaded, are `not_sent`; other
//! 4xx `rejected`; 5xx, timeouts after sending and unreadable answers
//! `may_have_acted`); `model/openai.rs` and `model/anthropic.rs` map a
//! `ModelCallSpec` to each API's body and its answer back (pure); a
//! `ToolSchema.strict` tool gets `function.strict: true` (OpenAI) or a
//! top-level `strict: true` (Anthropic), its `parameters` already rewritten by
//! the engine. Anthropic:
//! system text to the top-level `system`, roles merged so they alternate, tool
//! calls as `tool_use` blocks with the stored arguments parsed into `input`,
//! results as `tool_result` blocks (`is_error` when the engine's text starts
//! with `error:`), `max_tokens` defaulting to 4096, `stop_reason` mapped to the
//! engine's finish reasons (`max_tokens` → `length`). Both adapters: an answer
//! with tool calls that used the whole output-token limit sent is `length`
//! whatever the provider said (`model::mark_cut_off`: its last call was cut
//! off, and the engine runs none of a cut-off turn's calls); OpenAI sends a
//! stored call whose arguments are not a JSON object back as `{}`.
//! `telemetry.rs`: the spans of model and tool calls (GenAI semantic
//! conventions), children of their node's span from the spec's
//! `trace`, and the `traceparent` outbound HTTP requests and MCP `_meta`
//! carry.
//! `sampling.rs`: `ModelSampler`, the `mcp::Sampler` of granted MCP sampling
//! requests: one `ModelClient::call` (the request's system prompt and text
//! messages, no tools, `max_output_tokens` the capped `maxTokens`), the
//! finish reason mapped to MCP's `stopReason`.
//! `mcp_tool.rs`: `type: mcp` calls (`McpTools`): connects the configured
//! servers at start (a server down is retried in the background), lists and
//! reports their tools (`ReportMcpTools`) at start and on every tools-changed
//! signal, then per call: the tool is listed and callable (else a failure
//! before dispatch), `DispatchToolCall` with the listed hash returns the
//! tenant's pinned hash, `McpClient::call_tool` with it as `expected_hash` and
//! the call's idempotency key, and the `CallOutcome` becomes a result
//! (`structuredContent`, else the content blocks) or a failure with its class;
//! a refused changed definition is reported again before the failure; a
//! question for a person (`NeedsInput`) is reported with `RequestToolInput`,
//! and a repeated call hands the spec's `input` (the answers) to the client as
//! its `InputAnswers`. A spec with a sampling grant gets a `SamplingSession`
//! (made in `runner.rs` with `sampling.rs`'s `ModelSampler` over the worker's
//! `ModelClient`, the provider of its `model_call` tasks) in its
//! `CallRequest.sampling`; its usage is reported beside the result, the
//! failure or the question for a person (`report_mcp`), and with the failure
//! reported instead of a result the engine refused (`report_complete_vaulted`). A `resource:` tool (`McpTools::read`) fills the URI
//! template from the arguments (`mcp::expand_uri_template`, percent-encoded),
//! dispatches without a pin, reads with `McpClient::read_resource` and reports
//! `{"contents": […]}`; `belay-worker --list-mcp-resources SERVER` prints
//! `McpClient::list_resources` for an operator.
//! `sandbox_tool.rs`: `type: sandbox` calls (`SandboxTools`): inline
//! JavaScript or Python run as the body of a function whose parameters are the
//! tool's declared parameters, by a harness (`sandbox/harness.js` for
//! Node.js, `sandbox/harness.py` for CPython, passed with `-e` / `-c`) that
//! reads `{code, params, args}` on stdin and writes one JSON line (the result
//! or a typed error) on stdout, the code's prints going to stderr. Each call
//! is `prlimit` (`RLIMIT_DATA`, Python also `RLIMIT_AS`, CPU, no core, 256
//! files) → `bwrap` (every namespace unshared, uid 65534, no capabilities,
//! `--die-with-parent`, cleared environment, read-only binds of the runtime
//! only, a new tmpfs `/sandbox`) → the runtime, with a wall-clock kill at the
//! timeout. The runtimes' real executables are asked for at start (so a pyenv
//! shim is looked through); a missing one, or `bwrap`, fails its calls
//! `NOT_SENT` before dispatch; everything the code does (`SandboxError`:
//! syntax, exception, timeout, memory, result, crash) is `REJECTED`. Why
//! bubblewrap rather than gVisor or a container runtime: it is one small
//! Debian package, needs no daemon, and gives a new process tree per call in
//! milliseconds; the limits that need no cgroups come from `prlimit`.
//! **Invariant:** no durable state; no retries inside adapters (the engine owns
//! retries and records every attempt); never parses or judges model tool-call
//! arguments (the engine does); sandboxed code sees no network, no host file
//! but its runtime's, and none of the worker's environment.
//!
//! ## `worker/src/mcp/`: the MCP client
//! Discovers and calls the tools of MCP servers, configured by logical name
//! (`config.rs`: stdio `command`/`args`/`env`, or Streamable HTTP `url`/`headers`
//! and `oauth` client credentials, `{{config.X}}` placeholders, `trusted`;
//! `WorkerConfig::mcp`, `--mcp-config`; `ResolvedServer::network_policy` is the
//! worker's tool policy, for OAuth discovery). An `oauth` server's bearer token
//! comes from `oauth2.rs`'s `TokenCache` (one per server, kept across
//! reconnections), with the server's canonical URI as `resource`: with a
//! `token_url`, fetched before the handshake; without, the first request goes
//! without a token and its 401 starts `oauth_discovery.rs` (the endpoint found
//! is kept in `Shared` for the client's life, discovered again once when it
//! fails or a fresh token is refused again). The token is sent on every
//! POST/GET/DELETE, fetched again once on a 401 (the request is then sent
//! again: a 401 was not handled) (`rmcp_client.rs`: `OAuth::authorized`). A
//! connection that fails for it is `McpError::Authorization`, also when the
//! server refuses a fresh token (`AuthorizationError::TokenRefused`, naming the
//! token endpoint; a call then is `Disconnected`, not sent, with that text).
//! `mod.rs` is the interface (`McpClient`, `CallRequest`, `CallOutcome`,
//! `Discovery`, `default_repeat_safety`); `schema.rs` maps a listed tool to a
//! pinned `McpToolDefinition` (sha256 of the canonical definition) or a
//! `SchemaRefusal` (non-object schema, remote `$ref`, unknown dialect, too
//! large/deep, invalid); `result.rs` cuts results to the caller's byte limit;
//! `rmcp_client.rs` and its files (`rmcp_client/stdio.rs`, `http.rs`,
//! `handler.rs`) are the only ones that import `rmcp` (pinned `=3.11.0`): it
//! speaks 2026-07-28 and falls back to 2025-11-25, supervises the connection (a
//! stdio server that dies is restarted with `backon` backoff; its stderr goes to
//! `tracing`, its environment is only `PATH`-like basics plus `env`), and
//! classifies every call: `Ok`, `ToolError` (`isError`), `NeedsInput` (2026
//! `input_required`, an older server's `elicitation/create` answered `cancel`, or
//! error -32042), `Refused` (checked before sending: unknown tool, refused schema,
//! definition hash changed, invalid arguments or headers), `Disconnected` (not
//! sent), `LostAfterSend` (may have acted), `Rejected` (JSON-RPC error: `MAY_HAVE_ACTED` unless its code says
//! the request was refused before it ran), `Malformed`, `Undecodable` (an
//! answer that arrived but cannot be decoded even with its text repaired:
//! `REJECTED`, never retried as lost), `Cancelled`, `Timeout`, `SamplingRefused` (a
//! `sampling/createMessage` Belay did not give, and a call that then fails, or
//! an `input_required` holding a sampling request, ends so). Sampling: the
//! `sampling` capability is declared on every connection; a request is judged
//! by the call that asked (`Handler::sampling_call_of`: the HTTP stream it came
//! on, else the only call in flight on the connection if it has been the only
//! call on the client since it started, `Calls::sole_in_flight` and
//! `CallSlot::shared`; a request no call can be tied to for sure is refused,
//! charged to none and marks none) and its `CallRequest.sampling` session
//! (`SamplingSession`: the grant, a `Sampler`, the usage so far, the tokens
//! the running completions hold, and the completions running, which `finish`
//! waits for once the call has ended, so the usage the runner reports holds
//! every one): text only (`sampling_request`), at most `max_requests`,
//! `SamplingSession::reserve` caps `maxTokens` to the grant's `max_tokens` and
//! what is left of `max_total_tokens` and refuses a prompt estimated
//! (`estimated_prompt_tokens`, 4 bytes a token) past what is left of
//! `max_input_tokens`, then one `Sampler::complete` whose reported usage
//! `Completion::record` subtracts; anything else is a JSON-RPC error naming why
//! (-1 refused, -32602 not text or with tools, -32603 the model failed: this
//! one is not a refusal; a tool error or JSON-RPC error that follows becomes
//! `LostAfterSend`, may have acted, so repeat safety decides a retry). A call's first
//! error answer is logged at warn, the rest at debug and counted when it ends;
//! the worker's default log filter (`config::DEFAULT_LOG_FILTER`) keeps
//! rmcp's per-error-answer warn out. Resources: `list_resources` (`resources/list`
//! and `resources/templates/list`, every page; none when the server declares
//! no resources) and `read_resource` (`resources/read` once, contents cut to
//! the caller's limit, a JSON-RPC error is `Rejected`). The checks run against the catalog of
//! the connection the call goes out on (a call that waited for a restarted
//! server is checked against what the restarted server lists). Over HTTP, an
//! answer the server could not attribute (a JSON-RPC error without an `id`,
//! e.g. 400 for a session it forgot after a restart) is the end of that
//! connection (a new session is made; rmcp's own silent re-initialisation is
//! off), and a broken SSE stream is resumed at most three times before the
//! call counts as lost. Whether a request was sent is known exactly: a marker in the request's `_meta` (stripped before it leaves) lets
//! the transport wrapper record when it was written (stdio: `rmcp_client/stdio.rs`
//! writes each line under its call's slot lock, so a call that ends before its
//! line was written whole is abandoned and provably not sent; the session is then
//! torn down and the server restarted: it is not reading its stdin); a stdio
//! server's lines are decoded there too (lone surrogates and bytes that are not
//! UTF-8 repaired with U+FFFD, `json_text.rs`), and a server that exits before the
//! handshake is `McpError::Exited` with its exit status and last stderr lines; HTTP POSTs use fresh
//! connections so a refused connection proves nothing was sent. Tested in
//! `worker/tests/mcp.rs` against real servers installed by `.ci/mcp-servers.sh`
//! (`@modelcontextprotocol/server-everything` over stdio and HTTP,
//! `mcp-server-time` over stdio).
//! **Invariant:** no rmcp type outside `rmcp_client.rs`; a call is sent at most
//! once (only a request provably not sent moves to a re-made connection); a
//! call never waits in memory for a person (input becomes `NeedsInput`, answered
//! later from `InputAnswers`); tool descriptions and results are data; a server
//! gets a completion only within the grant of the call that asked, and every
//! completion it gets is in that call's reported usage.
//!

pub mod capabilities;
pub mod config;
pub mod engine_client;
pub mod health;
pub mod http_tool;
mod http_util;
pub mod json_text;
pub mod lease_clock;
pub mod mcp;
pub mod mcp_tool;
pub mod metrics;
pub mod model;
pub mod oauth2;
pub mod oauth_discovery;
pub mod placeholders;
pub mod runner;
pub mod sampling;
pub mod sandbox_tool;
pub mod ssrf;
pub mod telemetry;
pub mod untraced;

pub use config::{EngineAuth, ModelProvider, ModelProviderConfig, WorkerConfig};
pub use engine_client::{EngineClient, RetryPolicy};
pub use http_tool::{HttpToolClient, HttpToolError};
pub use model::{ModelClient, ModelError};
pub use runner::{run, run_with_engine};
pub use ssrf::NetworkPolicy;
