//! Tests of jq expressions and templates: evaluation against a run's
//! state, the constructs refused when parsed (unbounded, or excluded as
//! nondeterministic), the caps on values, templates and their errors, the
//! cost of compiling and evaluating, and rendering through a remote.

use super::*;
use serde_json::json;

fn state() -> Value {
    json!({
        "input": {"email": "ada@example.com", "name": "Ada", "n": 3, "ratio": 1.0},
        "nodes": {
            "intake": {"input": null, "output": {"account_id": "acc_42", "items": [
                {"id": 1, "name": "a", "n": 1},
                {"id": 2, "name": "b", "n": 2},
                {"id": 3, "name": "c", "n": 5}
            ]}}
        },
        "vars": {},
        "run": {"id": "r1", "tenant": "t1"}
    })
}

fn eval(src: &str) -> Result<Value, ExprError> {
    Expr::parse(src)?.eval(&state())
}

fn message(result: Result<Value, ExprError>) -> String {
    result.unwrap_err().to_string()
}

#[test]
fn paths() {
    assert_eq!(eval(".input.email").unwrap(), json!("ada@example.com"));
    assert_eq!(
        eval(".nodes.intake.output.account_id").unwrap(),
        json!("acc_42")
    );
    assert_eq!(
        eval(".nodes.intake.output.items[1].name").unwrap(),
        json!("b")
    );
    assert_eq!(eval(".nodes.intake.output.items[-1].id").unwrap(), json!(3));
    assert_eq!(eval(".run").unwrap(), json!({"id": "r1", "tenant": "t1"}));
    assert_eq!(eval(".").unwrap(), state());
}

#[test]
fn missing_fields_are_null() {
    assert_eq!(eval(".input.phone").unwrap(), Value::Null);
    assert_eq!(eval(".nodes.nope.output.account_id").unwrap(), Value::Null);
    assert_eq!(eval(".input.phone // \"none\"").unwrap(), json!("none"));
    // Indexing a string is an error, as in jq.
    assert_eq!(
        message(eval(".input.email.x")),
        "cannot index \"ada@example.com\" with \"x\""
    );
}

#[test]
fn arithmetic_and_numbers() {
    assert_eq!(eval(".input.n + 1").unwrap(), json!(4));
    assert_eq!(eval(".input.n * 2 - 1").unwrap(), json!(5));
    assert_eq!(eval("10 / 4").unwrap(), json!(2.5));
    assert_eq!(eval(".input.n % 2").unwrap(), json!(1));
    // jaq keeps integers and floats apart: division gives a float, and
    // a float input stays a float.
    assert_eq!(eval("4 / 2").unwrap(), json!(2.0));
    assert_eq!(eval(".input.ratio").unwrap(), json!(1.0));
    assert_eq!(eval("1.0").unwrap(), json!(1.0));
    assert_eq!(eval("1.5 * 2").unwrap(), json!(3.0));
    assert_eq!(eval("[1, 2.5] | add").unwrap(), json!(3.5));
    assert_eq!(eval("3.7 | floor").unwrap(), json!(3));
    // Integers do not overflow: past i64 they are exact up to u64, then
    // the nearest f64.
    assert_eq!(
        eval("9223372036854775807 + 1").unwrap(),
        json!(9_223_372_036_854_775_808_u64)
    );
    let big = json!({"n": u64::MAX});
    assert_eq!(Expr::parse(".n").unwrap().eval(&big).unwrap(), big["n"]);
    assert_eq!(
        Expr::parse(".n * 10").unwrap().eval(&big).unwrap(),
        json!(1.844_674_407_370_955e20)
    );
    assert_eq!(
        eval("-9223372036854775808 - 1").unwrap(),
        json!(-9.223372036854776e18)
    );
}

#[test]
fn select_and_map() {
    assert_eq!(
        eval("[.nodes.intake.output.items[] | select(.n > 1) | .id]").unwrap(),
        json!([2, 3])
    );
    assert_eq!(
        eval(".nodes.intake.output.items[] | select(.id == 2) | .name").unwrap(),
        json!("b")
    );
    assert_eq!(
        eval(".nodes.intake.output.items | map(.n * 10)").unwrap(),
        json!([10, 20, 50])
    );
    assert_eq!(
        eval(".nodes.intake.output.items | map(select(.name != \"b\")) | length").unwrap(),
        json!(2)
    );
    assert_eq!(
        eval("{email: .input.email, count: (.nodes.intake.output.items | length)}").unwrap(),
        json!({"email": "ada@example.com", "count": 3})
    );
}

