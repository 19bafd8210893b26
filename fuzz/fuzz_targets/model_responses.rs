//! Fuzz target: the model adapters' answers. Each input is a 2xx body of
//! OpenAI Chat Completions and of Anthropic Messages: parsed into a model
//! result or a typed error (whose class is asked), never a panic. A result
//! then goes where a real one goes: the cut-off rule
//! (`model::mark_cut_off`), its JSON for the engine, and back into the next
//! request's transcript for both providers (`build_request`).
//!
//! Neither adapter streams (the worker asks for one whole answer per call),
//! so there is no streaming model parser to fuzz; the streaming path that
//! exists, MCP's Streamable HTTP (SSE), is in `mcp_messages`.

#![no_main]

use belay_proto::wire::{ChatMessage, ModelCallSpec};
use belay_worker::model::{anthropic, mark_cut_off, openai};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let parsers: [fn(&[u8]) -> Result<_, _>; 2] =
        [openai::parse_response, anthropic::parse_response];
    for parse in parsers {
        match parse(data) {
            Ok(mut result) => {
                mark_cut_off(&mut result, Some(16));
                let json = serde_json::to_string(&result).expect("a model result encodes as JSON");
                assert!(serde_json::from_str::<serde_json::Value>(&json).is_ok());
                let spec = ModelCallSpec {
                    model: "m".into(),
                    messages: vec![ChatMessage::Assistant {
                        content: result.content.clone(),
                        tool_calls: result.tool_calls.clone(),
                    }],
                    tools: Vec::new(),
                    max_output_tokens: Some(16),
                    trace: None,
                };
                let request = openai::build_request(&spec);
                // A call's arguments go back as a JSON object's text.
                if let Some(calls) = request["messages"][0]["tool_calls"].as_array() {
                    for call in calls {
                        let text = call["function"]["arguments"].as_str().expect("text");
                        assert!(
                            serde_json::from_str::<serde_json::Value>(text)
                                .is_ok_and(|v| v.is_object())
                        );
                    }
                }
                let _ = anthropic::build_request(&spec);
            }
            Err(e) => {
                let _ = e.class();
                assert!(!e.to_string().is_empty());
            }
        }
    }
});
