//! The client side of a server's requests and notifications ([`Handler`]):
//! `tools/list_changed` (bumps the change counter), progress, logging,
//! `elicitation/create` (answered from the call's durable answers, or with
//! `cancel`, the call then ending as `NeedsInput`) and
//! `sampling/createMessage` (a granted completion through the call's
//! [`super::super::Sampler`], or a JSON-RPC error saying why not; see the
//! parent module's docs).

use super::*;

pub(super) struct Handler {
    pub(super) shared: Arc<Shared>,
    pub(super) generation: u64,
}

impl Handler {
    pub(super) fn info() -> ClientConfig {
        let mut capabilities = ClientCapabilities::default();
        let mut elicitation = ElicitationCapability::default();
        elicitation.form = Some(FormElicitationCapability::default());
        elicitation.url = Some(UrlElicitationCapability::default());
        capabilities.elicitation = Some(elicitation);
        // Declared on every connection (connections are shared by calls);
        // each request is judged by the grant of the call that asked.
        #[allow(deprecated)]
        {
            capabilities.sampling = Some(SamplingCapability::default());
        }
        ClientConfig::new(
            capabilities,
            Implementation::new("belay-worker", env!("CARGO_PKG_VERSION")),
        )
    }

    /// The call an `elicitation/create` belongs to: by the request stream it
    /// came on (HTTP), else the only call in flight.
    fn call_of(&self, context: &RequestContext<RoleClient>) -> Option<u64> {
        if let Some(InboundStreamOrigin::OutboundRequest(id)) =
            context.extensions.get::<InboundStreamOrigin>()
            && let Some(marker) = self.shared.calls.by_request_id(self.generation, id)
        {
            return Some(marker);
        }
        self.shared.calls.single_in_flight(self.generation)
    }

