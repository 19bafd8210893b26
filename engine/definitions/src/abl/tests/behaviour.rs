//! Tests of the behaviour properties: `compaction:`, `on_result:` and
//! `on_error:`, `confirmation:`, `hints:` and caching, `rate_limit:` and
//! `circuit_breaker:`.

use super::*;

use std::collections::BTreeMap;

use serde_json::json;

use crate::expr::Expr;
use crate::model::{
    CircuitBreakerDef, ConfirmationDef, Latency, ToolBindingDef, ToolDef, ToolHints,
};

use super::super::behaviour::{MAX_ESSENTIAL_FIELDS, MAX_OUTCOME_VARS};

#[test]
fn compaction_essential_fields() {
    let t = one_tool(&tool_with(
        "search(q: string) -> {items: object[]}",
        "    compaction:\n      essential_fields: [items.id, \"items.name\", items.id]\n",
    ));
    let fields = t.compaction.map(|c| c.essential_fields);
    assert_eq!(
        fields,
        Some(vec!["items.id".to_owned(), "items.name".to_owned()])
    );
    let t = one_tool(&tool_with(
        "search(q: string) -> object",
        "    compaction:\n      essential_fields:\n        - total\n        - meta.page\n",
    ));
    let fields = t.compaction.map(|c| c.essential_fields);
    assert_eq!(
        fields,
        Some(vec!["total".to_owned(), "meta.page".to_owned()])
    );
    // Absent: the definition's JSON (and content hash) is unchanged.
    let t = one_tool(&tool_with("search(q: string) -> object", ""));
    let json = serde_json::to_value(&t).unwrap();
    assert!(json.get("compaction").is_none());
    assert!(json.get("on_result").is_none() && json.get("on_error").is_none());
}

#[test]
fn compaction_paths_and_outcome_variables_are_bounded() {
    let paths: Vec<String> = (0..=MAX_ESSENTIAL_FIELDS)
        .map(|i| format!("k{i}"))
        .collect();
    let errs = errors(&tool_with(
        "f() -> object",
        &format!(
            "    compaction:\n      essential_fields: [{}]\n",
            paths.join(", ")
        ),
    ));
    assert!(
        errs.iter().any(|e| e.contains("more than the limit of 64")),
        "{errs:?}"
    );
    let vars: String = (0..=MAX_OUTCOME_VARS)
        .map(|i| format!("        v{i}: .result\n"))
        .collect();
    let errs = errors(&tool_with(
        "f() -> object",
        &format!("    on_result:\n      set:\n{vars}"),
    ));
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(errs[0].contains("more than 16 variables"), "{errs:?}");
}

#[test]
fn compaction_max_description_length() {
    let t = one_tool(&tool_with(
        "search(q: string) -> object",
        "    compaction:\n      max_description_length: 500\n",
    ));
    let c = t.compaction.expect("compaction");
    assert_eq!(c.max_description_length, Some(500));
    assert!(c.essential_fields.is_empty());
}

#[test]
fn compaction_errors() {
    let sig = "search(q: string) -> object";
    let cases = [
        (
            "    compaction:\n      essential_fields: [a, b..c, ]\n",
            vec![
                "8:29: `b..c` is not a field path: write names joined by `.`, like `items.id`",
                "8:35: empty item in `essential_fields`",
            ],
        ),
        (
            "    compaction:\n      essential_fields: items.id\n",
            vec![
                "8:25: `essential_fields` takes a list of dotted paths, like `[items.id, items.name]`",
            ],
        ),
        (
            "    compaction:\n      essential_fields: []\n",
            vec!["8:25: `essential_fields` needs at least one field path"],
        ),
        (
            "    compaction:\n      summary_timeout_ms: 500\n      max_search_tokens: 9\n      essential_fields: [a]\n",
            vec![
                "8:7: `compaction.summary_timeout_ms` is not applicable: Belay never summarises a result with a model (what the model sees is cut by `essential_fields`, `max_description_length` and `max_result_bytes`, deterministically)",
                "9:7: `compaction.max_search_tokens` is not applicable: it applies to SearchAI results, and Belay has no SearchAI tools",
            ],
        ),
        (
            "    compaction: [a]\n",
            vec!["7:17: `compaction` takes an indented block on the following lines, not a value"],
        ),
        (
            "    compaction:\n      keep: [a]\n",
            vec![
                "8:7: unknown property `keep` in `compaction:` (expected `essential_fields` or `max_description_length`)",
            ],
        ),
        (
            "    compaction:\n      max_description_length: 0\n",
            vec![
                "8:31: `max_description_length` must be a whole number of characters, at least 1, not `0`",
            ],
        ),
        (
            "    compaction:\n      max_description_length: 5\n      max_description_length: 6\n",
            vec!["9:7: duplicate `max_description_length` in `compaction:`"],
        ),
    ];
    for (extra, expected) in cases {
        assert_eq!(errors(&tool_with(sig, extra)), expected, "{extra}");
    }
}

