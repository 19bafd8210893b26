//! `body_type: xml`, `body_schema:` and `request_variants:` against real
//! local servers: the XML a tool sends is parsed by the server (with an XML
//! parser of its own, not the worker's decoder), an XML answer comes back
//! as JSON, a body that fails its schema never leaves the worker, and the
//! request of a variant, as the engine puts it in the task spec, reaches
//! the variant's endpoint with its method and headers.
#![allow(missing_docs, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, Method, Uri, header};
use axum::routing::any;
use belay_proto::v1::FailureClass;
use belay_proto::wire::{
    BodyType, HttpBinding, HttpRequestOptions, QueryParam, ToolBinding, ToolCallSpec,
};
use belay_worker::{HttpToolClient, HttpToolError, NetworkPolicy};
use quick_xml::Reader;
use quick_xml::events::Event;
use serde_json::{Value, json};

#[derive(Debug, Clone)]
struct Seen {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
}

type SeenLog = Arc<Mutex<Vec<Seen>>>;

/// The `(element path, text)` pairs of an XML document, as a server's own
/// parser reads them (`order/amount` → `12.5`). Panics on malformed XML.
fn xml_leaves(body: &[u8]) -> Vec<(String, String)> {
    let mut reader = Reader::from_str(std::str::from_utf8(body).unwrap());
    let mut path: Vec<String> = Vec::new();
    let mut leaves = Vec::new();
    let mut text = String::new();
    loop {
        match reader.read_event().unwrap() {
            Event::Start(e) => {
                path.push(String::from_utf8_lossy(e.name().as_ref().as_bytes()).into_owned());
                text.clear();
            }
            Event::Text(t) => text.push_str(&t.xml10_content()),
            Event::GeneralRef(r) => {
                let name: &str = &r;
                text.push_str(quick_xml::escape::resolve_predefined_entity(name).unwrap());
            }
            Event::End(_) => {
                if !text.is_empty() {
                    leaves.push((path.join("/"), std::mem::take(&mut text)));
                }
                path.pop();
            }
            Event::Eof => break,
            _ => {}
        }
    }
    leaves
}