    /// The call a `sampling/createMessage` belongs to: by the request
    /// stream it came on (HTTP), else the only call in flight if it has
    /// been the only call on this client since it started. Otherwise
    /// (stdio with calls that overlapped, or a request after its call
    /// ended while another runs) no call can be told for sure to have
    /// asked, and none is charged.
    fn sampling_call_of(&self, context: &RequestContext<RoleClient>) -> Option<u64> {
        if let Some(InboundStreamOrigin::OutboundRequest(id)) =
            context.extensions.get::<InboundStreamOrigin>()
            && let Some(marker) = self.shared.calls.by_request_id(self.generation, id)
        {
            return Some(marker);
        }
        self.shared.calls.sole_in_flight(self.generation)
    }
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        Self::info()
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let server = &self.shared.server.name;
        let Some(marker) = self.call_of(&context) else {
            // Every call that might have asked is told, so none reports an
            // answer shaped by a question nobody saw as a success.
            let mut slots = lock(&self.shared.calls.slots);
            for slot in slots.values_mut().filter(|s| {
                s.generation == self.generation
                    && matches!(s.state, SendState::Handed | SendState::Written)
            }) {
                slot.unattributed_elicitation = true;
            }
            tracing::warn!(
                server,
                "elicitation/create while several calls are in flight: cannot tell which asked; answered cancel"
            );
            return Ok(ElicitResult::new(rmcp::model::ElicitationAction::Cancel));
        };
        let mut slots = lock(&self.shared.calls.slots);
        let Some(slot) = slots.get_mut(&marker) else {
            return Ok(ElicitResult::new(rmcp::model::ElicitationAction::Cancel));
        };
        let asked = serde_json::to_value(&request).unwrap_or(Value::Null);
        let fits = slot.answers.front().is_some_and(|a| a.answers(&asked));
        if fits && let Some(answer) = slot.answers.pop_front() {
            let action = match answer.action {
                ElicitationAction::Accept => rmcp::model::ElicitationAction::Accept,
                ElicitationAction::Decline => rmcp::model::ElicitationAction::Decline,
                ElicitationAction::Cancel => rmcp::model::ElicitationAction::Cancel,
            };
            let mut result = ElicitResult::new(action);
            if let Some(content) = answer.content {
                result = result.with_content(content);
            }
            tracing::info!(
                server,
                call = slot.label,
                "elicitation answered from the call's answers"
            );
            return Ok(result);
        }
        let requests = asked;
        tracing::info!(
            server,
            call = slot.label,
            "elicitation/create: the call needs input"
        );
        // The first request is what the user must answer first; later ones
        // (after our cancel) are not kept.
        if slot.needs_input.is_none() {
            slot.needs_input = Some(InputNeeded {
                via: InputVia::Elicitation,
                requests,
                request_state: None,
                may_have_acted: true,
            });
        }
        Ok(ElicitResult::new(rmcp::model::ElicitationAction::Cancel))
    }

    /// A completion the server asks for during a call: made through the
    /// call's grant ([`CallRequest::sampling`]), at most its
    /// `max_requests`, each capped at its `max_tokens` and what is left of
    /// its `max_total_tokens`, a prompt within what is left of its
    /// `max_input_tokens`, text only; anything else is refused with a
    /// JSON-RPC error saying why, and the call is marked so that a failure
    /// that follows ends as [`CallOutcome::SamplingRefused`]. A request no
    /// call can be tied to for sure marks none, and a model that failed
    /// (-32603) marks the call so that a failure that follows ends as
    /// [`CallOutcome::LostAfterSend`]. The first error answer of a call
    /// is logged at warn, the rest at debug.
    #[allow(deprecated)]
    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        let server = &self.shared.server.name;
        let Some(marker) = self.sampling_call_of(&context) else {
            // No call is marked: one that did not ask would have its own
            // error reworded as a refused completion. A call that did ask
            // and fails for the refusal keeps its own outcome.
            let before = self
                .shared
                .calls
                .unattributed_sampling
                .fetch_add(1, Ordering::Relaxed);
            if before == 0 {
                tracing::warn!(
                    server,
                    "sampling/createMessage that no call in flight can be told for sure to have asked: refused"
                );
            } else {
                tracing::debug!(
                    server,
                    refused = before + 1,
                    "sampling/createMessage that no call in flight can be told for sure to have asked: refused"
                );
            }
            return Err(ErrorData::new(
                rmcp::model::ErrorCode(SAMPLING_REFUSED),
                "sampling/createMessage refused: Belay cannot tell for sure which tool call asked for it \
                 (none is in flight, or calls overlapped on this connection, whose requests carry no origin), \
                 so no grant applies",
                None,
            ));
        };
        let (label, session) = lock(&self.shared.calls.slots)
            .get(&marker)
            .map(|s| (s.label.clone(), s.sampling.clone()))
            .unwrap_or_default();
        let answer = match session {
            None => Err((SAMPLING_REFUSED, SAMPLING_NO_GRANT.to_owned())),
            Some(session) => sample(&session, params).await,
        };
        match answer {
            Ok(result) => {
                tracing::info!(
                    server,
                    call = label,
                    "sampling/createMessage answered by the run's model"
                );
                Ok(result)
            }
            Err((code, message)) => {
                let errors = lock(&self.shared.calls.slots)
                    .get_mut(&marker)
                    .map_or(1, |slot| {
                        // A model that failed is not a refusal: a failure
                        // that follows may be retried (`LostAfterSend`).
                        if code == SAMPLING_FAILED {
                            slot.sampling_model_failed = Some(message.clone());
                        } else {
                            slot.sampling_refused = true;
                        }
                        slot.sampling_errors = slot.sampling_errors.saturating_add(1);
                        slot.sampling_errors
                    });
                if errors == 1 {
                    tracing::warn!(server, call = label, code, "{message}");
                } else {
                    tracing::debug!(server, call = label, code, errors, "{message}");
                }
                Err(ErrorData::new(rmcp::model::ErrorCode(code), message, None))
            }
        }
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        tracing::info!(server = self.shared.server.name, "tools/list_changed");
        self.shared.changes.send_modify(|seq| *seq += 1);
        let _ = self.shared.events.send(McpEvent::ToolsChanged);
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let token = serde_json::to_value(&params.progress_token).unwrap_or(Value::Null);
        if let Some(call) = self.shared.calls.label_by_progress(&token) {
            let _ = self.shared.events.send(McpEvent::Progress {
                call,
                progress: params.progress,
                total: params.total,
                message: params.message,
            });
        }
    }

    #[allow(deprecated)]
    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let server = &self.shared.server.name;
        let data = params.data.to_string();
        match params.level {
            LoggingLevel::Debug => tracing::debug!(server, logger = params.logger, "{data}"),
            LoggingLevel::Info | LoggingLevel::Notice => {
                tracing::info!(server, logger = params.logger, "{data}");
            }
            LoggingLevel::Warning => tracing::warn!(server, logger = params.logger, "{data}"),
            _ => tracing::error!(server, logger = params.logger, "{data}"),
        }
    }
}