#[test]
fn on_result_and_on_error_set_run_vars() {
    let t = one_tool(&tool_with(
        "get_balance(account_id: string) -> {balance: number, currency: string}",
        "    on_result:\n      set:\n        current_balance: .result.balance\n        account_currency: \".result.currency | ascii_downcase\"\n    on_error:\n      set:\n        balance_error: .error.message\n",
    ));
    let sources = |m: &BTreeMap<String, Expr>| -> Vec<(String, String)> {
        m.iter()
            .map(|(k, e)| (k.clone(), e.source().to_owned()))
            .collect()
    };
    assert_eq!(
        sources(&t.on_result),
        vec![
            (
                "account_currency".to_owned(),
                ".result.currency | ascii_downcase".to_owned()
            ),
            ("current_balance".to_owned(), ".result.balance".to_owned()),
        ]
    );
    assert_eq!(
        sources(&t.on_error),
        vec![("balance_error".to_owned(), ".error.message".to_owned())]
    );
}

#[test]
fn on_result_errors() {
    let sig = "get(id: string) -> object";
    let cases = [
        (
            "    on_result:\n      set:\n        x: .result | now\n",
            "9:12: `x` is not a valid jq expression:",
        ),
        (
            "    on_result:\n      set:\n        x: .result.[\n",
            "9:12: `x` is not a valid jq expression:",
        ),
        (
            "    on_result:\n      set:\n        x: result.balance\n",
            "write `.result.balance`, with the leading `.`",
        ),
        (
            "    on_error:\n      set:\n        x-y: .error.message\n",
            "9:9: variable name `x-y` must be letters, digits and `_`, not starting with a digit",
        ),
        (
            "    on_error:\n      set:\n        x: .error\n        x: .error\n",
            "10:9: duplicate variable `x` in `on_error.set:`",
        ),
        (
            "    on_result:\n      do:\n        - SET: x = 1\n",
            "8:7: `on_result.do:` action blocks are not applicable",
        ),
        (
            "    on_result:\n      keep: 1\n",
            "8:7: unknown property `keep` in `on_result:` (expected `set`)",
        ),
        (
            "    on_result:\n      set:\n        x:\n",
            "9:9: `x` needs a value",
        ),
    ];
    for (extra, expected) in cases {
        let errs = errors(&tool_with(sig, extra));
        assert_eq!(errs.len(), 1, "{extra}: {errs:?}");
        assert!(
            errs[0].starts_with(expected) || errs[0].contains(expected),
            "{extra}: {errs:?}"
        );
    }
}

#[test]
fn confirmation_blocks() {
    let t = one_tool(
        "TOOLS:\n  execute_payment(amount: number, recipient: string) -> {confirmation_id: string}\n    description: \"Execute a payment\"\n    type: http\n    endpoint: \"/api/payments\"\n    method: POST\n    confirmation:\n      require: always\n      immutable_params: [recipient]\n    permission: pay.exec\n    repeat_safety: idempotent\n",
    );
    assert_eq!(
        t.confirmation,
        Some(ConfirmationDef {
            when_side_effects: false,
            immutable_params: vec!["recipient".into()],
            approver_grant: "pay.exec".into(),
        })
    );
    let t = one_tool(
        "TOOLS:\n  f(a: string) -> string\n    type: http\n    endpoint: /f\n    confirmation:\n      require: never\n    permission: p\n    repeat_safety: never\n",
    );
    assert_eq!(t.confirmation, None);
    assert_eq!(
        errors(
            "TOOLS:\n  f(a: string) -> string\n    type: http\n    endpoint: /f\n    confirmation:\n      require: sometimes\n      immutable_params: [b]\n      consent_scope: [x]\n    permission: p\n    repeat_safety: never\n"
        ),
        vec![
            "6:16: unknown `require: sometimes` (expected `always`, `never` or `when_side_effects`)",
            "8:7: `consent_scope` is not supported yet: Belay asks an approver, not the end user in a conversation",
            "5:5: `confirmation:` needs `require: always`, `require: never` or `require: when_side_effects`",
        ]
    );
    assert_eq!(
        errors(
            "TOOLS:\n  f(a: string) -> string\n    type: http\n    endpoint: /f\n    confirmation:\n      require: always\n      immutable_params: [b]\n    permission: p\n    repeat_safety: never\n"
        ),
        vec!["7:25: `immutable_params` names `b`, which is not a parameter of `f`"]
    );
}

