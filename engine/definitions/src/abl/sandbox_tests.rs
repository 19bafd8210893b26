//! Tests of `type: sandbox` tools and of `|` block scalars.

use belay_proto::wire::{SandboxBinding, SandboxRuntime};

use super::super::super::model::{RepeatSafety, ToolBindingDef, ToolDef};
use super::super::{AblOutput, parse_tools_file};

const FILE: &str = "tools/code.tools.abl";

fn parse(content: &str) -> AblOutput {
    parse_tools_file(FILE, content)
}

fn tools(content: &str) -> Vec<ToolDef> {
    let out = parse(content);
    let errors: Vec<String> = out
        .errors
        .iter()
        .map(|e| format!("{}:{}: {}", e.line, e.column, e.message))
        .collect();
    assert_eq!(errors, Vec::<String>::new(), "unexpected errors");
    out.tools
}

fn sandbox(tool: &ToolDef) -> &SandboxBinding {
    match &tool.binding {
        ToolBindingDef::Sandbox(b) => b,
        other => panic!("not a sandbox binding: {other:?}"),
    }
}

/// Errors as `line:column: message`; the file yields no tool.
fn errors(content: &str) -> Vec<String> {
    let out = parse(content);
    assert!(out.tools.is_empty(), "a tool with errors was kept");
    out.errors
        .iter()
        .map(|e| {
            assert_eq!(e.file, FILE);
            format!("{}:{}: {}", e.line, e.column, e.message)
        })
        .collect()
}

/// The seed's three examples, with Belay's required `permission:`.
const SEED: &str = r#"TOOLS:
  calculate_tax(income: number, state: string) -> {tax: number, rate: number}
    description: "Calculate state income tax"
    type: sandbox
    runtime: javascript
    timeout: 5000
    memory_mb: 128
    permission: tax.compute
    code: |
      const rates = { CA: 0.133, NY: 0.109, TX: 0 };
      const rate = rates[state] || 0.05;
      return { tax: income * rate, rate };

  format_currency(amount: number, currency: string) -> {formatted: string}
    type: sandbox
    runtime: javascript
    code: |
      const formatter = new Intl.NumberFormat('en-US', {
        style: 'currency',
        currency: currency
      });
      return { formatted: formatter.format(amount) };
    permission: text.format

  analyze_text(text: string) -> {word_count: number, sentences: number}
    type: sandbox
    runtime: python
    permission: text.read
    code: |
      import re
      words = len(text.split())
      sentences = len(re.split(r'[.!?]+', text))
      return {"word_count": words, "sentences": sentences}
"#;

#[test]
fn the_seed_examples_parse_into_sandbox_bindings() {
    let tools = tools(SEED);
    assert_eq!(tools.len(), 3);
    let tax = &tools[0];
    assert_eq!(
        sandbox(tax),
        &SandboxBinding {
            runtime: SandboxRuntime::Javascript,
            code: "const rates = { CA: 0.133, NY: 0.109, TX: 0 };\nconst rate = rates[state] || 0.05;\nreturn { tax: income * rate, rate };\n".into(),
            params: vec!["income".into(), "state".into()],
            timeout_ms: Some(5000),
            memory_mb: Some(128),
        }
    );
    // A pure computation: idempotent unless written, and no side effects.
    assert_eq!(tax.repeat_safety, RepeatSafety::Idempotent);
    assert!(!tax.has_side_effects());
    assert_eq!(tax.description, "Calculate state income tax");
    let fmt = sandbox(&tools[1]);
    assert_eq!(
        fmt.code,
        "const formatter = new Intl.NumberFormat('en-US', {\n  style: 'currency',\n  currency: currency\n});\nreturn { formatted: formatter.format(amount) };\n"
    );
    assert_eq!((fmt.timeout_ms, fmt.memory_mb), (None, None));
    let py = sandbox(&tools[2]);
    assert_eq!(py.runtime, SandboxRuntime::Python);
    assert_eq!(py.params, vec!["text".to_string()]);
    assert!(
        py.code
            .starts_with("import re\nwords = len(text.split())\n")
    );
    // The stored shape is the wire shape, tagged `sandbox`.
    let json = serde_json::to_value(&tools[2].binding).unwrap();
    assert_eq!(json["type"], "sandbox");
    assert_eq!(json["runtime"], "python");
    assert!(json.get("timeout_ms").is_none());
    let back: ToolBindingDef = serde_json::from_value(json).unwrap();
    assert_eq!(back, tools[2].binding);
}

