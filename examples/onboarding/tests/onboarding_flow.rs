//! Both scripts end to end against the CRM, with a minimal stand-in for the
//! engine's agent loop: check each proposed call (tool on the list, arguments
//! JSON, schema), refuse with an error result or call the CRM, and feed the
//! result back until the model answers.

#![allow(missing_docs)]

mod common;

use belay_example_onboarding::{INTAKE_MODEL, ONBOARDING_MODEL, REFUSALS_MODEL};
use common::{client, start_crm, start_onboarding_model};
use serde_json::{Value, json};

/// The tools the example's agent has: name, CRM path, required string fields.
const TOOLS: &[(&str, &str, &[&str])] = &[
    ("lookup_customer", "/customers/lookup", &["email"]),
    ("create_account", "/accounts", &["email", "name"]),
    (
        "send_welcome_email",
        "/emails/welcome",
        &["email", "account_id"],
    ),
];

/// Checks a proposed call like the engine would; `Err` is the refusal text.
fn check(name: &str, arguments: &str) -> Result<(&'static str, Value), String> {
    let (_, path, required) = TOOLS
        .iter()
        .find(|(tool, _, _)| *tool == name)
        .ok_or_else(|| format!("unknown tool {name}"))?;
    let value: Value =
        serde_json::from_str(arguments).map_err(|e| format!("arguments are not JSON: {e}"))?;
    for field in *required {
        if !value.get(*field).is_some_and(Value::is_string) {
            return Err(format!("`{field}` must be a string"));
        }
    }
    Ok((path, value))
}

/// Runs the loop; returns the final content and the number of model calls.
async fn run(
    model_url: &str,
    crm_url: &str,
    model: &str,
    input: &Value,
) -> (Value, usize, Vec<String>) {
    let tools: Vec<Value> = TOOLS
        .iter()
        .map(|(name, _, _)| json!({"type": "function", "function": {"name": name, "description": name, "parameters": {"type": "object"}}}))
        .collect();
    let mut messages = vec![
        json!({"role": "system", "content": "Onboard the customer."}),
        json!({"role": "user", "content": input.to_string()}),
    ];
    let mut refusals = Vec::new();
    for calls in 1..=20 {
        let response = client()
            .post(format!("{model_url}/v1/chat/completions"))
            .json(&json!({"model": model, "messages": messages, "tools": tools}))
            .send()
            .await
            .expect("model call");
        assert_eq!(response.status(), 200);
        let body: Value = response.json().await.expect("json");
        let message = body["choices"][0]["message"].clone();
        messages.push(message.clone());
        let Some(tool_calls) = message["tool_calls"].as_array() else {
            let content = message["content"].as_str().expect("final content");
            return (
                serde_json::from_str(content).expect("final JSON"),
                calls,
                refusals,
            );
        };
        for call in tool_calls {
            let id = call["id"].as_str().expect("id");
            let name = call["function"]["name"].as_str().expect("name");
            let arguments = call["function"]["arguments"].as_str().expect("arguments");
            let result = match check(name, arguments) {
                Err(refusal) => {
                    refusals.push(name.to_owned());
                    json!({"error": refusal}).to_string()
                }
                Ok((path, value)) => {
                    let response = client()
                        .post(format!("{crm_url}{path}"))
                        .header("Idempotency-Key", format!("run-1/{id}"))
                        .json(&value)
                        .send()
                        .await
                        .expect("tool call");
                    assert!(
                        response.status().is_success(),
                        "{name}: {}",
                        response.status()
                    );
                    response.text().await.expect("text")
                }
            };
            messages.push(json!({"role": "tool", "tool_call_id": id, "content": result}));
        }
    }
    panic!("the script did not finish");
}

#[tokio::test]
async fn onboarding_script_onboards_a_customer() {
    let model = start_onboarding_model().await;
    let crm = start_crm().await;
    let input = json!({"email": "new@example.com", "name": "New Person", "plan": "pro"});
    let (answer, calls, refusals) = run(&model.url, &crm.url, ONBOARDING_MODEL, &input).await;
    assert_eq!(calls, 4);
    assert!(refusals.is_empty());
    let state = crm.state.snapshot();
    assert_eq!(state.accounts.len(), 1);
    assert_eq!(state.accounts[0].email, "new@example.com");
    assert_eq!(state.accounts[0].plan, "pro");
    assert_eq!(state.emails.len(), 1);
    assert_eq!(
        answer,
        json!({"account_id": state.accounts[0].account_id, "welcome_message_id": state.emails[0].message_id, "status": "onboarded"})
    );
    let turns: Vec<Option<usize>> = model.state.requests().iter().map(|r| r.turn).collect();
    assert_eq!(turns, [Some(0), Some(1), Some(2), Some(3)]);
    model.stop().await;
    crm.stop().await;
}

#[tokio::test]
async fn intake_script_creates_the_account_and_answers_its_id() {
    let model = start_onboarding_model().await;
    let crm = start_crm().await;
    let input = json!({"email": "new@example.com", "name": "New Person", "plan": "pro"});
    let (answer, calls, refusals) = run(&model.url, &crm.url, INTAKE_MODEL, &input).await;
    assert_eq!(calls, 3);
    assert!(refusals.is_empty());
    let state = crm.state.snapshot();
    assert_eq!(state.accounts.len(), 1);
    assert_eq!(state.accounts[0].plan, "pro");
    assert!(
        state.emails.is_empty(),
        "the workflow sends the welcome email"
    );
    assert_eq!(answer, json!({"account_id": state.accounts[0].account_id}));
    model.stop().await;
    crm.stop().await;
}

#[tokio::test]
async fn onboarding_without_a_plan_leaves_the_argument_out() {
    let model = start_onboarding_model().await;
    let crm = start_crm().await;
    let input = json!({"email": "new@example.com", "name": "New Person"});
    let (answer, calls, _) = run(&model.url, &crm.url, ONBOARDING_MODEL, &input).await;
    assert_eq!(calls, 4);
    assert_eq!(answer["status"], "onboarded");
    let create = &crm.state.requests(Some("/accounts"))[0];
    assert_eq!(
        create.body,
        json!({"email": "new@example.com", "name": "New Person"})
    );
    assert_eq!(crm.state.snapshot().accounts[0].plan, "starter");
    model.stop().await;
    crm.stop().await;
}

#[tokio::test]
async fn refusals_script_is_refused_three_times_then_onboards() {
    let model = start_onboarding_model().await;
    let crm = start_crm().await;
    let input = json!({"email": "new@example.com", "name": "New Person", "plan": "basic"});
    let (answer, calls, refusals) = run(&model.url, &crm.url, REFUSALS_MODEL, &input).await;
    assert_eq!(calls, 7);
    assert_eq!(
        refusals,
        ["delete_everything", "lookup_customer", "create_account"]
    );
    let state = crm.state.snapshot();
    assert_eq!(state.accounts.len(), 1, "refused calls never reach the CRM");
    assert_eq!(crm.state.requests(Some("/customers/lookup")).len(), 1);
    assert_eq!(answer["account_id"], state.accounts[0].account_id.as_str());
    assert_eq!(answer["status"], "onboarded");
    model.stop().await;
    crm.stop().await;
}