#[test]
fn confirmation_when_side_effects_asks_only_for_tools_with_side_effects() {
    let tool = |extra: &str| {
        one_tool(&tool_with(
            "f(a: string) -> string",
            &format!(
                "    confirmation:\n      require: when_side_effects\n      immutable_params: [a]\n{extra}"
            ),
        ))
    };
    let asks = Some(ConfirmationDef {
        when_side_effects: true,
        immutable_params: vec!["a".into()],
        approver_grant: "p.read".into(),
    });
    // Undeclared: taken to have side effects.
    assert_eq!(tool("").confirmation, asks);
    assert!(tool("").has_side_effects());
    assert_eq!(tool("    effect: side_effect\n").confirmation, asks);
    assert_eq!(tool("    effect: state_write\n").confirmation, asks);
    assert_eq!(
        tool("    hints:\n      side_effects: true\n").confirmation,
        asks
    );
    assert_eq!(tool("    effect: read_only\n").confirmation, None);
    assert!(!tool("    effect: read_only\n").has_side_effects());
    assert_eq!(
        tool("    hints:\n      side_effects: false\n").confirmation,
        None
    );
    assert_eq!(
        tool("    effect: read_only\n    hints:\n      side_effects: false\n").confirmation,
        None
    );
    // `effect:` and the hint must agree.
    assert_eq!(
        errors(&tool_with(
            "f() -> string",
            "    effect: read_only\n    hints:\n      side_effects: true\n"
        )),
        vec!["7:13: `effect: read_only` contradicts `hints.side_effects: true`; keep one of them"]
    );
    assert_eq!(
        errors(&tool_with(
            "f() -> string",
            "    effect: side_effect\n    hints:\n      side_effects: false\n"
        )),
        vec![
            "7:13: `effect: side_effect` contradicts `hints.side_effects: false`; keep one of them"
        ]
    );
    assert_eq!(
        errors(&tool_with("f() -> string", "    effect: destructive\n")),
        vec![
            "7:13: unknown effect `destructive` (expected `read_only`, `state_write` or `side_effect`)"
        ]
    );
}

