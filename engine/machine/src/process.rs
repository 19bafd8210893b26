//! A tool's `process:` transforms (`definitions/abl/process.rs`), evaluated
//! by the machine.
//!
//! - `before` runs when a model's call is proposed, after its arguments
//!   are checked and the injected parameters filled in: every `require`
//!   must give `true`, then each `params` value is set in the arguments.
//!   What it computed is in the `tool_call_scheduled` event's arguments.
//! - `after` runs when the call's result is recorded: the `result` fields
//!   make the new result, recorded in a `tool_call_processed` event just
//!   before `tool_call_completed` (which keeps the raw result). The model,
//!   `on_result` and a tool node's output get the new one.
//!
//! Pure: the expressions read only the call's arguments and result, and
//! replay reads the recorded values, evaluating nothing.

use serde_json::{Map, Value, json};

use belay_definitions::model::{OnFail, ProcessAfter, ProcessBefore, ToolDef};

/// Largest JSON (bytes) the computed arguments of `before`, or the
/// result of `after`, may be: jq can build large values from small ones,
/// and both are recorded in events. Larger is a failure of the stage.
pub(super) const MAX_COMPUTED_BYTES: usize = 256 * 1024;

/// `Err` when `v`'s JSON is larger than [`MAX_COMPUTED_BYTES`].
fn bounded(v: &Value, what: &str) -> Result<(), String> {
    let size = serde_json::to_string(v).map_or(usize::MAX, |s| s.len());
    if size > MAX_COMPUTED_BYTES {
        return Err(format!(
            "the {what} are {size} bytes, more than the limit of {MAX_COMPUTED_BYTES}"
        ));
    }
    Ok(())
}

/// What `before` decided for a proposed call.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Before {
    /// Schedule the call with these arguments. `skipped`: the stage failed
    /// and `on_fail` (`warn` or `use_original`) let the call go ahead with
    /// the model's arguments: (outcome, message, why).
    Go {
        arguments: Map<String, Value>,
        skipped: Option<(&'static str, Option<String>, String)>,
    },
    /// Refuse the call (`check` for the `tool_call_refused` event); the
    /// model reads `reason`. `fail_run`: the run fails with this error
    /// (`block`).
    Refuse {
        check: &'static str,
        reason: String,
        fail_run: Option<String>,
    },
}

/// Why the stage failed, or the computed arguments.
fn compute_before(
    def: &ProcessBefore,
    input_schema: &Value,
    args: &Map<String, Value>,
) -> Result<Map<String, Value>, String> {
    let input = json!({ "args": Value::Object(args.clone()) });
    for expr in &def.require {
        match expr.eval(&input) {
            Ok(Value::Bool(true)) => {}
            Ok(other) => {
                return Err(format!(
                    "precondition `{}` gave {}, not true",
                    expr.source(),
                    short(&other)
                ));
            }
            Err(e) => return Err(format!("precondition `{}`: {e}", expr.source())),
        }
    }
    let mut out = args.clone();
    for (name, expr) in &def.params {
        match expr.eval(&input) {
            Ok(v) => {
                // The computed value must be of the parameter's declared
                // type, as a value from the model must be (check 2).
                if let Some(schema) = input_schema.pointer(&format!("/properties/{name}"))
                    && let Err(errors) = belay_definitions::validate_json(schema, &v)
                {
                    return Err(format!(
                        "parameter `{name}` (`{}`) gave {}, not of its declared type: {}",
                        expr.source(),
                        short(&v),
                        errors.join("; ")
                    ));
                }
                out.insert(name.clone(), v);
            }
            Err(e) => return Err(format!("parameter `{name}` (`{}`): {e}", expr.source())),
        }
    }
    let out = Value::Object(out);
    bounded(&out, "computed arguments")?;
    match out {
        Value::Object(m) => Ok(m),
        _ => Err("the computed arguments are not an object".to_owned()),
    }
}

/// `before` of `tool` over the call's arguments (defaults and injected
/// parameters filled in). A computed parameter not of its declared type
/// (`tool.input_schema`) fails the stage like a failing expression.
pub(super) fn before(tool: &ToolDef, def: &ProcessBefore, args: &Map<String, Value>) -> Before {
    let why = match compute_before(def, &tool.input_schema, args) {
        Ok(arguments) => {
            return Before::Go {
                arguments,
                skipped: None,
            };
        }
        Err(why) => why,
    };
    match &def.on_fail {
        OnFail::Block(msg) => Before::Refuse {
            check: "process",
            reason: msg.clone(),
            fail_run: Some(format!(
                "tool `{}`: `process.before` failed ({why}), and its `on_fail` is `block`: {msg}",
                tool.name
            )),
        },
        OnFail::Reask(msg) => Before::Refuse {
            check: "process",
            reason: msg.clone(),
            fail_run: None,
        },
        OnFail::Fallback(msg) => Before::Refuse {
            check: "process_fallback",
            reason: msg.clone(),
            fail_run: None,
        },
        OnFail::Warn(msg) => Before::Go {
            arguments: args.clone(),
            skipped: Some(("warn", Some(msg.clone()), why)),
        },
        OnFail::UseOriginal => Before::Go {
            arguments: args.clone(),
            skipped: Some(("use_original", None, why)),
        },
    }
}