#[test]
fn a_block_keeps_comments_blank_lines_and_deeper_indentation() {
    let content = "TOOLS:\n  f(x: number) -> number\n    type: sandbox\n    runtime: python\n    permission: p\n    code: |   # a YAML comment, not code\n        # a Python comment stays\n        def sq(v):\n            return v * v  # so does this\n\n\n        s = \"a # b\"\n        return sq(x)\n\n\n    repeat_safety: never\n";
    let tools = tools(content);
    assert_eq!(
        sandbox(&tools[0]).code,
        "# a Python comment stays\ndef sq(v):\n    return v * v  # so does this\n\n\ns = \"a # b\"\nreturn sq(x)\n"
    );
    assert_eq!(tools[0].repeat_safety, RepeatSafety::Never);
}

#[test]
fn chomping_indicators_crlf_tabs_inside_and_one_line_code() {
    let tool = |code_lines: &str| {
        format!(
            "TOOLS:\n  f(x: number) -> number\n    type: sandbox\n    runtime: javascript\n    permission: p\n{code_lines}"
        )
    };
    let code = |content: &str| sandbox(&tools(content)[0]).code.clone();
    assert_eq!(
        code(&tool("    code: |-\n      return x;\n\n")),
        "return x;"
    );
    assert_eq!(
        code(&tool("    code: |+\n      return x;\n\n\n")),
        "return x;\n\n\n\n"
    );
    // A tab after the block's indentation is text.
    assert_eq!(
        code(&tool(
            "    code: |\n      if (x) {\n      \treturn x;\n      }\n"
        )),
        "if (x) {\n\treturn x;\n}\n"
    );
    assert_eq!(
        code(&tool(
            "    code: |\r\n      return x;\r\n\r\n      // end\r\n"
        )),
        "return x;\n\n// end\n"
    );
    assert_eq!(
        code(&tool("    code: \"return x * 2;\"\n")),
        "return x * 2;"
    );
    // The block ends at the file's end too.
    assert_eq!(code(&tool("    code: |\n      return x;")), "return x;\n");
}

#[test]
fn sandbox_errors_point_at_the_line_and_column() {
    let head = "TOOLS:\n  f(x: number) -> number\n    type: sandbox\n    permission: p\n";
    let with = |extra: &str| format!("{head}{extra}");
    assert_eq!(
        errors(head),
        vec![
            "2:3: tool `f` is missing `runtime:` (`javascript` or `python`)",
            "2:3: tool `f` is missing `code:` (the body of its function, usually a `|` block)",
        ]
    );
    assert_eq!(
        errors(&with("    runtime: ruby\n    code: \"x\"\n")),
        vec!["5:14: unknown runtime `ruby` (expected `javascript` or `python`)"]
    );
    assert_eq!(
        errors(&with(
            "    runtime: python\n    memory_mb: 32\n    code: |\n      return x\n"
        )),
        vec!["6:16: `memory_mb` must be a whole number of megabytes from 64 to 16384, not `32`"]
    );
    assert_eq!(
        errors(&with(
            "    runtime: python\n    memory_mb: lots\n    code: \"return x\"\n"
        )),
        vec!["6:16: `memory_mb` must be a whole number of megabytes from 64 to 16384, not `lots`"]
    );
    assert_eq!(
        errors(&with(
            "    runtime: python\n    timeout: 11m\n    code: \"return x\"\n"
        )),
        vec![
            "2:3: tool `f`: a sandbox `timeout` may be at most 600000 ms (10 minutes), not 660000"
        ]
    );
    assert_eq!(
        errors(&with(
            "    runtime: python\n    code: |\n    repeat_safety: never\n"
        )),
        vec!["6:11: the block is empty: write its lines below, indented further than the key"]
    );
    assert_eq!(
        errors(&with("    runtime: python\n    code: \"  \"\n")),
        vec!["6:11: `code` is empty: write the body of the tool's function"]
    );
    assert_eq!(
        errors(&with("    runtime: python\n    code: >\n      return x\n")),
        vec![
            "6:11: folded block scalars (`>`) are not supported; use `|`, which keeps the lines as written"
        ]
    );
    assert_eq!(
        errors(&with("    runtime: python\n    code: |2\n      return x\n")),
        vec![
            "6:11: block scalar indicator `|2` is not supported: write `|`, `|-` or `|+` (the first line of the block sets its indentation)"
        ]
    );
    assert_eq!(
        errors(&with(
            "    runtime: python\n    code: |\n        y = x\n      return y\n"
        )),
        vec!["8:7: this line of the block is indented 6 spaces, less than its first line (8)"]
    );
    assert_eq!(
        errors(&with(
            "    runtime: python\n    code: |\n      y = x\n     \treturn y\n"
        )),
        vec!["8:6: indentation must be spaces (found a tab or other whitespace)"]
    );
    assert_eq!(
        errors(&format!(
            "{head}    runtime: python\n    code: \"{}\"\n",
            "x".repeat(100_001)
        )),
        vec!["6:11: `code` is 100001 bytes, more than 100000: a tool's code must stay small"]
    );
    assert_eq!(
        errors(&with(
            "    runtime: javascript\n    endpoint: /x\n    headers:\n      A: b\n    repeat_safety: reconcile\n    code: \"return x\"\n"
        )),
        vec![
            "2:3: tool `f` is `type: sandbox`: `endpoint:` does not apply (its code runs in the worker's sandbox, which has no network)",
            "2:3: tool `f` is `type: sandbox`: `headers:` does not apply (its code runs in the worker's sandbox, which has no network)",
            "2:3: tool `f` is `type: sandbox`: its code has no effect outside the sandbox to reconcile; use `repeat_safety: idempotent` (the default) or `never`",
        ]
    );
    assert_eq!(
        errors(&with(
            "    runtime: javascript\n    code: \"return 1\"\n    auth: bearer\n"
        )),
        vec!["2:3: `auth:` applies to `type: http` and `type: async_webhook` tools only"]
    );
}