#[test]
fn hints_are_parsed_and_stored_and_the_timeout_hint_yields_to_timeout() {
    // The seed's example.
    let t = one_tool(
        "TOOLS:\n  get_balance(account_id: string) -> {balance: number}\n    description: \"Get account balance\"\n    type: http\n    endpoint: /balance\n    hints:\n      cacheable: true\n      latency: fast\n      timeout: 5000\n      side_effects: false\n      requires_auth: true\n    permission: bank.read\n    repeat_safety: idempotent\n",
    );
    assert_eq!(
        t.hints,
        ToolHints {
            cacheable: Some(true),
            latency: Some(Latency::Fast),
            side_effects: Some(false),
            requires_auth: Some(true),
            timeout_ms: Some(5000),
            cache_ttl_ms: None,
        }
    );
    assert!(!t.has_side_effects());
    let timeout = |t: &ToolDef| match &t.binding {
        ToolBindingDef::Http { timeout_ms, .. }
        | ToolBindingDef::Mcp { timeout_ms, .. }
        | ToolBindingDef::McpResource { timeout_ms, .. }
        | ToolBindingDef::AsyncWebhook { timeout_ms, .. } => Some(*timeout_ms),
        ToolBindingDef::Workflow { timeout_ms, .. } => *timeout_ms,
        ToolBindingDef::Sandbox(b) => b.timeout_ms,
    };
    assert_eq!(timeout(&t), Some(5000));
    // `timeout:` wins over the hint; the hint wins over the file's default.
    let t = one_tool(&tool_with(
        "f() -> string",
        "    timeout: 2s\n    hints:\n      timeout: 9s\n",
    ));
    assert_eq!(timeout(&t), Some(2000));
    let t = one_tool(
        "TOOLS:\n  timeout: 20s\n  f() -> string\n    type: http\n    endpoint: /f\n    hints:\n      timeout: 7s\n    permission: p\n    repeat_safety: never\n",
    );
    assert_eq!(timeout(&t), Some(7000));
    let t = one_tool(
        "TOOLS:\n  f() -> string\n    type: mcp\n    server: s\n    hints:\n      timeout: 1m\n    permission: p\n",
    );
    assert_eq!(timeout(&t), Some(60_000));
    // No hints: nothing stored, and the stored form is unchanged.
    let t = one_tool(&tool_with("f() -> string", ""));
    assert!(t.hints.is_empty());
    let stored = serde_json::to_value(&t).unwrap();
    for key in ["hints", "effect", "injected", "model_input_schema"] {
        assert!(stored.get(key).is_none(), "{key} serialized");
    }
    assert_eq!(
        errors(&tool_with(
            "f() -> string",
            "    hints:\n      cacheable: yes\n      latency: instant\n      timeout: soon\n      cost: 3\n      cacheable: false\n      latency\n    hints:\n      timeout: 1s\n"
        )),
        vec![
            "8:18: unknown cacheable `yes` (expected `true` or `false`)",
            "9:16: unknown latency `instant` (expected `fast`, `medium` or `slow`)",
            "10:16: timeout `soon` is not a duration (write e.g. `30s`, `500ms`, `2m`, or a number of milliseconds)",
            "11:7: unknown hint `cost` (expected `cacheable`, `cache_ttl`, `latency`, `side_effects`, `requires_auth` or `timeout`)",
            "12:7: duplicate hint `cacheable` (first on line 8)",
            "13:7: expected `hint: value` in `hints:`, found `latency`",
            "14:5: duplicate property `hints` (first on line 7)",
        ]
    );
    assert_eq!(
        errors(&tool_with("f() -> string", "    hints: fast\n")),
        vec!["7:12: `hints` takes an indented block on the following lines, not a value"]
    );
}

