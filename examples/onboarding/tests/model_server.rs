//! The scripted model server over real HTTP: turn selection, placeholders, raw
//! arguments, errors, authentication and the request log.

#![allow(missing_docs)]

mod common;

use belay_example_onboarding::model_server::{
    DEFAULT_COMPLETION_TOKENS, DEFAULT_PROMPT_TOKENS, Script, ScriptError,
};
use belay_example_onboarding::{INTAKE_MODEL, MCP_TEST_MODELS, ONBOARDING_MODEL, REFUSALS_MODEL};
use common::{client, start_model, start_onboarding_model};
use serde_json::{Value, json};

const INPUT: &str = r#"{"email": "new@example.com", "name": "New Person", "plan": "pro"}"#;

/// Posts a chat completions request; returns status and JSON body.
async fn complete(url: &str, body: &Value) -> (u16, Value) {
    let response = client()
        .post(format!("{url}/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .expect("send");
    let status = response.status().as_u16();
    (status, response.json().await.expect("json body"))
}

/// A request for `model` whose transcript is `messages` after the system and
/// user messages.
fn request(model: &str, messages: &[Value]) -> Value {
    let mut all = vec![
        json!({"role": "system", "content": "You onboard customers."}),
        json!({"role": "user", "content": INPUT}),
    ];
    all.extend_from_slice(messages);
    json!({
        "model": model,
        "messages": all,
        "tools": [
            {"type": "function", "function": {"name": "lookup_customer", "description": "d", "parameters": {"type": "object"}}},
            {"type": "function", "function": {"name": "create_account", "description": "d", "parameters": {"type": "object"}}},
        ],
    })
}

/// An assistant message calling `name` with id `id`, and the tool's result.
fn exchange(id: &str, name: &str, result: &str) -> [Value; 2] {
    [
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": name, "arguments": "{}"}}
        ]}),
        json!({"role": "tool", "tool_call_id": id, "content": result}),
    ]
}

fn only_call(body: &Value) -> (&str, &str, &str) {
    let calls = body["choices"][0]["message"]["tool_calls"]
        .as_array()
        .expect("tool_calls");
    assert_eq!(calls.len(), 1, "{body}");
    (
        calls[0]["id"].as_str().expect("id"),
        calls[0]["function"]["name"].as_str().expect("name"),
        calls[0]["function"]["arguments"]
            .as_str()
            .expect("arguments"),
    )
}

#[tokio::test]
async fn turn_is_the_number_of_assistant_messages() {
    let server = start_onboarding_model().await;

    let (status, body) = complete(&server.url, &request(ONBOARDING_MODEL, &[])).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], ONBOARDING_MODEL);
    assert_eq!(body["choices"][0]["index"], 0);
    assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(body["choices"][0]["message"]["content"], Value::Null);
    let (id, name, arguments) = only_call(&body);
    assert_eq!((id, name), ("call_0_0", "lookup_customer"));
    assert_eq!(
        serde_json::from_str::<Value>(arguments).expect("json"),
        json!({"email": "new@example.com"})
    );
    assert_eq!(
        body["usage"],
        json!({
            "prompt_tokens": DEFAULT_PROMPT_TOKENS,
            "completion_tokens": DEFAULT_COMPLETION_TOKENS,
            "total_tokens": DEFAULT_PROMPT_TOKENS + DEFAULT_COMPLETION_TOKENS,
        })
    );

    let lookup = exchange("call_0_0", "lookup_customer", r#"{"found": false}"#);
    let (status, body) = complete(&server.url, &request(ONBOARDING_MODEL, &lookup)).await;
    assert_eq!(status, 200, "{body}");
    let (id, name, arguments) = only_call(&body);
    assert_eq!((id, name), ("call_1_0", "create_account"));
    assert_eq!(
        serde_json::from_str::<Value>(arguments).expect("json"),
        json!({"email": "new@example.com", "name": "New Person", "plan": "pro"})
    );
    server.stop().await;
}