/// One granted completion: the request checked and capped, a completion
/// of the grant taken, the model called once, its tokens recorded. The
/// error is a JSON-RPC code and a message for the server.
#[allow(deprecated)]
async fn sample(
    session: &crate::mcp::SamplingSession,
    params: CreateMessageRequestParams,
) -> Result<CreateMessageResult, (i32, String)> {
    let (mut request, prompt_bytes) =
        sampling_request(session.grant(), params).map_err(|m| (SAMPLING_INVALID, m))?;
    let completion = session
        .reserve(request.max_tokens, prompt_bytes)
        .map_err(|m| (SAMPLING_REFUSED, m))?;
    request.max_tokens = completion.max_tokens();
    let answer = session.sampler().complete(request).await.map_err(|m| {
        (
            SAMPLING_FAILED,
            format!("sampling/createMessage failed: {m}"),
        )
    })?;
    completion.record(answer.input_tokens, answer.output_tokens);
    let mut result =
        CreateMessageResult::new(SamplingMessage::assistant_text(answer.text), answer.model);
    if let Some(reason) = answer.stop_reason {
        result = result.with_stop_reason(reason);
    }
    Ok(result)
}

/// A server's `sampling/createMessage` as a [`crate::mcp::SamplingRequest`]:
/// text messages only (an image, audio, a tool use or result is refused),
/// no tools (Belay declares no `sampling.tools`), `maxTokens` capped by the
/// grant's `max_tokens` (the session caps it further to what is left of
/// the grant); `includeContext`, `temperature`, `stopSequences`,
/// `metadata` and `modelPreferences` are not used (the grant's model
/// answers). Also returns the prompt's size in bytes (system prompt and
/// messages' text).
#[allow(deprecated)]
fn sampling_request(
    grant: &crate::mcp::SamplingGrant,
    params: CreateMessageRequestParams,
) -> Result<(crate::mcp::SamplingRequest, usize), String> {
    if params.tools.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(
            "sampling/createMessage with `tools` is not offered: Belay declares no `sampling.tools` capability"
                .into(),
        );
    }
    if params.messages.is_empty() {
        return Err("sampling/createMessage has no messages".into());
    }
    if params.max_tokens == 0 {
        return Err("sampling/createMessage: `maxTokens` must be at least 1".into());
    }
    let mut bytes = params.system_prompt.as_ref().map_or(0, String::len);
    let mut messages = Vec::with_capacity(params.messages.len());
    for (i, message) in params.messages.into_iter().enumerate() {
        let mut texts = Vec::new();
        for block in message.content.into_vec() {
            let kind = match block {
                SamplingMessageContentBlock::Text(text) => {
                    texts.push(text.text);
                    continue;
                }
                SamplingMessageContentBlock::Image(_) => "an image",
                SamplingMessageContentBlock::Audio(_) => "audio",
                SamplingMessageContentBlock::ToolUse(_) => "a tool use",
                SamplingMessageContentBlock::ToolResult(_) => "a tool result",
                _ => "content of an unknown type",
            };
            return Err(format!(
                "sampling/createMessage: message {i} holds {kind}; Belay's sampling takes text only"
            ));
        }
        let text = texts.join("\n\n");
        bytes = bytes.saturating_add(text.len());
        messages.push(crate::mcp::SamplingText {
            assistant: message.role == Role::Assistant,
            text,
        });
    }
    if bytes > MAX_SAMPLING_PROMPT_BYTES {
        return Err(format!(
            "sampling/createMessage: the prompt is {bytes} bytes, more than Belay sends to a model ({MAX_SAMPLING_PROMPT_BYTES})"
        ));
    }
    Ok((
        crate::mcp::SamplingRequest {
            model: grant.model.clone(),
            system_prompt: params.system_prompt,
            messages,
            max_tokens: params.max_tokens.min(grant.max_tokens),
        },
        bytes,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server's `sampling/createMessage` params, as it sends them.
    #[allow(deprecated)]
    fn asked(params: Value) -> CreateMessageRequestParams {
        serde_json::from_value(params).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_sampling_request_becomes_text_capped_by_the_grant_or_a_reason() {
        let grant = crate::mcp::SamplingGrant {
            model: "m".into(),
            max_requests: 1,
            max_tokens: 40,
            max_total_tokens: None,
            max_input_tokens: None,
        };
        let text = |t: &str| serde_json::json!({"type": "text", "text": t});
        let request = sampling_request(
            &grant,
            asked(serde_json::json!({
                "messages": [
                    {"role": "user", "content": [text("a"), text("b")]},
                    {"role": "assistant", "content": text("c")},
                ],
                "systemPrompt": "s",
                "maxTokens": 100,
                "temperature": 0.5,
                "includeContext": "thisServer",
            })),
        );
        // The prompt's bytes: "s", "a\n\nb" and "c".
        assert_eq!(
            request,
            Ok((
                crate::mcp::SamplingRequest {
                    model: "m".into(),
                    system_prompt: Some("s".into()),
                    messages: vec![
                        crate::mcp::SamplingText {
                            assistant: false,
                            text: "a\n\nb".into(),
                        },
                        crate::mcp::SamplingText {
                            assistant: true,
                            text: "c".into(),
                        },
                    ],
                    max_tokens: 40,
                },
                6
            ))
        );
        // Below the grant, the server's own bound stands.
        let small = sampling_request(
            &grant,
            asked(
                serde_json::json!({"messages": [{"role": "user", "content": text("a")}], "maxTokens": 7}),
            ),
        );
        assert_eq!(small.map(|(r, _)| r.max_tokens), Ok(7));

        let refused = |params: Value| match sampling_request(&grant, asked(params)) {
            Err(reason) => reason,
            Ok(request) => panic!("not refused: {request:?}"),
        };
        let image = serde_json::json!({"type": "image", "data": "AAAA", "mimeType": "image/png"});
        assert_eq!(
            refused(serde_json::json!({"messages": [
                {"role": "user", "content": text("look")},
                {"role": "user", "content": [text("at"), image]},
            ], "maxTokens": 5})),
            "sampling/createMessage: message 1 holds an image; Belay's sampling takes text only"
        );
        let audio = serde_json::json!({"type": "audio", "data": "AAAA", "mimeType": "audio/wav"});
        assert!(
            refused(serde_json::json!({"messages": [{"role": "user", "content": audio}], "maxTokens": 5}))
                .contains("message 0 holds audio")
        );
        assert!(
            refused(serde_json::json!({
                "messages": [{"role": "user", "content": text("x")}],
                "maxTokens": 5,
                "tools": [{"name": "t", "inputSchema": {"type": "object"}}],
            }))
            .contains("`tools` is not offered")
        );
        assert!(
            refused(serde_json::json!({"messages": [], "maxTokens": 5})).contains("no messages")
        );
        assert!(
            refused(serde_json::json!({"messages": [{"role": "user", "content": text("x")}], "maxTokens": 0}))
                .contains("at least 1")
        );
        let huge = "x".repeat(MAX_SAMPLING_PROMPT_BYTES + 1);
        assert!(
            refused(serde_json::json!({"messages": [{"role": "user", "content": text(&huge)}], "maxTokens": 5}))
                .contains("more than Belay sends to a model")
        );
    }
}