#[test]
fn cacheable_takes_a_ttl_and_is_refused_on_a_tool_that_acts() {
    // A GET tool: a method that may change something needs the tool
    // to say it does not (below).
    let get_with = |sig: &str, extra: &str| tool_with(sig, &format!("{extra}    method: GET\n"));
    // The seed's "Caching hints" example, with Belay's required
    // properties and the `cache_ttl` extension.
    let t = one_tool(
        "TOOLS:\n  get_exchange_rate(from: string, to: string) -> {rate: number}\n    description: \"Get current exchange rate\"\n    type: http\n    endpoint: \"/api/fx/rate\"\n    method: GET\n    hints:\n      cacheable: true\n      latency: fast\n      cache_ttl: 5m\n    effect: read_only\n    permission: fx.read\n    repeat_safety: idempotent\n",
    );
    assert_eq!(
        (t.hints.cacheable, t.hints.cache_ttl_ms),
        (Some(true), Some(300_000))
    );
    assert_eq!(t.cache_ttl_ms(1), Some(300_000));
    for (ttl, ms) in [
        ("90000", 90_000),
        ("30s", 30_000),
        ("1h 30m", 5_400_000),
        ("7days", 604_800_000),
    ] {
        let t = one_tool(&get_with(
            "f() -> string",
            &format!("    hints:\n      cacheable: true\n      cache_ttl: {ttl}\n"),
        ));
        assert_eq!(t.hints.cache_ttl_ms, Some(ms), "{ttl}");
    }
    // Without a TTL, the engine's default (pinned when a run starts).
    let t = one_tool(&get_with(
        "f() -> string",
        "    hints:\n      cacheable: true\n",
    ));
    assert_eq!((t.hints.cache_ttl_ms, t.cache_ttl_ms(42)), (None, Some(42)));
    assert_eq!(t.cache_ttl_ms(0), None);
    // `cacheable: false` (or nothing) never caches.
    let t = one_tool(&get_with(
        "f() -> string",
        "    hints:\n      cacheable: false\n",
    ));
    assert_eq!(t.cache_ttl_ms(42), None);
    assert_eq!(
        errors(&get_with(
            "f() -> string",
            "    hints:\n      cacheable: true\n      cache_ttl: 0\n"
        )),
        vec![
            "9:18: `cache_ttl` must be more than 0 (leave `cacheable: true` out to cache nothing)"
        ]
    );
    assert_eq!(
        errors(&get_with(
            "f() -> string",
            "    hints:\n      cacheable: true\n      cache_ttl: 8days\n"
        )),
        vec![
            "9:18: `cache_ttl: 8days` is longer than 7 days, the longest a result is served from the cache"
        ]
    );
    let e = errors(&get_with(
        "f() -> string",
        "    hints:\n      cacheable: true\n      cache_ttl: soon\n",
    ));
    assert!(
        e.len() == 1 && e[0].starts_with("9:18: `cache_ttl: soon` is not a duration"),
        "{e:?}"
    );
    assert_eq!(
        errors(&get_with(
            "f() -> string",
            "    hints:\n      cache_ttl: 5m\n"
        )),
        vec![
            "8:18: `hints.cache_ttl` goes with `hints.cacheable: true`: without it nothing is cached"
        ]
    );

    // A tool that acts may not be cached: each refusal points at
    // `cacheable: true` (line 8, column 18).
    let refused = |props: &str, repeat_safety: &str| {
        errors(&format!(
            "TOOLS:\n  f() -> string\n    type: http\n    endpoint: \"/x\"\n    permission: p\n    repeat_safety: {repeat_safety}\n    hints:\n      cacheable: true\n{props}    method: GET\n"
        ))
    };
    let why = |what: &str| {
        vec![format!(
            "8:18: `cacheable: true` does not fit tool `f`: {what}; a cached result is served instead of calling the tool"
        )]
    };
    assert_eq!(
        refused("    effect: side_effect\n", "idempotent"),
        why("it declares `effect: side_effect`")
    );
    // A method that may change something needs the tool to say it
    // does not.
    let post = |props: &str| {
        errors(&format!(
            "TOOLS:\n  f() -> string\n    type: http\n    endpoint: \"/x\"\n    permission: p\n    repeat_safety: idempotent\n    hints:\n      cacheable: true\n{props}"
        ))
    };
    assert_eq!(
        post(""),
        why(
            "it sends `POST` (the default method), which may change something; declare `effect: read_only` (or `hints.side_effects: false`) if it does not"
        )
    );
    assert_eq!(
        post("    method: delete\n"),
        why(
            "it sends `DELETE`, which may change something; declare `effect: read_only` (or `hints.side_effects: false`) if it does not"
        )
    );
    for ok in [
        "    method: POST\n    effect: read_only\n",
        "      side_effects: false\n    method: PUT\n",
        "    method: GET\n",
    ] {
        let t = one_tool(&format!(
            "TOOLS:\n  f() -> string\n    type: http\n    endpoint: \"/x\"\n    permission: p\n    repeat_safety: idempotent\n    hints:\n      cacheable: true\n{ok}"
        ));
        assert_eq!(t.hints.cacheable, Some(true), "{ok}");
    }
    assert_eq!(
        refused("    effect: state_write\n", "idempotent"),
        why("it declares `effect: state_write`")
    );
    assert_eq!(
        refused("      side_effects: true\n", "idempotent"),
        why("it declares `hints.side_effects: true`")
    );
    assert_eq!(
        refused("", "never"),
        why(
            "it is `repeat_safety: never` (a call whose effect must not happen twice); only an `idempotent` tool that changes nothing may be cached"
        )
    );
    assert_eq!(
        refused("", "reconcile"),
        why(
            "it is `repeat_safety: reconcile` (a call whose effect must not happen twice); only an `idempotent` tool that changes nothing may be cached"
        )
    );
    // The vault: a cached result would bypass it (a producer's hit
    // vaults nothing; a consumer's key leaves out its secret).
    assert_eq!(
        refused("    SECRET_ACCESS:\n      READ: [k1]\n", "idempotent"),
        why(
            "it declares `SECRET_ACCESS:`, and the cache key (its arguments) leaves out the secret its request carries"
        )
    );
    assert_eq!(
        refused("    scrub_secrets: false\n", "idempotent"),
        why(
            "it says `scrub_secrets: false`, and the cache keeps only scrubbed results (it keeps them outside the run, for every run of the tenant)"
        )
    );
    assert_eq!(
        errors(
            "TOOLS:\n  f() -> string\n    type: mcp\n    server: s\n    permission: p\n    hints:\n      cacheable: true\n"
        ),
        vec![
            "7:18: `cacheable: true` does not fit tool `f`: it leaves its repeat safety to the MCP server's hints; declare `repeat_safety: idempotent`; a cached result is served instead of calling the tool"
        ]
    );
    let e = errors(
        "TOOLS:\n  f(x: string) -> object\n    type: workflow\n    workflow_id: child\n    permission: p\n    repeat_safety: idempotent\n    hints:\n      cacheable: true\n",
    );
    assert!(
        e.contains(&"8:18: `cacheable: true` does not fit tool `f`: it is `type: workflow`, and each call starts a child run; a cached result is served instead of calling the tool".to_owned()),
        "{e:?}"
    );
    // A parameter unique to each call would make every key different.
    assert_eq!(
        errors(&get_with(
            "f(at: string, day: date) -> string",
            "    hints:\n      cacheable: true\n    parameters:\n      at:\n        source: runtime\n        value: time\n      day:\n        source: runtime\n        value: date\n",
        )),
        why(
            "its parameter `at` is `source: runtime` `value: time`, different in every call, so no two calls have the same arguments (the cache key) and none would ever be served"
        )
    );
    // An idempotent MCP tool that says so may be cached.
    let t = one_tool(
        "TOOLS:\n  f() -> string\n    type: mcp\n    server: s\n    permission: p\n    repeat_safety: idempotent\n    hints:\n      cacheable: true\n",
    );
    assert_eq!(t.cache_ttl_ms(5), Some(5));
}