#[tokio::test]
async fn a_retried_request_gets_the_identical_answer() {
    let server = start_onboarding_model().await;
    let body = request(
        ONBOARDING_MODEL,
        &exchange("call_0_0", "lookup_customer", r#"{"found": false}"#),
    );
    let first = client()
        .post(format!("{}/v1/chat/completions", server.url))
        .json(&body)
        .send()
        .await
        .expect("send");
    let first = first.bytes().await.expect("bytes");
    let second = client()
        .post(format!("{}/chat/completions", server.url))
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(second.status(), 200);
    assert_eq!(first, second.bytes().await.expect("bytes"));
    server.stop().await;
}

#[tokio::test]
async fn result_placeholders_read_the_latest_result_of_that_tool() {
    let server = start_onboarding_model().await;

    // Onboarding turn 2: the welcome email uses the created account's id.
    let mut transcript = exchange("call_0_0", "lookup_customer", r#"{"found": false}"#).to_vec();
    transcript.extend(exchange(
        "call_1_0",
        "create_account",
        r#"{"account_id": "acct_000007"}"#,
    ));
    let (status, body) = complete(&server.url, &request(ONBOARDING_MODEL, &transcript)).await;
    assert_eq!(status, 200, "{body}");
    let (id, name, arguments) = only_call(&body);
    assert_eq!((id, name), ("call_2_0", "send_welcome_email"));
    assert_eq!(
        serde_json::from_str::<Value>(arguments).expect("json"),
        json!({"email": "new@example.com", "account_id": "acct_000007"})
    );

    // Refusals turn 6 (final answer): an earlier create_account call was
    // refused with a different result; the latest create_account result wins,
    // and results are matched by tool_call_id, not by position.
    let mut transcript = Vec::new();
    transcript.extend(exchange(
        "call_0_0",
        "delete_everything",
        r#"{"error": "unknown tool"}"#,
    ));
    transcript.extend(exchange(
        "call_1_0",
        "lookup_customer",
        r#"{"error": "invalid JSON"}"#,
    ));
    transcript.extend(exchange(
        "call_2_0",
        "create_account",
        r#"{"account_id": "refused"}"#,
    ));
    transcript.extend(exchange(
        "call_3_0",
        "lookup_customer",
        r#"{"found": false}"#,
    ));
    transcript.extend(exchange(
        "call_4_0",
        "create_account",
        r#"{"account_id": "acct_000007"}"#,
    ));
    transcript.extend(exchange(
        "call_5_0",
        "send_welcome_email",
        r#"{"message_id": "msg_000003"}"#,
    ));
    let (status, body) = complete(&server.url, &request(REFUSALS_MODEL, &transcript)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert!(
        body["choices"][0]["message"].get("tool_calls").is_none(),
        "{body}"
    );
    let content = body["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    assert_eq!(
        serde_json::from_str::<Value>(content).expect("final answer is JSON"),
        json!({"account_id": "acct_000007", "welcome_message_id": "msg_000003", "status": "onboarded"})
    );
    server.stop().await;
}

#[tokio::test]
async fn unresolvable_placeholders_are_400_naming_the_placeholder() {
    let server = start_onboarding_model().await;

    // Turn 2 needs a create_account result; give it only a lookup and an
    // unrelated assistant message.
    let mut transcript = exchange("call_0_0", "lookup_customer", r#"{"found": false}"#).to_vec();
    transcript.push(json!({"role": "assistant", "content": "thinking"}));
    let (status, body) = complete(&server.url, &request(ONBOARDING_MODEL, &transcript)).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(
        message.contains("{{result.create_account.account_id}}"),
        "{message}"
    );
    assert!(
        message.contains("no tool message answers a call of `create_account`"),
        "{message}"
    );

    // The result exists but lacks the field.
    let mut transcript = exchange("call_0_0", "lookup_customer", r#"{"found": false}"#).to_vec();
    transcript.extend(exchange(
        "call_1_0",
        "create_account",
        r#"{"id": "acct_1"}"#,
    ));
    let (status, body) = complete(&server.url, &request(ONBOARDING_MODEL, &transcript)).await;
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(
        message.contains("field `account_id` not found"),
        "{message}"
    );

    // The result is not JSON.
    let mut transcript = exchange("call_0_0", "lookup_customer", r#"{"found": false}"#).to_vec();
    transcript.extend(exchange("call_1_0", "create_account", "created!"));
    let (status, body) = complete(&server.url, &request(ONBOARDING_MODEL, &transcript)).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .expect("message")
            .contains("is not JSON"),
        "{body}"
    );

    // The input is not JSON.
    let plain =
        json!({"model": ONBOARDING_MODEL, "messages": [{"role": "user", "content": "hello"}]});
    let (status, body) = complete(&server.url, &plain).await;
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(
        message.contains("{{input.email}}") && message.contains("not JSON"),
        "{message}"
    );

    // The input lacks the field.
    let partial = json!({"model": ONBOARDING_MODEL, "messages": [{"role": "user", "content": "{\"mail\": 1}"}]});
    let (status, body) = complete(&server.url, &partial).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .expect("message")
            .contains("field `email` not found"),
        "{body}"
    );
    server.stop().await;
}

#[tokio::test]
async fn refusals_script_sends_unknown_tool_raw_invalid_json_and_schema_failure() {
    let server = start_onboarding_model().await;
    let refusal = r#"{"error": "refused"}"#;

    let (status, body) = complete(&server.url, &request(REFUSALS_MODEL, &[])).await;
    assert_eq!(status, 200, "{body}");
    let (id, name, _) = only_call(&body);
    assert_eq!((id, name), ("call_0_0", "delete_everything"));

    let mut transcript = exchange("call_0_0", "delete_everything", refusal).to_vec();
    let (status, body) = complete(&server.url, &request(REFUSALS_MODEL, &transcript)).await;
    assert_eq!(status, 200, "{body}");
    let (id, name, arguments) = only_call(&body);
    assert_eq!((id, name), ("call_1_0", "lookup_customer"));
    assert_eq!(
        arguments, r#"{"email": "#,
        "raw arguments must be sent verbatim"
    );
    assert!(serde_json::from_str::<Value>(arguments).is_err());

    transcript.extend(exchange("call_1_0", "lookup_customer", refusal));
    let (status, body) = complete(&server.url, &request(REFUSALS_MODEL, &transcript)).await;
    assert_eq!(status, 200, "{body}");
    let (_, name, arguments) = only_call(&body);
    assert_eq!(name, "create_account");
    assert_eq!(arguments, r#"{"email":42}"#);

    transcript.extend(exchange("call_2_0", "create_account", refusal));
    let (status, body) = complete(&server.url, &request(REFUSALS_MODEL, &transcript)).await;
    assert_eq!(status, 200, "{body}");
    let (id, name, arguments) = only_call(&body);
    assert_eq!((id, name), ("call_3_0", "lookup_customer"));
    assert_eq!(
        serde_json::from_str::<Value>(arguments).expect("json"),
        json!({"email": "new@example.com"})
    );
    server.stop().await;
}

#[tokio::test]
async fn unknown_model_is_404_and_an_exhausted_script_is_400() {
    let server = start_onboarding_model().await;
    let (status, body) = complete(&server.url, &request("gpt-nonexistent", &[])).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(body["error"]["code"], "model_not_found");
    assert!(
        body["error"]["message"]
            .as_str()
            .expect("message")
            .contains("gpt-nonexistent"),
        "{body}"
    );

    let five: Vec<Value> = (0..5)
        .map(|i| json!({"role": "assistant", "content": format!("turn {i}")}))
        .collect();
    let (status, body) = complete(&server.url, &request(ONBOARDING_MODEL, &five)).await;
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(
        message.contains(ONBOARDING_MODEL)
            && message.contains("turn 5")
            && message.contains("exhausted"),
        "{message}"
    );
    server.stop().await;
}

#[tokio::test]
async fn malformed_requests_get_openai_style_errors() {
    let server = start_onboarding_model().await;
    for body in [
        "not json",
        r#"{"messages": []}"#,
        r#"{"model": "m", "messages": [{"content": "no role"}]}"#,
    ] {
        let response = client()
            .post(format!("{}/v1/chat/completions", server.url))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("send");
        assert_eq!(response.status(), 400, "{body}");
        let error: Value = response.json().await.expect("json");
        assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
    }
    let (status, body) = complete(
        &server.url,
        &json!({"model": ONBOARDING_MODEL, "messages": [], "stream": true}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .expect("message")
            .contains("stream"),
        "{body}"
    );
    server.stop().await;
}

#[tokio::test]
async fn api_key_is_required_when_configured() {
    let server = start_model(Script::onboarding().expect("script"), Some("sk-test")).await;
    let body = request(ONBOARDING_MODEL, &[]);
    let url = format!("{}/v1/chat/completions", server.url);

    let response = client().post(&url).json(&body).send().await.expect("send");
    assert_eq!(response.status(), 401);
    let error: Value = response.json().await.expect("json");
    assert_eq!(error["error"]["code"], "invalid_api_key");

    let response = client()
        .post(&url)
        .bearer_auth("sk-wrong")
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 401);

    let response = client()
        .post(&url)
        .bearer_auth("sk-test")
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 200);

    let models = client()
        .get(format!("{}/v1/models", server.url))
        .bearer_auth("sk-test")
        .send()
        .await
        .expect("send");
    let models: Value = models.json().await.expect("json");
    let ids: Vec<&str> = models["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    let expected = every_model();
    assert_eq!(ids, expected);
    server.stop().await;
}

#[tokio::test]
async fn requests_are_logged() {
    let server = start_onboarding_model().await;
    complete(&server.url, &request(ONBOARDING_MODEL, &[])).await;
    complete(&server.url, &request("missing-model", &[])).await;
    let lookup = exchange("call_0_0", "lookup_customer", r#"{"found": false}"#);
    complete(&server.url, &request(ONBOARDING_MODEL, &lookup)).await;

    let log: Value = client()
        .get(format!("{}/_requests", server.url))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    let log = log.as_array().expect("array");
    assert_eq!(log.len(), 3);
    let summary: Vec<(u64, &str, u64, u64, u64)> = log
        .iter()
        .map(|r| {
            (
                r["seq"].as_u64().expect("seq"),
                r["model"].as_str().expect("model"),
                r["message_count"].as_u64().expect("count"),
                r["turn"].as_u64().expect("turn"),
                r["status"].as_u64().expect("status"),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (1, ONBOARDING_MODEL, 2, 0, 200),
            (2, "missing-model", 2, 0, 404),
            (3, ONBOARDING_MODEL, 4, 1, 200)
        ]
    );
    assert_eq!(
        log[0]["tools"],
        json!(["lookup_customer", "create_account"])
    );
    assert_eq!(log[2]["body"]["messages"][3]["tool_call_id"], "call_0_0");

    // The same log in-process.
    let records = server.state.requests();
    assert_eq!(records.len(), 3);
    assert_eq!(
        records[1]
            .error
            .as_deref()
            .map(|e| e.contains("missing-model")),
        Some(true)
    );
    server.stop().await;
}

#[tokio::test]
async fn custom_scripts_set_usage_content_and_typed_placeholders() {
    let script = Script::from_yaml(
        r#"
m:
  - content: "hello {{input.name}}"
    tool_calls:
      - name: count
        arguments: {n: "{{input.n}}", label: "n={{input.n}}", nested: [{x: "{{input}}"}]}
      - name: noargs
    usage: {prompt_tokens: 7}
"#,
    )
    .expect("script");
    let server = start_model(script, None).await;
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "{\"name\": \"Ada\", \"n\": 3}"}]});
    let (status, body) = complete(&server.url, &body).await;
    assert_eq!(status, 200, "{body}");
    let message = &body["choices"][0]["message"];
    assert_eq!(message["content"], "hello Ada");
    let calls = message["tool_calls"].as_array().expect("calls");
    assert_eq!(calls[0]["id"], "call_0_0");
    assert_eq!(calls[1]["id"], "call_0_1");
    assert_eq!(
        serde_json::from_str::<Value>(calls[0]["function"]["arguments"].as_str().expect("args"))
            .expect("json"),
        json!({"n": 3, "label": "n=3", "nested": [{"x": {"name": "Ada", "n": 3}}]})
    );
    assert_eq!(calls[1]["function"]["arguments"], "{}");
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 7, "completion_tokens": DEFAULT_COMPLETION_TOKENS, "total_tokens": 7 + DEFAULT_COMPLETION_TOKENS})
    );
    server.stop().await;
}

