/**
 * TypeScript client (Node 20+, ESM) of Belay's gRPC API (`belay.v1`):
 * `BelayClient`, typed results (`Run`, `RunEvent`, …) and one error class
 * per gRPC code (`BelayError` and its subclasses, each with `code` and
 * `rawMessage`).
 *
 * ```ts
 * const belay = BelayClient.fromEnv();
 * const { run } = await belay.startRun("onboarding", { email: "ada@example.com", name: "Ada" });
 * for await (const event of belay.watch(run.runId)) console.log(event.seq, event.kind);
 * ```
 * @module
 */
export { BelayClient, type DecisionOptions, type StartOptions } from "./client.js";
export * from "./errors.js";
export * from "./models.js";
export { DEFAULT_KEEPALIVE_MS, DEFAULT_KEEPALIVE_TIMEOUT_MS, DEFAULT_URL, envOptions, type ClientOptions } from "./options.js";
export { DEFAULT_RETRY, type RetryPolicy } from "./retry.js";
export { Code } from "@connectrpc/connect";
