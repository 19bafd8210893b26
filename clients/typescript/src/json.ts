/**
 * JSON arguments (a run's input, a signal's payload, an answer) encoded
 * before any call is made, strictly and the same way as the Python client
 * (`clients/python/src/belay_client/_json.py`): only `null`, booleans,
 * finite numbers, strings, arrays and plain objects are JSON. Anything else
 * (`undefined`, a function, a bigint, a symbol, `NaN`, a `Date`, a `Map`,
 * a class instance, a cycle), which `JSON.stringify` would drop, turn into
 * `null` or into a string silently, is refused with `InvalidJson` naming
 * where it is (`$.items[2].when`) and what it is. A string is a JSON
 * string, never parsed: pass the decoded document, not JSON text.
 * @module
 */
import { InvalidJson } from "./errors.js";

const SIMPLE_KEY = /^[A-Za-z_][A-Za-z0-9_]*$/;

function keyPath(path: string, key: string): string {
  return SIMPLE_KEY.test(key) ? `${path}.${key}` : `${path}[${JSON.stringify(key)}]`;
}

/** What `value` itself is when it cannot be JSON (its children aside), else undefined. */
function notJson(value: unknown): string | undefined {
  switch (typeof value) {
    case "string":
    case "boolean":
      return undefined;
    case "number":
      return Number.isFinite(value) ? undefined : `a number that is not finite (${String(value)})`;
    case "function":
      return "a function";
    case "undefined":
      return "undefined";
    case "bigint":
      return "a bigint";
    case "symbol":
      return "a symbol";
  }
  if (value === null || Array.isArray(value)) return undefined;
  const proto: unknown = Object.getPrototypeOf(value);
  if (proto === Object.prototype || proto === null) return undefined;
  const name = (value as { constructor?: { name?: unknown } }).constructor?.name;
  return `an object of type ${typeof name === "string" && name ? name : "unknown"}`;
}

class Refused extends Error {
  constructor(
    readonly path: string,
    readonly what: string,
  ) {
    super(`${path} is ${what}`);
  }
}

/** Throw `Refused` at the first value under `value` that is not JSON (`open`: the containers being walked). */
function check(value: unknown, path: string, open: Set<object>): void {
  const what = notJson(value);
  if (what !== undefined) throw new Refused(path, what);
  if (value === null || typeof value !== "object") return;
  if (open.has(value)) throw new Refused(path, "a circular reference");
  open.add(value);
  if (Array.isArray(value)) {
    value.forEach((item: unknown, i) => check(item, `${path}[${i}]`, open));
  } else {
    for (const [key, item] of Object.entries(value)) check(item, keyPath(path, key), open);
  }
  open.delete(value);
}

/** `value` as compact JSON text, or `InvalidJson` naming `what` (`the run's input`), where and what the offending value is. */
export function toJson(value: unknown, what: string): string {
  try {
    check(value, "$", new Set());
  } catch (e) {
    if (e instanceof Refused) throw new InvalidJson(`${what} is not JSON: ${e.message}`);
    throw e;
  }
  return JSON.stringify(value);
}