#[test]
fn invalid_scripts_are_refused_with_a_reason() {
    assert!(matches!(
        Script::from_yaml("m: [: bad"),
        Err(ScriptError::Parse(_))
    ));
    assert!(matches!(
        Script::from_yaml("m:\n  - contents: typo\n"),
        Err(ScriptError::Parse(_))
    ));
    match Script::from_yaml("m:\n  - content: ok\n  - usage: {prompt_tokens: 1}\n") {
        Err(ScriptError::Invalid { model, turn, .. }) => {
            assert_eq!((model.as_str(), turn), ("m", 1))
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
    let missing = Script::from_file(std::path::Path::new("/nonexistent/script.yaml"));
    assert!(matches!(missing, Err(ScriptError::Read { .. })));
}

#[test]
fn embedded_script_is_the_file_and_has_every_model() {
    let script = Script::onboarding().expect("embedded script parses");
    let expected = every_model();
    assert_eq!(script.models().collect::<Vec<_>>(), expected);
    assert_eq!(script.turns(INTAKE_MODEL).map(<[_]>::len), Some(3));
    assert_eq!(script.turns(ONBOARDING_MODEL).map(<[_]>::len), Some(4));
    assert_eq!(script.turns(REFUSALS_MODEL).map(<[_]>::len), Some(7));
    let on_disk =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/script.yaml")).expect("read");
    assert_eq!(on_disk, belay_example_onboarding::ONBOARDING_SCRIPT);
}

/// Every model of the embedded script, in its (sorted) order.
fn every_model() -> Vec<&'static str> {
    let mut expected = vec!["scripted-enrich", INTAKE_MODEL];
    expected.extend(MCP_TEST_MODELS);
    expected.extend([
        ONBOARDING_MODEL,
        "scripted-pii",
        "scripted-process",
        REFUSALS_MODEL,
        "scripted-untraced",
        "scripted-vault",
    ]);
    expected
}