#[test]
fn rate_limits_and_circuit_breakers() {
    let out = parse(
        r#"TOOLS:
  base_url: "https://api.example.com"
  rate_limit: 5

  search(q: string) -> object
    type: http
    endpoint: "/search"
    permission: p.read
    repeat_safety: idempotent

  slow(q: string) -> object
    type: http
    endpoint: "/slow"
    rate_limit: 0.5
    circuit_breaker:
      threshold: 5
      resetMs: 30000
    permission: p.read
    repeat_safety: idempotent

  inline(q: string) -> object
    type: async_webhook
    endpoint: "/kyc"
    method: POST
    circuit_breaker: {threshold: 2, reset_ms: 1000}
    permission: p.read
    repeat_safety: idempotent

  web(q: string) -> object
    type: mcp
    server: search
    rate_limit: 2
    permission: p.read

  tools(q: string) -> object
    type: mcp
    server: search
    permission: p.read

  report() -> object
    type: workflow
    workflow_id: report
    permission: p.read
    repeat_safety: never
"#,
    );
    assert_eq!(out.errors, vec![]);
    let gates: Vec<(Option<f64>, Option<CircuitBreakerDef>)> = out
        .tools
        .iter()
        .map(|t| (t.rate_limit, t.circuit_breaker))
        .collect();
    let breaker = |threshold, reset_ms| {
        Some(CircuitBreakerDef {
            threshold,
            reset_ms,
        })
    };
    assert_eq!(
        gates,
        vec![
            // The file's default, for HTTP tools without their own.
            (Some(5.0), None),
            (Some(0.5), breaker(5, 30_000)),
            (Some(5.0), breaker(2, 1000)),
            // The file's defaults apply to HTTP requests only.
            (Some(2.0), None),
            (None, None),
            (None, None),
        ]
    );
    // Stored as written, and left out when not declared, so the content
    // hash of a tool without gates did not change when they were added.
    let stored = serde_json::to_value(&out.tools[1]).unwrap();
    assert_eq!(stored["rate_limit"], json!(0.5));
    assert_eq!(
        stored["circuit_breaker"],
        json!({"threshold": 5, "reset_ms": 30000})
    );
    let plain = serde_json::to_value(&out.tools[4]).unwrap();
    assert!(plain.get("rate_limit").is_none() && plain.get("circuit_breaker").is_none());
    let back: ToolDef = serde_json::from_value(stored).unwrap();
    assert_eq!(back, out.tools[1]);
}

