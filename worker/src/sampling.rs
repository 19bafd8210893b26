//! MCP sampling through the worker's own model adapters: [`ModelSampler`]
//! makes the completions an MCP server asks for during a granted call
//! (`ToolCallSpec.sampling`, [`crate::mcp::SamplingSession`]) with the same
//! [`ModelClient`] (provider, base URL, API key, timeout) the worker uses
//! for `model_call` tasks, under the grant's model name.
//!
//! A request is one model call, no retry and no tools: the server's
//! system prompt and text messages become a [`ModelCallSpec`] whose
//! `max_output_tokens` is the request's capped `maxTokens`; the answer's
//! text, the model name, MCP's `stopReason` and the provider's token
//! usage come back.

use belay_proto::wire::{ChatMessage, ModelCallSpec};

use crate::mcp::{BoxFuture, Sampler, SamplingAnswer, SamplingRequest};
use crate::model::ModelClient;

/// A [`Sampler`] over a [`ModelClient`].
#[derive(Debug, Clone)]
pub struct ModelSampler {
    client: ModelClient,
}

impl ModelSampler {
    /// A sampler calling `client`.
    pub fn new(client: ModelClient) -> Self {
        Self { client }
    }
}

/// The model call of a sampling request.
pub fn model_spec(request: &SamplingRequest) -> ModelCallSpec {
    let system = request
        .system_prompt
        .iter()
        .filter(|s| !s.is_empty())
        .map(|s| ChatMessage::System { content: s.clone() });
    let messages = request.messages.iter().map(|m| {
        if m.assistant {
            ChatMessage::Assistant {
                content: Some(m.text.clone()),
                tool_calls: Vec::new(),
            }
        } else {
            ChatMessage::User {
                content: m.text.clone(),
            }
        }
    });
    ModelCallSpec {
        model: request.model.clone(),
        messages: system.chain(messages).collect(),
        tools: Vec::new(),
        max_output_tokens: Some(request.max_tokens),
        // Inside the tool call's span already (no task of its own).
        trace: None,
    }
}

/// MCP's `stopReason` for the engine's finish reason (as the adapters map
/// it): `stop` → `endTurn`, `length` → `maxTokens`, `tool_calls` →
/// `toolUse`, anything else as it is.
pub fn stop_reason(finish_reason: &str) -> String {
    match finish_reason {
        "stop" => "endTurn",
        "length" => "maxTokens",
        "tool_calls" => "toolUse",
        other => other,
    }
    .to_owned()
}

impl Sampler for ModelSampler {
    fn complete(&self, request: SamplingRequest) -> BoxFuture<'_, Result<SamplingAnswer, String>> {
        Box::pin(async move {
            let spec = model_spec(&request);
            let result = self
                .client
                .call(&spec)
                .await
                .map_err(|e| format!("the model call failed: {e}"))?;
            Ok(SamplingAnswer {
                text: result.content.unwrap_or_default(),
                model: request.model,
                stop_reason: result.finish_reason.as_deref().map(stop_reason),
                input_tokens: result.usage.input_tokens,
                output_tokens: result.usage.output_tokens,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::SamplingText;

    #[test]
    fn a_request_becomes_one_model_call_without_tools() {
        let spec = model_spec(&SamplingRequest {
            model: "m".into(),
            system_prompt: Some("be brief".into()),
            messages: vec![
                SamplingText {
                    assistant: false,
                    text: "hi".into(),
                },
                SamplingText {
                    assistant: true,
                    text: "hello".into(),
                },
            ],
            max_tokens: 7,
        });
        assert_eq!(
            spec,
            ModelCallSpec {
                model: "m".into(),
                messages: vec![
                    ChatMessage::System {
                        content: "be brief".into()
                    },
                    ChatMessage::User {
                        content: "hi".into()
                    },
                    ChatMessage::Assistant {
                        content: Some("hello".into()),
                        tool_calls: Vec::new()
                    },
                ],
                tools: Vec::new(),
                max_output_tokens: Some(7),
                trace: None,
            }
        );
        assert_eq!(stop_reason("length"), "maxTokens");
        assert_eq!(stop_reason("stop"), "endTurn");
        assert_eq!(stop_reason("refusal"), "refusal");
    }
}