#[test]
fn parameter_names_may_not_be_reserved_words_of_the_runtime() {
    let tool = |runtime: &str| {
        format!(
            "TOOLS:\n  f(class: string, from: number, ok: boolean) -> number\n    type: sandbox\n    runtime: {runtime}\n    permission: p\n    code: \"return 1\"\n"
        )
    };
    assert_eq!(
        errors(&tool("javascript")),
        vec![
            "2:5: parameter `class` of `f` is a reserved word in JavaScript: rename it (the code sees each parameter as a variable of its name)"
        ]
    );
    assert_eq!(
        errors(&tool("python")),
        vec![
            "2:5: parameter `class` of `f` is a reserved word in Python: rename it (the code sees each parameter as a variable of its name)",
            "2:20: parameter `from` of `f` is a reserved word in Python: rename it (the code sees each parameter as a variable of its name)",
        ]
    );
}

#[test]
fn sandbox_properties_on_other_types_and_blocks_on_other_keys_are_refused() {
    assert_eq!(
        errors(
            "TOOLS:\n  f(x: number) -> number\n    type: http\n    endpoint: /f\n    permission: p\n    repeat_safety: never\n    runtime: python\n    memory_mb: 128\n    code: |\n      return x\n"
        ),
        vec![
            "2:3: `runtime:` applies to `type: sandbox` tools only",
            "2:3: `code:` applies to `type: sandbox` tools only",
            "2:3: `memory_mb:` applies to `type: sandbox` tools only",
        ]
    );
    // The block's lines are taken with it: one error, at the `|`.
    assert_eq!(
        errors(
            "TOOLS:\n  f(x: number) -> number\n    description: |\n      Doubles x.\n      weird: line\n    type: sandbox\n    runtime: python\n    permission: p\n    code: \"return 2 * x\"\n"
        ),
        vec![
            "3:18: block scalars (`|`, `>`) are supported for `code:` only; write the value on one line, in quotes"
        ]
    );
}

#[test]
fn confirmation_when_side_effects_does_not_ask_for_a_sandbox_tool() {
    let tools = tools(
        "TOOLS:\n  f(x: number) -> number\n    type: sandbox\n    runtime: javascript\n    permission: p\n    confirmation:\n      require: when_side_effects\n    code: |\n      return x;\n  g(x: number) -> number\n    type: sandbox\n    runtime: javascript\n    permission: p\n    effect: side_effect\n    confirmation:\n      require: when_side_effects\n    code: |\n      return x;\n",
    );
    assert!(tools[0].confirmation.is_none());
    assert!(tools[1].confirmation.is_some());
}