/// What `after` decided for a result, as recorded in the
/// `tool_call_processed` event.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct After {
    /// `ok`, `block`, `reask`, `warn`, `use_original` or `fallback`.
    pub outcome: &'static str,
    /// The `on_fail` message, if any.
    pub message: Option<String>,
    /// Why the stage failed (`None` for `ok`).
    pub error: Option<String>,
    /// The result the model, `on_result` and a tool node's output get
    /// instead of the raw one; `None`: the raw one (`warn`,
    /// `use_original`) or none at all (`block`: the model reads
    /// `error: <message>`).
    pub result: Option<Value>,
}

/// `after` over a call's raw `result` and its `args`.
pub(super) fn after(def: &ProcessAfter, args: &Value, result: &Value) -> After {
    let input = json!({ "result": result, "args": args });
    let mut out = Map::new();
    let mut failed = None;
    for (field, expr) in &def.result {
        match expr.eval(&input) {
            Ok(v) => {
                out.insert(field.clone(), v);
            }
            Err(e) => {
                failed = Some(format!("field `{field}` (`{}`): {e}", expr.source()));
                break;
            }
        }
    }
    let out = Value::Object(out);
    if failed.is_none() {
        failed = bounded(&out, "remapped result's fields").err();
    }
    let Some(why) = failed else {
        return After {
            outcome: "ok",
            message: None,
            error: None,
            result: Some(out),
        };
    };
    let (outcome, message, result) = match &def.on_fail {
        OnFail::Block(m) => ("block", Some(m.clone()), None),
        OnFail::Reask(m) => ("reask", Some(m.clone()), Some(Value::String(m.clone()))),
        OnFail::Fallback(m) => ("fallback", Some(m.clone()), Some(Value::String(m.clone()))),
        OnFail::Warn(m) => ("warn", Some(m.clone()), None),
        OnFail::UseOriginal => ("use_original", None, None),
    };
    After {
        outcome,
        message,
        error: Some(why),
        result,
    }
}

