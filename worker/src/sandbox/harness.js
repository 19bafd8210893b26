// Belay sandbox harness for `runtime: javascript` (run with `node -e`).
// Reads {"code", "params", "args"} as JSON from stdin, runs the code as the
// body of an async function whose parameters are `params` (each bound to
// the argument of that name), and writes exactly one JSON line to stdout:
// {"ok": <result>} or {"error": {"kind", "name", "message", "trace"}}.
// What the code prints goes to stderr, so stdout carries the result only.
"use strict";
const fs = require("fs");
const vm = require("vm");
const MAX_TRACE = 4000;
const emit = (value) => {
  fs.writeSync(1, JSON.stringify(value) + "\n");
};
const fail = (kind, e) => {
  const isError = e !== null && typeof e === "object";
  emit({
    error: {
      kind,
      name: isError && e.name ? String(e.name) : typeof e,
      message: isError && e.message !== undefined ? String(e.message) : String(e),
      // The code's frames only, not the harness's.
      trace: isError && e.stack
        ? String(e.stack)
            .split("\n")
            .filter((l) => !/^\s+at /.test(l) || l.includes("tool.js"))
            .join("\n")
            .slice(0, MAX_TRACE)
        : "",
    },
  });
};
globalThis.console = new console.Console({ stdout: process.stderr, stderr: process.stderr });
let input;
try {
  input = JSON.parse(fs.readFileSync(0, "utf8"));
} catch (e) {
  fail("harness", e);
  process.exit(0);
}
const { code, params, args } = input;
let tool;
try {
  // Line 1 of the code is line 1 of `tool.js` in messages and stacks.
  const source = "(async function (" + params.join(", ") + ") {\n" + code + "\n})";
  tool = new vm.Script(source, { filename: "tool.js", lineOffset: -1 }).runInThisContext();
} catch (e) {
  fail("syntax", e);
  process.exit(0);
}
tool(...params.map((p) => args[p])).then(
  (value) => {
    if (value === undefined) {
      emit({
        error: {
          kind: "result",
          name: "undefined",
          message: "the code returned nothing (undefined): `return` the result",
          trace: "",
        },
      });
    } else {
      let text;
      try {
        text = JSON.stringify({ ok: value });
      } catch (e) {
        fail("result", e);
        process.exit(0);
      }
      fs.writeSync(1, text + "\n");
    }
    process.exit(0);
  },
  (e) => {
    fail("exception", e);
    process.exit(0);
  },
);