/// The example of the README's "Rate limits and circuit breakers",
/// read from the README itself.
#[test]
fn readme_rate_limit_example_parses() {
    let readme = include_str!("../../../../../README.md");
    let example = readme
        .split("## Rate limits and circuit breakers")
        .nth(1)
        .and_then(|section| section.split("```yaml\n").nth(1))
        .and_then(|block| block.split("```").next())
        .expect("the README's example");
    let tool = one_tool(example);
    assert_eq!(tool.rate_limit, Some(2.0));
    assert_eq!(
        tool.circuit_breaker,
        Some(CircuitBreakerDef {
            threshold: 5,
            reset_ms: 30_000
        })
    );
}

#[test]
fn rate_limit_and_circuit_breaker_errors() {
    let with = |extra: &str| errors(&tool_with("f() -> string", extra));
    for bad in [
        "0",
        "-1",
        "1001",
        "1e3",
        "two",
        ".5",
        "5.",
        "NaN",
        "inf",
        "0.000000000000000000001",
        "0.00001",
    ] {
        assert_eq!(
            with(&format!("    rate_limit: {bad}\n")),
            vec![format!(
                "7:17: `rate_limit` must be a number of calls per second, at least one call a day (0.0000116) and at most 1000 (like `10` or `0.5`), not `{bad}`"
            )],
            "{bad}"
        );
    }
    assert_eq!(
        with(
            "    circuit_breaker:\n      threshold: 0\n      resetMs: 1s\n      half_open: 1\n      threshold: 3\n"
        ),
        vec![
            "8:18: `threshold` must be a whole number of consecutive failures, at least 1, not `0`",
            "9:16: `resetMs` must be a whole number of ms from 1 to 2592000000 (30 days), not `1s`",
            "10:7: unknown property `half_open` in `circuit_breaker:` (expected `threshold`, `resetMs`)",
            "11:7: duplicate `threshold` in `circuit_breaker:` (first on line 8)",
        ]
    );
    assert_eq!(
        with("    circuit_breaker:\n"),
        vec![
            "7:5: `circuit_breaker:` needs `threshold:` (consecutive failures that open the circuit)",
            "7:5: `circuit_breaker:` needs `resetMs:` (ms an open circuit waits before a probe call)",
        ]
    );
    assert_eq!(
        with("    circuit_breaker: {threshold: 3,  resetMs: x}\n"),
        vec![
            "7:47: `resetMs` must be a whole number of ms from 1 to 2592000000 (30 days), not `x`"
        ]
    );
    assert_eq!(
        with("    circuit_breaker: {threshold 3, resetMs: 5}\n"),
        vec![
            "7:23: expected `threshold: N` or `resetMs: MS`",
            "7:5: `circuit_breaker:` needs `threshold:` (consecutive failures that open the circuit)",
        ]
    );
    assert_eq!(
        with("    circuit_breaker: 5\n"),
        vec![
            "7:22: `circuit_breaker` takes `{threshold: N, resetMs: MS}`, or `threshold:` and `resetMs:` on indented lines"
        ]
    );
    assert_eq!(
        errors(
            "TOOLS:\n  f() -> object\n    type: workflow\n    workflow_id: w\n    rate_limit: 1\n    permission: p\n    repeat_safety: never\n"
        ),
        vec![
            "2:3: tool `f` is `type: workflow`: `rate_limit:` applies to tools a worker calls (`type: http`, `async_webhook` or `mcp`)"
        ]
    );
    assert_eq!(
        errors(
            "TOOLS:\n  rate_limit: 0\n  f() -> string\n    type: http\n    endpoint: /x\n    permission: p\n    repeat_safety: never\n  rate_limit: 2\n"
        ),
        vec![
            "2:15: `rate_limit` must be a number of calls per second, at least one call a day (0.0000116) and at most 1000 (like `10` or `0.5`), not `0`",
            "8:3: file-level default `rate_limit:` must come before the first tool",
        ]
    );
}