/// A server that records requests and answers with what `answer` makes of
/// each (status 200, its content type, its body).
async fn server(answer: fn(&Seen) -> (&'static str, String)) -> (String, SeenLog) {
    let seen: SeenLog = Arc::default();
    let router = Router::new().fallback(any({
        let seen = Arc::clone(&seen);
        move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| async move {
            let request = Seen {
                method,
                uri,
                headers,
                body,
            };
            let (content_type, body) = answer(&request);
            seen.lock().unwrap().push(request);
            ([(header::CONTENT_TYPE, content_type)], body)
        }
    }));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (format!("http://{addr}"), seen)
}

fn client() -> HttpToolClient {
    HttpToolClient::new(None, NetworkPolicy::allowing_loopback()).unwrap()
}

fn spec(
    tool: &str,
    endpoint: String,
    arguments: Value,
    request: HttpRequestOptions,
) -> ToolCallSpec {
    ToolCallSpec {
        tool: tool.into(),
        tool_version: 1,
        arguments,
        binding: ToolBinding::Http(HttpBinding {
            endpoint,
            method: "POST".into(),
            headers: BTreeMap::new(),
            timeout_ms: 5_000,
            request,
        }),
        idempotency_key: "run-1/n.t1".into(),
        input: None,
        config_params: Vec::new(),
        result_secrets: Vec::new(),
        variant: None,
        sampling: None,
        trace: None,
        dispatch_with_claim: false,
        repeat_safety: String::new(),
    }
}

/// An XML order service: reads the order with its own parser and answers
/// in XML.
fn xml_orders(seen: &Seen) -> (&'static str, String) {
    let leaves = xml_leaves(&seen.body);
    let amount = leaves
        .iter()
        .find(|(p, _)| p == "Order/amount")
        .map(|(_, t)| t.clone())
        .unwrap_or_default();
    (
        "application/xml; charset=utf-8",
        format!(
            r#"<?xml version="1.0"?><receipt status="accepted"><ref>R-{amount}</ref><line>a</line><line>b</line></receipt>"#
        ),
    )
}

#[tokio::test]
async fn an_xml_body_is_parsed_by_the_server_and_its_xml_answer_comes_back_as_json() {
    let (base, seen) = server(xml_orders).await;
    let request = HttpRequestOptions {
        body_type: BodyType::Xml,
        xml_root: Some("Order".into()),
        ..HttpRequestOptions::default()
    };
    let result = client()
        .call(&spec(
            "submit_order",
            format!("{base}/orders"),
            json!({"amount": 12.5, "note": "fish & chips <large>", "items": ["cod", "peas"], "gift": null}),
            request,
        ))
        .await
        .unwrap();
    assert_eq!(
        result,
        json!({"@status": "accepted", "ref": "R-12.5", "line": ["a", "b"]})
    );
    let seen = seen.lock().unwrap();
    let req = &seen[0];
    assert_eq!(
        req.headers[header::CONTENT_TYPE],
        "application/xml; charset=utf-8"
    );
    assert!(
        req.headers[header::ACCEPT]
            .to_str()
            .unwrap()
            .starts_with("application/xml")
    );
    assert_eq!(
        xml_leaves(&req.body),
        [
            ("Order/amount".to_owned(), "12.5".to_owned()),
            ("Order/items".to_owned(), "cod".to_owned()),
            ("Order/items".to_owned(), "peas".to_owned()),
            ("Order/note".to_owned(), "fish & chips <large>".to_owned()),
        ]
    );
}

#[tokio::test]
async fn the_root_defaults_to_the_tools_name_and_a_template_is_escaped_and_checked() {
    let (base, seen) = server(|_| ("text/plain", "ok".into())).await;
    client()
        .call(&spec(
            "submit_order",
            format!("{base}/orders"),
            json!({"amount": 3}),
            HttpRequestOptions {
                body_type: BodyType::Xml,
                ..HttpRequestOptions::default()
            },
        ))
        .await
        .unwrap();
    let template = HttpRequestOptions {
        body_type: BodyType::Xml,
        body_template: Some(
            r#"<o:order xmlns:o="urn:o" id="{{id}}"><o:note>{{note}}</o:note></o:order>"#.into(),
        ),
        ..HttpRequestOptions::default()
    };
    let result = client()
        .call(&spec(
            "submit_order",
            format!("{base}/orders"),
            json!({"id": "a\"b", "note": "x</o:note><evil/>"}),
            template.clone(),
        ))
        .await
        .unwrap();
    // A text answer stays a string.
    assert_eq!(result, json!("ok"));
    {
        let seen = seen.lock().unwrap();
        assert_eq!(
            xml_leaves(&seen[0].body),
            [("submit_order/amount".to_owned(), "3".to_owned())]
        );
        assert_eq!(
            xml_leaves(&seen[1].body),
            [("o:order/o:note".to_owned(), "x</o:note><evil/>".to_owned())]
        );
    }
    // A template that is not well-formed once filled is refused before
    // anything is sent.
    let broken = HttpRequestOptions {
        body_template: Some("<order>{{note}}</wrong>".into()),
        ..template
    };
    let err = client()
        .call(&spec(
            "submit_order",
            format!("{base}/orders"),
            json!({"note": "n"}),
            broken,
        ))
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::Rejected, "{err}");
    assert!(err.to_string().contains("not well-formed"), "{err}");
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn a_body_that_fails_its_schema_is_refused_before_it_is_sent() {
    let (base, seen) = server(|_| ("application/json", r#"{"ok": true}"#.into())).await;
    let schema = json!({
        "type": "object",
        "required": ["amount", "currency"],
        "properties": {
            "amount": {"type": "number", "exclusiveMinimum": 0},
            "currency": {"type": "string", "enum": ["EUR", "USD"], "default": "EUR"},
            "lines": {"type": "array", "items": {"type": "object", "required": ["sku"]}}
        },
        "additionalProperties": false
    });
    let request = |body_type| HttpRequestOptions {
        body_type,
        body_schema: Some(schema.clone()),
        ..HttpRequestOptions::default()
    };
    let url = format!("{base}/pay");
    // Authored: the default currency is added, then the body is valid.
    let ok = client()
        .call(&spec(
            "pay",
            url.clone(),
            json!({"amount": 5}),
            request(BodyType::Json),
        ))
        .await
        .unwrap();
    assert_eq!(ok, json!({"ok": true}));
    let sent: Value = serde_json::from_slice(&seen.lock().unwrap()[0].body).unwrap();
    assert_eq!(sent, json!({"amount": 5, "currency": "EUR"}));

    // Invalid: refused with the failing paths; the server sees nothing.
    let err = client()
        .call(&spec(
            "pay",
            url.clone(),
            json!({"amount": 0, "lines": [{"qty": 1}]}),
            request(BodyType::Json),
        ))
        .await
        .unwrap_err();
    assert!(matches!(err, HttpToolError::BodySchema(_)), "{err:?}");
    assert_eq!(err.class(), FailureClass::Rejected);
    let message = err.to_string();
    assert!(message.contains("nothing was sent"), "{message}");
    assert!(message.contains("/amount: "), "{message}");
    assert!(
        message.contains("/lines/0: \"sku\" is a required property"),
        "{message}"
    );
    // A form body is checked as the object it is encoded from.
    let err = client()
        .call(&spec(
            "pay",
            url.clone(),
            json!({"amount": 1, "currency": "GBP"}),
            request(BodyType::Form),
        ))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("/currency: "), "{err}");
    // And the check runs in `prepare`, before a dispatch is asked for.
    let err = client()
        .prepare(&spec(
            "pay",
            url,
            json!({"amount": -1}),
            request(BodyType::Xml),
        ))
        .unwrap_err();
    assert!(matches!(err, HttpToolError::BodySchema(_)), "{err:?}");
    assert_eq!(seen.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn the_eu_variant_goes_to_its_endpoint_with_its_method_and_headers() {
    let (us, us_seen) = server(|_| ("application/json", r#"{"ref": "us-1"}"#.into())).await;
    let (eu, eu_seen) = server(|_| ("application/json", r#"{"ref": "eu-1"}"#.into())).await;
    // The task spec as the engine writes it for a call whose `when` chose
    // `eu` (engine/machine/src/variants.rs): the variant's request merged
    // over the tool's, and its name.
    let base_headers = BTreeMap::from([("X-Region".to_owned(), "us".to_owned())]);
    let mut eu_spec = spec(
        "submit",
        format!("{eu}/eu/submit/{{id}}"),
        json!({"id": "o-1", "region": "EU", "order": {"n": 1}}),
        HttpRequestOptions {
            query_params: vec![QueryParam {
                key: "dc".into(),
                value: "fra".into(),
            }],
            ..HttpRequestOptions::default()
        },
    );
    if let ToolBinding::Http(http) = &mut eu_spec.binding {
        http.method = "PUT".into();
        http.headers = BTreeMap::from([
            ("X-Region".to_owned(), "eu".to_owned()),
            ("X-Residency".to_owned(), "eu-only".to_owned()),
        ]);
    }
    eu_spec.variant = Some("eu".into());
    let mut us_spec = spec(
        "submit",
        format!("{us}/us/submit/{{id}}"),
        json!({"id": "o-2", "region": "US", "order": {"n": 2}}),
        HttpRequestOptions::default(),
    );
    if let ToolBinding::Http(http) = &mut us_spec.binding {
        http.headers = base_headers;
    }
    // The spec survives its JSON round trip with the variant's name.
    let round: ToolCallSpec =
        serde_json::from_value(serde_json::to_value(&eu_spec).unwrap()).unwrap();
    assert_eq!(round.variant.as_deref(), Some("eu"));

    assert_eq!(client().call(&round).await.unwrap(), json!({"ref": "eu-1"}));
    assert_eq!(
        client().call(&us_spec).await.unwrap(),
        json!({"ref": "us-1"})
    );
    let eu_seen = eu_seen.lock().unwrap();
    assert_eq!(eu_seen.len(), 1);
    let req = &eu_seen[0];
    assert_eq!(req.method, Method::PUT);
    assert_eq!(req.uri.path(), "/eu/submit/o-1");
    assert_eq!(req.uri.query(), Some("dc=fra"));
    assert_eq!(req.headers["x-region"], "eu");
    assert_eq!(req.headers["x-residency"], "eu-only");
    let body: Value = serde_json::from_slice(&req.body).unwrap();
    assert_eq!(body, json!({"region": "EU", "order": {"n": 1}}));
    let us_seen = us_seen.lock().unwrap();
    assert_eq!(us_seen[0].method, Method::POST);
    assert_eq!(us_seen[0].uri.path(), "/us/submit/o-2");
    assert_eq!(us_seen[0].headers["x-region"], "us");
    assert!(us_seen[0].headers.get("x-residency").is_none());
}