#[test]
fn jq_string_interpolation_and_functions() {
    assert_eq!(
        eval(r#""Hello \(.input.name), you have \(.input.n) items""#).unwrap(),
        json!("Hello Ada, you have 3 items")
    );
    assert_eq!(eval(r#""\(.nodes.intake.input)""#).unwrap(), json!("null"));
    assert_eq!(
        eval(r#".input.email | test("@example\\.com$")"#).unwrap(),
        json!(true)
    );
    assert_eq!(
        eval(r#".input.email | split("@") | .[1]"#).unwrap(),
        json!("example.com")
    );
    assert_eq!(eval(".input.name | ascii_upcase").unwrap(), json!("ADA"));
    assert_eq!(
        eval(".input | keys").unwrap(),
        json!(["email", "n", "name", "ratio"])
    );
    assert_eq!(eval(".input.n | tostring").unwrap(), json!("3"));
    assert_eq!(eval("\"42\" | tonumber").unwrap(), json!(42));
    assert_eq!(eval("{a: 1} | tojson").unwrap(), json!("{\"a\":1}"));
    assert_eq!(eval(".input.name | @base64").unwrap(), json!("QWRh"));
    // Time functions that depend on nothing but their input stay.
    assert_eq!(eval("0 | todate").unwrap(), json!("1970-01-01T00:00:00Z"));
    assert_eq!(
        eval(r#""2024-01-02T03:04:05Z" | fromdate"#).unwrap(),
        json!(1_704_164_645)
    );
    assert_eq!(
        eval(r#"86400 | strftime("%Y-%m-%d")"#).unwrap(),
        json!("1970-01-02")
    );
    // A definition of one's own shadows nothing excluded by accident.
    assert_eq!(eval("def now: 7; now").unwrap(), json!(7));
}

#[test]
fn multiple_outputs_are_an_error() {
    let e = eval(".nodes.intake.output.items[]").unwrap_err();
    assert_eq!(
        e,
        ExprError::ManyValues {
            count: 3,
            at_least: false
        }
    );
    assert_eq!(
        e.to_string(),
        "the expression produced 3 values; wrap it in [ ] to collect them"
    );
    assert_eq!(
        eval("[.nodes.intake.output.items[]] | length").unwrap(),
        json!(3)
    );
    // Many outputs are counted up to a limit.
    assert_eq!(
        message(eval("range(.input.n * 1000)")),
        "the expression produced at least 1000 values; wrap it in [ ] to collect them"
    );
    // A runtime error as the second output is that error.
    assert_eq!(message(eval("1, error(\"second\")")), "second");
}

/// Each construct that can make an evaluation endless, refused when
/// parsed, with where it is.
#[test]
fn unbounded_constructs_are_refused_when_parsed() {
    let cases: &[(&str, usize, &str)] = &[
        ("def f: f; f", 7, "`f` calls itself"),
        ("def f: 1 + f; f", 11, "`f` calls itself"),
        (".a | def f(x): f(x + 1); f(0)", 15, "`f` calls itself"),
        ("def f: def g: f; g; f", 14, "`f` calls itself"),
        // In jq a definition's own name in its body is itself.
        ("def f: 1; def f: f + 1; f", 17, "`f` calls itself"),
        ("def f(g): g; def h: f(h); h", 22, "`h` calls itself"),
        ("def @f: @f; @f", 8, "`@f` calls itself"),
        ("repeat(1)", 0, "`repeat/1` is not available"),
        ("[limit(3; repeat(1))]", 10, "`repeat/1` is not available"),
        ("1 | while(. < 10; . + 1)", 4, "`while/2` is not available"),
        ("until(. > 3; . + 1)", 0, "`until/2` is not available"),
        ("[recurse(.a)]", 1, "`recurse/1` is not available"),
        (
            "[recurse(.a; . != null)]",
            1,
            "`recurse/2` is not available",
        ),
        (
            "[.[] | combinations]",
            7,
            "`combinations/0` is not available",
        ),
        ("[combinations(2)]", 1, "`combinations/1` is not available"),
        (
            "[range(1e12)]",
            1,
            "`range` with these bounds produces 1000000000000 values",
        ),
        ("last(range(1e15))", 5, "`range` with these bounds produces"),
        ("[range(5; 100006)]", 1, "produces 100001 values"),
        (
            "first(range(0; 10; 0))",
            6,
            "`range` with these bounds never ends",
        ),
        ("\"x\" * 10000000000", 6, "`*` repeats a string here"),
        ("\"x\" * 1e10", 6, "`*` repeats a string here"),
        ("\"x\" * .input.n", 7, "`*` repeats a string here"),
        (".input.n * \"x\"", 1, "`*` repeats a string here"),
        ("\"a\\(.x)\" * 1001", 11, "at most 1000"),
        (
            ".input.name | tostring * .input.n",
            26,
            "`*` repeats a string",
        ),
        (".a *= \"-\"", 1, "`*` repeats a string here"),
    ];
    for (src, offset, fragment) in cases {
        match Expr::parse(src) {
            Err(ExprError::Unbounded { message, position }) => {
                assert!(message.contains(fragment), "{src}: {message}");
                assert_eq!(position.offset, *offset, "{src}: {message}");
            }
            other => panic!("{src}: {other:?}"),
        }
    }
    assert_eq!(
        Expr::parse("def f: f; f").unwrap_err().to_string(),
        "column 8: `f` calls itself (directly or through a filter it passes on), and recursion is not available: it need never end; a workflow expression runs inside the engine's transition and must finish"
    );
    // In a template, the position counts from the start of the string.
    let e = Template::parse(&json!({"a": "n: ${ repeat(1) }"})).unwrap_err();
    assert_eq!(e[0].pointer, "/a");
    assert!(matches!(
        e[0].error,
        ExprError::Unbounded {
            position: Position { offset: 6, .. },
            ..
        }
    ));
    // A stored expression is checked on first use.
    let stored: Expr = serde_json::from_value(json!("[repeat(1)]")).unwrap();
    assert!(matches!(
        stored.eval(&state()),
        Err(ExprError::Unbounded { .. })
    ));
}

/// What the guard lets through: definitions that do not call
/// themselves, bounded library filters, literal repetition.
#[test]
fn bounded_constructs_are_kept() {
    let cases: &[(&str, Value)] = &[
        ("def f: 1; def g: f + 1; g", json!(2)),
        ("1 | def f(g): g | g; f(. + 1)", json!(3)),
        ("def f($x): $x * 2; f(.input.n)", json!(6)),
        // A definition of one's own with a refused name is its own.
        ("def repeat(f): f; repeat(1)", json!(1)),
        ("\"-\" * 3", json!("---")),
        ("3 * \"ab\"", json!("ababab")),
        (".input.n * 2", json!(6)),
        (".input.n * .input.n", json!(9)),
        ("[range(3)]", json!([0, 1, 2])),
        ("[range(0; 10; 4)]", json!([0, 4, 8])),
        ("[range(3; 0; -1)]", json!([3, 2, 1])),
        // As in jaq, a value comes before the error of the next one.
        ("first(range(0; 3; \"a\"))", json!(0)),
        ("[range(1; 1; 0)] | length", json!(0)),
        ("[range(.input.n)]", json!([0, 1, 2])),
        ("[range(100000)] | length", json!(100_000)),
        ("[.input | recurse] | length", json!(5)),
        ("[.input | ..] | length", json!(5)),
        (
            "[limit(2; .nodes.intake.output.items[])] | length",
            json!(2),
        ),
        ("[1, [2, [3]]] | flatten", json!([1, 2, 3])),
        ("[{a: 1}] | map(.a + 1)", json!([2])),
        ("reduce range(5) as $i (0; . + $i)", json!(10)),
        ("[foreach range(3) as $i (0; . + $i)]", json!([0, 1, 3])),
    ];
    for (src, want) in cases {
        assert_eq!(&eval(src).unwrap(), want, "{src}");
    }
}

#[test]
fn range_values_are_counted_per_evaluation() {
    let limit = ExprError::RangeLimit { limit: 100_000 };
    assert_eq!(
        eval("[range(.input.n * 100000)] | length").unwrap_err(),
        limit
    );
    assert_eq!(
        eval("[range(60000), range(60000)] | length").unwrap_err(),
        limit
    );
    assert_eq!(
        eval("[.nodes.intake.output.items[] | range(40000)] | length").unwrap_err(),
        limit
    );
    // A computed step of 0 never ends, and is counted.
    assert_eq!(eval("last(range(0; 1; .input.n - 3))").unwrap_err(), limit);
    // Catching the error does not hide the limit.
    assert_eq!(
        eval("try ([range(.input.n * 100000)] | length) catch 0").unwrap_err(),
        limit
    );
    assert_eq!(
        message(eval("[range(.input.n * 100000)]")),
        "the expression asked `range` for more than 100000 values in one evaluation"
    );
    // The count starts again for each evaluation.
    let e = Expr::parse("[range(.input.n * 30000)] | length").unwrap();
    for _ in 0..3 {
        assert_eq!(e.eval(&state()).unwrap(), json!(90_000));
    }
    let t = Template::parse(&json!([
        "${ [range(90000)] | length }",
        "${ [range(90000)] | length }"
    ]))
    .unwrap();
    assert_eq!(t.render(&state()).unwrap(), json!([90_000, 90_000]));
}

#[test]
fn values_are_capped_in_json_bytes() {
    let too_large = ExprError::TooLarge {
        limit: MAX_VALUE_BYTES,
    };
    // 100 000 strings of 12 bytes, with commas: about 1.3 MB.
    assert_eq!(
        eval("[range(100000) | \"xxxxxxxxxx\"]").unwrap_err(),
        too_large
    );
    // An array shared 2^40 times over: small in memory, enormous as
    // JSON; stopped early rather than written out.
    assert_eq!(
        eval("reduce range(40) as $i (0; [., .] | [.]) | .[0]").unwrap_err(),
        too_large
    );
    assert_eq!(
        message(eval("[range(100000) | \"xxxxxxxxxx\"]")),
        "the expression's value is larger than 1048576 bytes of JSON"
    );
    // Exactly at the limit is allowed, one byte more is not.
    let at = |n: usize| json!({"s": "x".repeat(n)});
    let s = Expr::parse(".s").unwrap();
    assert!(s.eval(&at(MAX_VALUE_BYTES - 2)).is_ok());
    assert_eq!(s.eval(&at(MAX_VALUE_BYTES - 1)).unwrap_err(), too_large);
    // The count is serde_json's compact form, byte for byte.
    for value in [
        json!(null),
        json!([]),
        json!({}),
        json!([1, -2.5, true, false, null, "a\"b\\c\nd\u{1}é"]),
        json!({"k\t": {"x": [[], {}], "y": 12345678901234_u64}, "": ""}),
    ] {
        let mut left = MAX_VALUE_BYTES;
        let back = val_to_json(json_to_val(&value), 0, &mut left).unwrap();
        assert_eq!(back, value);
        assert_eq!(
            MAX_VALUE_BYTES - left,
            serde_json::to_string(&value).unwrap().len(),
            "{value}"
        );
    }
}

/// Text nested deeply: jaq's parser needs more than 2 MiB of stack for
/// 200 levels (debug build); long text is refused.
#[test]
fn deep_or_long_text_does_not_overflow_the_stack() {
    let deep = format!("{}1{}", "[".repeat(2000), "]".repeat(2000));
    assert!(matches!(eval(&deep), Err(ExprError::NotJson { .. })));
    let minus = format!("{}1", "-".repeat(MAX_EXPR_BYTES - 1));
    assert_eq!(eval(&minus).unwrap(), json!(-1));
    let long = format!("{}1", "-".repeat(MAX_EXPR_BYTES));
    assert_eq!(
        Expr::parse(&long).unwrap_err().to_string(),
        "column 16385: the expression is 16385 bytes long, more than the 16384 an expression may have"
    );
}

/// A value nested one level per step: a 2 MiB stack overflows while
/// jaq drops it (which aborts the process); the evaluation's own
/// stack has room.
#[test]
fn deep_values_do_not_overflow_the_stack() {
    assert_eq!(
        eval("reduce range(100000) as $i (0; [.]) | 1").unwrap(),
        json!(1)
    );
    let t = Template::parse(&json!("${ reduce range(100000) as $i (0; [.]) | 1 }")).unwrap();
    assert_eq!(t.render(&state()).unwrap(), json!(1));
}

#[test]
fn no_output_is_an_error() {
    assert_eq!(eval("empty").unwrap_err(), ExprError::NoValue);
    assert_eq!(message(eval("empty")), "the expression produced no value");
    assert_eq!(
        eval(".input | select(.n > 10)").unwrap_err(),
        ExprError::NoValue
    );
}

#[test]
fn runtime_errors_carry_jqs_message() {
    let state = json!({"a": "x"});
    let expr = Expr::parse(".a + 1").unwrap();
    assert_eq!(
        expr.eval(&state).unwrap_err(),
        ExprError::Runtime {
            message: "cannot calculate \"x\" + 1".into()
        }
    );
    assert_eq!(message(eval("error(\"boom\")")), "boom");
    assert_eq!(
        message(eval("error({code: 7})")),
        "{\"code\":7} (not a string)"
    );
    assert_eq!(message(eval("[] | .[\"a\"]")), "cannot index [] with \"a\"");
    assert_eq!(eval("try error(\"x\") catch .").unwrap(), json!("x"));
    // Unlike jq, jaq gives null for an object indexed with a number.
    assert_eq!(eval("{} | .[0]").unwrap(), Value::Null);
}

#[test]
fn values_without_json_form() {
    for (src, reason) in [
        ("nan", "NaN is not a JSON number"),
        ("infinite", "infinity is not a JSON number"),
        ("-infinite", "-infinity is not a JSON number"),
        ("1 / 0", "infinity is not a JSON number"),
        ("1e1000", "infinity is not a JSON number"),
        (
            "\"a\" | tobytes",
            "a byte string (from `tobytes`) has no JSON form",
        ),
        ("{(1): 2}", "object key 1 is not a string"),
        (
            "reduce range(200) as $i (0; [.])",
            "it is nested deeper than 100 levels",
        ),
    ] {
        assert_eq!(
            eval(src).unwrap_err(),
            ExprError::NotJson {
                reason: reason.into()
            },
            "{src}"
        );
    }
    assert_eq!(
        message(eval("nan")),
        "the expression's value is not JSON: NaN is not a JSON number"
    );
    assert!(eval("reduce range(99) as $i (0; [.])").is_ok());
}

#[test]
fn parse_errors_name_the_problem_and_position() {
    let at = |offset, line, column| Position {
        offset,
        line,
        column,
    };
    let cases = [
        (
            ".a +",
            "expected term, found the end of the expression",
            at(4, 1, 5),
        ),
        (".a | )", "unexpected `)`", at(5, 1, 6)),
        ("(.a", "`(` is not closed: expected `)`", at(3, 1, 4)),
        ("\"abc", "unterminated string: expected `\"`", at(4, 1, 5)),
        (
            "if . then 1",
            "expected else or end, found the end of the expression",
            at(11, 1, 12),
        ),
        ("é + ", "unexpected `é`", at(0, 1, 1)),
        (
            ".a |\n  .b + ",
            "expected term, found the end of the expression",
            at(12, 2, 8),
        ),
        (
            "",
            "expected term, found the end of the expression",
            at(0, 1, 1),
        ),
        ("foo(1)", "`foo/1` is not defined", at(0, 1, 1)),
        (".a + $x", "variable `$x` is not defined", at(5, 1, 6)),
        (
            "include \"lib\"; .",
            "`include` and `import` are not available: expressions cannot load modules",
            at(9, 1, 10),
        ),
        (
            "import \"lib\" as l; .",
            "`include` and `import` are not available: expressions cannot load modules",
            at(8, 1, 9),
        ),
    ];
    for (src, message, position) in cases {
        let got = Expr::parse(src).unwrap_err();
        assert_eq!(
            got,
            ExprError::Syntax {
                message: message.into(),
                position
            },
            "{src:?}"
        );
    }
    assert_eq!(
        Expr::parse(".a | )").unwrap_err().to_string(),
        "column 6: unexpected `)`"
    );
    assert_eq!(
        Expr::parse(".a |\n  .b + ").unwrap_err().to_string(),
        "line 2, column 8: expected term, found the end of the expression"
    );
}

/// One expression per excluded name, with where the name is.
const EXCLUDED_USES: &[(&str, &str, usize)] = &[
    ("now", ".input.n + now", 11),
    ("localtime", "0 | localtime", 4),
    ("strflocaltime", "0 | strflocaltime(\"%H\")", 4),
    ("env", "env.HOME", 0),
    ("$ENV", "$ENV.HOME", 0),
    ("input", "input", 0),
    ("inputs", "[inputs]", 1),
    ("input_filename", "input_filename", 0),
    ("input_line_number", "input_line_number", 0),
    ("get_search_list", "get_search_list", 0),
    ("get_prog_origin", "get_prog_origin", 0),
    ("get_jq_origin", "get_jq_origin", 0),
    ("halt", "halt", 0),
    ("halt", "if . then halt(1) else . end", 10),
    ("halt_error", "halt_error", 0),
    ("halt_error", "\"bye\" | halt_error(1)", 8),
    ("debug", "debug", 0),
    ("debug", "debug(\"msg\") | .input", 0),
    ("debug_empty", "debug_empty", 0),
    ("stderr", ".input | stderr", 9),
    ("stderr_empty", "stderr_empty", 0),
];

#[test]
fn excluded_functions_are_refused_by_name() {
    for (name, src, offset) in EXCLUDED_USES {
        match Expr::parse(src) {
            Err(ExprError::Excluded {
                name: got,
                position,
                ..
            }) => {
                assert_eq!(got, *name, "{src}");
                assert_eq!(position.offset, *offset, "{src}");
            }
            other => panic!("{src}: {other:?}"),
        }
    }
    // Every excluded name is tested above.
    for (name, _) in EXCLUDED {
        assert!(
            EXCLUDED_USES.iter().any(|(n, _, _)| n == name),
            "no test for `{name}`"
        );
    }
    assert_eq!(
        Expr::parse(".input.n + now").unwrap_err().to_string(),
        "column 12: `now` is not available in workflow expressions: it reads the clock, and an expression must give the same value whenever a run is replayed"
    );
}

/// Every function jaq implements in Rust, reviewed: either excluded or
/// deterministic and free of I/O. A jaq upgrade that adds a function
/// fails here until someone decides which it is.
#[test]
fn every_jaq_native_function_is_reviewed() {
    const DETERMINISTIC: &[&str] = &[
        // jaq-core
        "error_empty",
        "path",
        "path_value",
        "range",
        "keys_unsorted",
        "key_values",
        "first",
        "last",
        "limit",
        "skip",
        // jaq-std
        "floor",
        "round",
        "ceil",
        "utf8bytelength",
        "explode",
        "implode",
        "ascii_downcase",
        "ascii_upcase",
        "reverse",
        "sort",
        "sort_by",
        "group_by",
        "min_by_or_empty",
        "max_by_or_empty",
        "startswith",
        "endswith",
        "ltrimstr",
        "rtrimstr",
        "trim",
        "ltrim",
        "rtrim",
        "escape_sh",
        "escape_html",
        "unescape_html",
        "encode_uri",
        "decode_uri",
        "encode_base64",
        "decode_base64",
        "acos",
        "acosh",
        "asin",
        "asinh",
        "atan",
        "atanh",
        "cbrt",
        "cos",
        "cosh",
        "erf",
        "erfc",
        "exp",
        "exp10",
        "exp2",
        "expm1",
        "fabs",
        "frexp",
        "ilogb",
        "j0",
        "j1",
        "lgamma",
        "log",
        "log10",
        "log1p",
        "log2",
        "modf",
        "nearbyint",
        "rint",
        "sin",
        "sinh",
        "sqrt",
        "tan",
        "tanh",
        "tgamma",
        "trunc",
        "y0",
        "y1",
        "atan2",
        "copysign",
        "fdim",
        "fmax",
        "fmin",
        "fmod",
        "hypot",
        "jn",
        "ldexp",
        "nextafter",
        "pow",
        "remainder",
        "scalbln",
        "yn",
        "fma",
        "matches",
        "split_matches",
        "split_",
        "fromdateiso8601",
        "todateiso8601",
        "strftime",
        "gmtime",
        "strptime",
        "mktime",
        // jaq-json
        "fromjson",
        "tojson",
        "tobytes",
        "length",
        "contains",
        "has",
        "indices",
        "bsearch",
    ];
    let all = jaq_core::funs::<D>()
        .chain(jaq_std::funs())
        .chain(jaq_json::funs());
    let mut unreviewed = Vec::new();
    for (name, _, _) in all {
        if !DETERMINISTIC.contains(&name) && excluded(name).is_none() {
            unreviewed.push(name);
        }
    }
    assert_eq!(unreviewed, Vec::<&str>::new());
    // And the excluded natives are really gone.
    assert!(natives().all(|(name, _, _)| excluded(name).is_none()));
    assert!(prelude().iter().all(|def| excluded(def.name).is_none()));
}

#[test]
fn expr_round_trips_through_serde_json() {
    let expr = Expr::parse(".nodes.intake.output.account_id").unwrap();
    let stored = serde_json::to_value(&expr).unwrap();
    assert_eq!(stored, json!(".nodes.intake.output.account_id"));
    let back: Expr = serde_json::from_value(stored).unwrap();
    assert_eq!(back, expr);
    assert_eq!(back.source(), ".nodes.intake.output.account_id");
    assert_eq!(back.eval(&state()).unwrap(), json!("acc_42"));
    // A stored expression is compiled on first use, and a bad one fails
    // there, not when the history is read.
    let bad: Expr = serde_json::from_value(json!("now")).unwrap();
    assert!(matches!(
        bad.eval(&state()),
        Err(ExprError::Excluded { .. })
    ));
    assert_eq!(
        format!("{expr:?}"),
        "Expr(\".nodes.intake.output.account_id\")"
    );
}

#[test]
fn values_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Expr>();
    send_sync::<Template>();
    send_sync::<ExprError>();
    send_sync::<TemplateError>();
}

#[test]
fn compiled_filters_are_shared() {
    let a = Expr::parse(".input.name | ascii_downcase").unwrap();
    let b = Expr::parse(".input.name | ascii_downcase").unwrap();
    let fa = a.compiled.get().unwrap().as_ref().unwrap();
    let fb = b.compiled.get().unwrap().as_ref().unwrap();
    assert!(Arc::ptr_eq(fa, fb));
    assert_eq!(a.eval(&state()).unwrap(), json!("ada"));
}

fn render(template: Value) -> Result<Value, TemplateError> {
    Template::parse(&template).unwrap().render(&state())
}

#[test]
fn template_whole_string_keeps_the_type() {
    assert_eq!(render(json!("${ .input.n }")).unwrap(), json!(3));
    assert_eq!(render(json!("  ${.input}\n")).unwrap(), state()["input"]);
    assert_eq!(render(json!("${ .input.phone }")).unwrap(), Value::Null);
    assert_eq!(
        render(json!("${ [.nodes.intake.output.items[].id] }")).unwrap(),
        json!([1, 2, 3])
    );
}

#[test]
fn template_interpolation() {
    assert_eq!(
        render(json!("Hello ${ .input.name }, ${ .input.n } items")).unwrap(),
        json!("Hello Ada, 3 items")
    );
    assert_eq!(
        render(json!("run=${.run} missing=${ .x } ok=${ true }")).unwrap(),
        json!(r#"run={"id":"r1","tenant":"t1"} missing=null ok=true"#)
    );
    assert_eq!(
        render(json!("${ .input.name }${ .input.n }")).unwrap(),
        json!("Ada3")
    );
    assert_eq!(render(json!("${ .input.name } ")).unwrap(), json!("Ada"));
    assert_eq!(
        render(json!("x ${ .input.ratio }")).unwrap(),
        json!("x 1.0")
    );
}

#[test]
fn template_nested_values_and_keys() {
    let template = json!({
        "to": "${ .input.email }",
        "${ .input.name }": "keys are not templated",
        "lines": ["Dear ${ .input.name },", {"account": "${ .nodes.intake.output.account_id }"}, 7, null],
        "fixed": {"a": [1, "b"]}
    });
    assert_eq!(
        render(template).unwrap(),
        json!({
            "to": "ada@example.com",
            "${ .input.name }": "keys are not templated",
            "lines": ["Dear Ada,", {"account": "acc_42"}, 7, null],
            "fixed": {"a": [1, "b"]}
        })
    );
}

#[test]
fn template_braces_inside_expressions() {
    assert_eq!(
        render(json!("${ {email: .input.email} }")).unwrap(),
        json!({"email": "ada@example.com"})
    );
    assert_eq!(render(json!("<${ \"}\" }>")).unwrap(), json!("<}>"));
    assert_eq!(
        render(json!(r#"${ "a\"}\(.input.n | {n: .} | .n)" }"#)).unwrap(),
        json!("a\"}3")
    );
    assert_eq!(
        render(json!("${ .input.n # the count }\n }")).unwrap(),
        json!(3)
    );
    assert_eq!(
        split("a ${ {b: [1, (2)]} } c").unwrap(),
        vec![
            Segment::Text("a ".into()),
            Segment::Expr {
                source: " {b: [1, (2)]} ",
                offset: 4
            },
            Segment::Text(" c".into()),
        ]
    );
}

#[test]
fn template_escape() {
    let t = Template::parse(&json!("literal $${ .input.name } and $5 and $")).unwrap();
    assert!(t.is_constant());
    assert_eq!(
        t.render(&state()).unwrap(),
        json!("literal ${ .input.name } and $5 and $")
    );
    assert_eq!(
        render(json!("$${x} ${ .input.n }")).unwrap(),
        json!("${x} 3")
    );
    assert_eq!(
        render(json!("${ \"$\" }${ .input.n }")).unwrap(),
        json!("$3")
    );
    assert_eq!(
        render(json!("$$${ .input.n }")).unwrap(),
        json!("$${ .input.n }")
    );
}

#[test]
fn constant_templates_round_trip() {
    for value in [
        json!({}),
        json!({"a": ["${ .x }", "$${", "$$${ y }", "${${", "$", 1], "${ k }": "$ {"}),
    ] {
        let t = Template::constant(value.clone());
        assert!(t.is_constant());
        assert_eq!(t.render(&state()).unwrap(), value);
        let back: Template = serde_json::from_value(serde_json::to_value(&t).unwrap()).unwrap();
        assert!(back.is_constant());
        assert_eq!(back.render(&state()).unwrap(), value);
        assert_eq!(back, t);
    }
}

#[test]
fn template_is_constant() {
    assert!(
        Template::parse(&json!({"a": [1, "two", {"b": null}]}))
            .unwrap()
            .is_constant()
    );
    assert!(
        Template::parse(&json!("no expressions"))
            .unwrap()
            .is_constant()
    );
    assert!(
        !Template::parse(&json!({"a": [1, "${ . }"]}))
            .unwrap()
            .is_constant()
    );
    assert!(!Template::parse(&json!("x ${ 1 }")).unwrap().is_constant());
}

#[test]
fn template_errors_carry_pointers() {
    let value = json!({
        "a": ["fine ${ .input.n }", "${ .x + }"],
        "b/c": {"d~e": "at ${ now }"},
        "f": "${ .unclosed",
        "g": "${ .ok }"
    });
    let errors = Template::parse(&value).unwrap_err();
    assert_eq!(
        errors,
        vec![
            TemplateError {
                pointer: "/a/1".into(),
                offset: 2,
                error: ExprError::Syntax {
                    message: "expected term, found the end of the expression".into(),
                    position: Position {
                        offset: 8,
                        line: 1,
                        column: 9
                    }
                }
            },
            TemplateError {
                pointer: "/b~1c/d~0e".into(),
                offset: 5,
                error: ExprError::Excluded {
                    name: "now".into(),
                    reason: "it reads the clock",
                    position: Position {
                        offset: 6,
                        line: 1,
                        column: 7
                    }
                }
            },
            TemplateError {
                pointer: "/f".into(),
                offset: 2,
                error: ExprError::Syntax {
                    message: "`${` is not closed by a matching `}`".into(),
                    position: Position {
                        offset: 0,
                        line: 1,
                        column: 1
                    }
                }
            },
        ]
    );
    for e in &errors {
        assert!(value.pointer(&e.pointer).unwrap().is_string());
    }
    assert_eq!(
        errors[0].to_string(),
        "/a/1: column 9: expected term, found the end of the expression"
    );
    let root = Template::parse(&json!("x ${ .a | ) }")).unwrap_err();
    assert_eq!(root[0].to_string(), "column 11: unexpected `)`");
}

#[test]
fn template_render_errors_carry_pointers() {
    let t = Template::parse(&json!({"a": {"b": ["ok", "n: ${ .input.name + 1 }"]}})).unwrap();
    let e = t.render(&state()).unwrap_err();
    assert_eq!(e.pointer, "/a/b/1");
    assert_eq!(e.offset, 5);
    assert_eq!(e.to_string(), "/a/b/1: cannot calculate \"Ada\" + 1");
    let many = Template::parse(&json!("${ .nodes.intake.output.items[] }"))
        .unwrap()
        .render(&state())
        .unwrap_err();
    assert_eq!(
        many.to_string(),
        "the expression produced 3 values; wrap it in [ ] to collect them"
    );
}

#[test]
fn template_round_trips_through_serde_json() {
    let value = json!({"to": "${ .input.email }", "n": [1, "$${ x }"], "s": "hi ${ .input.name }"});
    let template = Template::parse(&value).unwrap();
    let stored = serde_json::to_value(&template).unwrap();
    assert_eq!(stored, value);
    let back: Template = serde_json::from_value(stored).unwrap();
    assert_eq!(back, template);
    assert_eq!(back.source(), &value);
    assert_eq!(
        back.render(&state()).unwrap(),
        json!({"to": "ada@example.com", "n": [1, "${ x }"], "s": "hi Ada"})
    );
    // Structure is checked when reading; expressions on first use.
    let err = serde_json::from_value::<Template>(json!({"a": "${ .x"})).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid template: /a: column 1: `${` is not closed by a matching `}`"
    );
    let lazy: Template = serde_json::from_value(json!({"a": "${ env }"})).unwrap();
    assert!(matches!(
        lazy.render(&state()).unwrap_err().error,
        ExprError::Excluded { .. }
    ));
}

/// The cost of one parse + eval of a typical expression, measured by
/// the test runner's timing of these tests (this module may not read
/// a clock): divide the test's time by the iterations.
const COST_ITERATIONS: usize = 200;

#[test]
fn cost_compile_and_eval_uncached() {
    let state = state();
    for _ in 0..COST_ITERATIONS {
        let filter = compile_filter(".nodes.intake.output.account_id").unwrap();
        let value = run_one(&filter, json_to_val(&state)).unwrap();
        assert_eq!(to_json(value).unwrap(), json!("acc_42"));
    }
}

#[test]
fn cost_parse_and_eval_cached() {
    let state = state();
    let _held = Expr::parse(".nodes.intake.output.account_id").unwrap();
    for _ in 0..COST_ITERATIONS * 50 {
        let expr = Expr::parse(".nodes.intake.output.account_id").unwrap();
        assert_eq!(expr.eval(&state).unwrap(), json!("acc_42"));
    }
}

/// Expressions that pass every rule of the guard and still cost more
/// than any engine has: what the sandbox (`expr_sandbox`) is for. Only
/// parsed here; `tests/tests/expr_sandbox.rs` runs them.
#[test]
fn some_expensive_expressions_pass_the_guard() {
    let doubling = format!("def f(g): g | g; {}.{}", "f(".repeat(34), ")".repeat(34));
    for source in [
        "reduce range(40) as $i (2; . * .)",
        "reduce range(60) as $i (\"x\"; . + .)",
        "\"x\" | . * 1000 | . * 1000 | . * 1000 | . * 1000",
        "[range(100000)] as $a | [$a[] | $a[]] | length",
        doubling.as_str(),
        "[range(1000)] as $a | reduce $a[] as $i (0; reduce $a[] as $j (.; reduce $a[] as $k (.; . + 1)))",
    ] {
        assert!(Expr::parse(source).is_ok(), "{source}");
    }
}

thread_local! {
    static SENT: std::cell::RefCell<Vec<Vec<String>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A stand-in for the sandbox: evaluates here, records what it was
/// sent, and "times out" on `.slow`.
fn fake_remote(sources: &[&str], input: &Value) -> Vec<Result<Value, ExprError>> {
    SENT.with(|s| {
        s.borrow_mut()
            .push(sources.iter().map(|s| s.trim().to_owned()).collect())
    });
    let mut out = Vec::new();
    for source in sources {
        let outcome = if source.trim() == ".slow" {
            Err(ExprError::TimedOut { ms: 1 })
        } else {
            Expr::parse(source).and_then(|e| e.eval(input))
        };
        let failed = outcome.is_err();
        out.push(outcome);
        if failed {
            break;
        }
    }
    out
}

#[test]
fn a_remote_render_sends_the_expressions_in_document_order_and_places_errors() {
    let input = json!({"x": 1, "y": "why"});
    let render = |template: &Template| match &template.root {
        Node::Const(v) => Ok(v.clone()),
        root => render_remote(root, &input, fake_remote),
    };
    let template = Template::parse(&json!({
        "a": "${ .x }",
        "b": ["${ .y } and ${ .x + 1 }"],
    }))
    .unwrap();
    assert_eq!(
        render(&template).unwrap(),
        json!({"a": 1, "b": ["why and 2"]})
    );
    let slow = Template::parse(&json!({"a": "${ .x }", "b": {"c": "${ .slow }"}, "d": "${ .y }"}))
        .unwrap();
    let error = render(&slow).unwrap_err();
    assert_eq!(error.pointer, "/b/c");
    assert_eq!(error.error, ExprError::TimedOut { ms: 1 });
    // A stored template whose expression no longer compiles: reported
    // as in process, and nothing from it on is sent.
    let stored: Template =
        serde_json::from_value(json!({"a": "${ .x }", "b": "${ nosuch }", "c": "${ .y }"}))
            .unwrap();
    let error = render(&stored).unwrap_err();
    assert_eq!(error.pointer, "/b");
    assert!(matches!(error.error, ExprError::Syntax { .. }), "{error}");
    assert_eq!(
        SENT.with(|s| s.borrow().clone()),
        vec![
            vec![".x".to_owned(), ".y".to_owned(), ".x + 1".to_owned()],
            vec![".x".to_owned(), ".slow".to_owned(), ".y".to_owned()],
            vec![".x".to_owned()],
        ]
    );
}
