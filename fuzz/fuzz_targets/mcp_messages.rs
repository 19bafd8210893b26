//! Fuzz target: what MCP servers send. Each input is read three ways, as
//! the worker's MCP client reads a server:
//! - every line as a line of a stdio server's stdout
//!   (`mcp::check_server_line`: repaired or not, decoded into a JSON-RPC
//!   message, an undecodable answer, a request, a notification; a tool
//!   result finished as a call's outcome against a tool with an output
//!   schema);
//! - the whole input as an SSE stream of Streamable HTTP (the `sse-stream`
//!   parser rmcp uses), each event's data as such a line;
//! - the whole input as a listed tool (`mcp::schema::check_tool`: a pinned
//!   definition or a refusal).
//!
//! Text repair is checked on the way (`json_text::repair`): it leaves
//! JSON that decodes alone, and what it returns is UTF-8.

#![no_main]

use belay_worker::json_text;
use belay_worker::mcp::{self, RawTool};
use futures_util::{FutureExt as _, StreamExt as _};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for line in data.split(|b| *b == b'\n') {
        let _ = mcp::check_server_line(line);
    }
    // Repair changes nothing of JSON that decodes, and makes UTF-8.
    let decodes = serde_json::from_slice::<serde_json::Value>(data).is_ok();
    match json_text::repair(data) {
        Some((text, _)) => {
            assert!(!decodes, "repaired text that decoded as it was");
            assert!(std::str::from_utf8(&text).is_ok());
        }
        None => assert!(std::str::from_utf8(data).is_ok()),
    }
    // The whole body is there at once, so every poll is ready.
    let bytes = bytes::Bytes::copy_from_slice(data);
    let body = futures_util::stream::iter([Ok::<_, std::io::Error>(bytes)]);
    let mut events = Box::pin(sse_stream::SseStream::from_bytes_stream(body));
    while let Some(Some(Ok(event))) = events.next().now_or_never() {
        if let Some(data) = event.data {
            let _ = mcp::check_server_line(data.as_bytes());
        }
    }
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
        let raw = RawTool {
            name: value["name"].as_str().unwrap_or("t").to_owned(),
            title: value["title"].as_str().map(str::to_owned),
            description: value["description"].as_str().map(str::to_owned),
            input_schema: value.get("inputSchema").cloned().unwrap_or(value.clone()),
            output_schema: value.get("outputSchema").cloned(),
            annotations: value.get("annotations").cloned(),
        };
        let _ = mcp::schema::check_tool(&raw);
    }
});