/// A value for an error message, at most 80 characters of its JSON.
fn short(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(80) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use belay_definitions::expr::Expr;

    fn expr(s: &str) -> Expr {
        Expr::parse(s).expect("valid jq")
    }

    /// The tool `fx(amount: number, from: string, amount_cents?: number)`.
    fn fx() -> ToolDef {
        let files = [belay_definitions::SourceFile {
            path: "t.tools.abl".into(),
            content:
                "TOOLS:\n  fx(amount: number, from: string, amount_cents?: number) -> object\n    \
                      description: \"fx\"\n    type: http\n    endpoint: \"http://fx.test/q\"\n    \
                      method: POST\n    permission: fx\n    repeat_safety: idempotent\n"
                    .into(),
        }];
        let bundle =
            belay_definitions::parse_bundle(&files, &belay_definitions::RegisteredNames::default())
                .unwrap_or_else(|e| panic!("{e:?}"));
        bundle.tools.into_iter().next().expect("one tool")
    }

    fn before_def(on_fail: OnFail) -> ProcessBefore {
        ProcessBefore {
            params: BTreeMap::from([("amount_cents".to_owned(), expr(".args.amount * 100"))]),
            require: vec![expr(".args.amount > 0")],
            on_fail,
        }
    }

    fn args(amount: i64) -> Map<String, Value> {
        let Value::Object(m) = json!({ "amount": amount, "from": "EUR" }) else {
            unreachable!()
        };
        m
    }

    #[test]
    fn before_computes_params_when_every_precondition_holds() {
        let got = before(
            &fx(),
            &before_def(OnFail::Reask("positive".into())),
            &args(2),
        );
        let Before::Go { arguments, skipped } = got else {
            panic!("{got:?}")
        };
        assert_eq!(
            Value::Object(arguments),
            json!({ "amount": 2, "from": "EUR", "amount_cents": 200 })
        );
        assert_eq!(skipped, None);
    }

    #[test]
    fn before_on_fail_outcomes() {
        let reask = before(
            &fx(),
            &before_def(OnFail::Reask("positive".into())),
            &args(-1),
        );
        assert_eq!(
            reask,
            Before::Refuse {
                check: "process",
                reason: "positive".into(),
                fail_run: None
            }
        );
        let Before::Refuse { fail_run, .. } =
            before(&fx(), &before_def(OnFail::Block("no".into())), &args(-1))
        else {
            panic!()
        };
        let fail_run = fail_run.expect("block fails the run");
        assert!(
            fail_run.contains("precondition `.args.amount > 0` gave false"),
            "{fail_run}"
        );
        let Before::Refuse { check, .. } = before(
            &fx(),
            &before_def(OnFail::Fallback("none".into())),
            &args(-1),
        ) else {
            panic!()
        };
        assert_eq!(check, "process_fallback");
        for (on_fail, outcome) in [
            (OnFail::Warn("w".into()), "warn"),
            (OnFail::UseOriginal, "use_original"),
        ] {
            let Before::Go { arguments, skipped } = before(&fx(), &before_def(on_fail), &args(-1))
            else {
                panic!()
            };
            assert_eq!(arguments, args(-1), "the model's arguments, unchanged");
            assert_eq!(skipped.map(|s| s.0), Some(outcome));
        }
    }

    #[test]
    fn computed_values_are_bounded() {
        let def = ProcessBefore {
            params: BTreeMap::from([(
                "big".to_owned(),
                expr("[range(0; 300)] | map(\"x\" * 1000) | add"),
            )]),
            require: Vec::new(),
            on_fail: OnFail::Warn("too big".into()),
        };
        let Before::Go { skipped, .. } = before(&fx(), &def, &args(1)) else {
            panic!()
        };
        let (_, _, why) = skipped.expect("the stage failed");
        assert!(why.contains("more than the limit of 262144"), "{why}");
    }

    #[test]
    fn after_remaps_or_applies_on_fail() {
        let def = |on_fail| ProcessAfter {
            result: BTreeMap::from([("converted".to_owned(), expr(".result.amount_cents / 100"))]),
            on_fail,
        };
        let ok = after(
            &def(OnFail::UseOriginal),
            &json!({}),
            &json!({ "amount_cents": 250 }),
        );
        assert_eq!(ok.outcome, "ok");
        assert_eq!(ok.result, Some(json!({ "converted": 2.5 })));
        let bad = json!({ "amount_cents": "x" });
        let r = after(&def(OnFail::Reask("again".into())), &json!({}), &bad);
        assert_eq!((r.outcome, r.result), ("reask", Some(json!("again"))));
        let w = after(&def(OnFail::Warn("w".into())), &json!({}), &bad);
        assert_eq!((w.outcome, w.result.clone()), ("warn", None));
        assert!(w.error.is_some_and(|e| e.contains("field `converted`")));
        let b = after(&def(OnFail::Block("blocked".into())), &json!({}), &bad);
        assert_eq!((b.outcome, b.message), ("block", Some("blocked".into())));
    }

    #[test]
    fn a_computed_parameter_not_of_its_declared_type_fails_the_stage() {
        // `amount_cents` is declared `number`; `tostring` makes a string.
        let mut def = before_def(OnFail::Reask("bad amount".into()));
        def.params = BTreeMap::from([(
            "amount_cents".to_owned(),
            expr(".args.amount * 100 | tostring"),
        )]);
        let got = before(&fx(), &def, &args(2));
        let Before::Refuse { check, reason, .. } = &got else {
            panic!("{got:?}")
        };
        assert_eq!((*check, reason.as_str()), ("process", "bad amount"));
        // `warn` goes ahead with the model's arguments and says why.
        def.on_fail = OnFail::Warn("w".into());
        let Before::Go { arguments, skipped } = before(&fx(), &def, &args(2)) else {
            panic!()
        };
        assert_eq!(
            Value::Object(arguments),
            json!({ "amount": 2, "from": "EUR" })
        );
        let (outcome, _, why) = skipped.expect("skipped");
        assert_eq!(outcome, "warn");
        assert!(
            why.contains("parameter `amount_cents`")
                && why.contains("\"200\"")
                && why.contains("not of its declared type"),
            "{why}"
        );
        // A computed value of the declared type goes.
        def.params = BTreeMap::from([("amount_cents".to_owned(), expr(".args.amount * 0.5"))]);
        def.on_fail = OnFail::Reask("r".into());
        assert!(matches!(before(&fx(), &def, &args(3)), Before::Go { .. }));
    }
}
