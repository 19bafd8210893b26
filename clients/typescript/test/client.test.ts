/**
 * The TypeScript client against a real engine and worker: every call, a
 * watch that outlives an engine restart, the error mapping, the README's
 * example as written.
 * @module
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { randomUUID } from "node:crypto";
import { dirname, join } from "node:path";
import { after, test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import {
  BelayClient,
  Code,
  ConfigError,
  DeadlineExceeded,
  FailedPrecondition,
  InvalidArgument,
  InvalidJson,
  NotFound,
  PermissionDenied,
  Unauthenticated,
  Unavailable,
  type ClientOptions,
  type RunEvent,
} from "../src/index.js";
import { GRANTS, admin, closeAll, customer, env, killEngine, newEngine, track } from "./harness.js";

after(closeAll);

function gapless(events: RunEvent[]): void {
  assert.deepEqual(events.map((e) => e.seq), events.map((_, i) => i + 1));
}

async function until(belay: BelayClient, runId: string, kind: string): Promise<RunEvent> {
  for await (const event of belay.watch(runId, 0, { timeoutMs: 60_000 })) if (event.kind === kind) return event;
  throw new Error(`run ${runId} ended without ${kind}`);
}

test("start is idempotent, wait returns the finished run, events and lists page", async () => {
  const belay = admin();
  const key = `express-${randomUUID()}`;
  const started = await belay.startRun("onboarding_express", customer("express"), { idempotencyKey: key, callerGrants: GRANTS });
  assert.ok(started.created);
  const again = await belay.startRun("onboarding_express", started.run.input, { idempotencyKey: key, callerGrants: GRANTS });
  assert.equal(again.created, false);
  assert.equal(again.run.runId, started.run.runId);
  await assert.rejects(
    belay.startRun("onboarding_express", customer("other"), { idempotencyKey: key, callerGrants: GRANTS }),
    (e: unknown) => e instanceof FailedPrecondition && e.rawMessage.includes(started.run.runId),
  );
  const done = await belay.wait(started.run.runId, 60_000);
  assert.equal(done.status, "completed", done.statusReason);
  assert.match(String((done.output as { account_id: string }).account_id), /^acct_/);
  const events = await belay.events(done.runId);
  gapless(events);
  assert.equal(events.at(-1)?.kind, "run_completed");
  assert.deepEqual((await belay.events(done.runId, 2, 3)).map((e) => e.seq), [3, 4, 5]);
  const page = await belay.listRuns({ status: "completed", pageSize: 500 });
  assert.ok(page.runs.some((r) => r.runId === done.runId));
});

test("watch, signal and approve outlive an engine restart", async () => {
  const belay = admin();
  const { run } = await belay.startRun("onboarding", customer("watch"), { callerGrants: GRANTS });
  const seen: RunEvent[] = [];
  let killed = 0;
  for await (const event of belay.watch(run.runId)) {
    seen.push(event);
    if (event.kind === "wait_started" && killed === 0) {
      killed = killEngine();
      const first = await belay.signal(run.runId, "documents_received", { files: ["passport.pdf"] }, { signalId: "docs-1" });
      assert.equal(first.duplicate, false);
      const second = await belay.signal(run.runId, "documents_received", { files: ["passport.pdf"] }, { signalId: "docs-1" });
      assert.equal(second.duplicate, true);
    } else if (event.kind === "approval_requested") {
      await belay.approve(run.runId, "approve", { approver: "grace", approverGrants: ["onboarding.approve"], reason: "KYC clear" });
    }
  }
  assert.notEqual(await newEngine(killed), killed);
  gapless(seen);
  assert.equal(seen.at(-1)?.kind, "run_completed");
  assert.deepEqual(seen.map((e) => e.seq), (await belay.events(run.runId)).map((e) => e.seq));
  const done = await belay.getRun(run.runId);
  assert.equal(done.status, "completed");
  assert.equal((done.output as { plan: string }).plan, "pro");
});

test("pause, resume, cancel, decline and a wait that times out", async () => {
  const belay = admin();
  const { run } = await belay.startRun("onboarding", customer("pause"), { callerGrants: GRANTS });
  await until(belay, run.runId, "wait_started");
  await assert.rejects(belay.wait(run.runId, 500), (e: unknown) => e instanceof DeadlineExceeded && e.code === Code.DeadlineExceeded && /waiting/.test(e.rawMessage));
  assert.equal((await belay.pause(run.runId, "maintenance", "ops")).status, "paused");
  assert.equal((await belay.resume(run.runId, "done", "ops")).status, "waiting");
  assert.equal((await belay.cancel(run.runId, "withdrawn")).status, "cancelled");
  assert.equal((await belay.wait(run.runId, 10_000)).status, "cancelled");
  await assert.rejects(belay.cancel(run.runId), FailedPrecondition);

  const declined = (await belay.startRun("onboarding", customer("decline"), { callerGrants: GRANTS })).run;
  for await (const event of belay.watch(declined.runId, 0, { timeoutMs: 60_000 })) {
    if (event.kind === "wait_started") await belay.signal(declined.runId, "documents_received", { files: ["a.pdf"] });
    if (event.kind === "approval_requested") await belay.decline(declined.runId, "approve", { approverGrants: ["onboarding.approve"], reason: "no" });
  }
  const failed = await belay.getRun(declined.runId);
  assert.equal(failed.status, "failed");
  assert.match(failed.statusReason, /declined/);
});

test("definitions, grants and tool input", async () => {
  const belay = admin();
  const registered = await belay.registerPaths([env("BELAY_TEST_DEFINITIONS")]);
  assert.ok(registered.some((d) => d.kind === "workflow" && d.name === "onboarding"));
  assert.ok(registered.every((d) => !d.created));
  const workflows = await belay.listDefinitions("workflow");
  assert.ok(workflows.every((d) => d.kind === "workflow"));
  assert.deepEqual(await belay.setTenantGrants(GRANTS), GRANTS);
  assert.deepEqual((await belay.getTenantGrants()).sort(), [...GRANTS].sort());
  await assert.rejects(belay.registerBundle({ "broken.yaml": "kind: workflow\nname: [\n" }), (e: unknown) => e instanceof InvalidArgument && e.rawMessage.includes("broken.yaml"));
  const { run } = await belay.startRun("onboarding", customer("input"), { callerGrants: GRANTS });
  await until(belay, run.runId, "wait_started");
  await assert.rejects(belay.provideToolInput(run.runId, "intake.t1", { action: "accept", content: {} }), (e: unknown) => e instanceof FailedPrecondition || e instanceof InvalidArgument);
  await belay.cancel(run.runId);
});

test("errors carry the gRPC code and the engine's message", async () => {
  const url = env("BELAY_ENGINE_URL");
  const tenant = env("BELAY_TENANT");
  const bad = track(new BelayClient({ url, apiKey: "belay_nope_nope", tenant, retry: { maxAttempts: 1, initialBackoffMs: 0, maxBackoffMs: 0 } }));
  await assert.rejects(bad.listRuns(), (e: unknown) => e instanceof Unauthenticated && e.code === Code.Unauthenticated && e.codeName === "UNAUTHENTICATED" && e.method === "belay.v1.RunService/ListRuns" && e.rawMessage.length > 0);
  const plain = track(new BelayClient({ url, apiKey: env("BELAY_TEST_CLIENT_KEY"), tenant }));
  await assert.rejects(plain.setTenantGrants(["crm.read"]), PermissionDenied);
  await assert.rejects(track(new BelayClient({ url, apiKey: env("BELAY_TEST_CLIENT_KEY"), tenant: "globex" })).listRuns(), PermissionDenied);
  const belay = admin();
  await assert.rejects(belay.getRun(randomUUID()), NotFound);
  await assert.rejects(belay.startRun("nope", {}), (e: unknown) => e instanceof NotFound && e.rawMessage.includes("workflow `nope` not found"));
  await assert.rejects(belay.startRun("onboarding", { name: "no email" }), (e: unknown) => e instanceof InvalidArgument && e.rawMessage.includes("input schema"));
  const watching = async (): Promise<void> => {
    for await (const event of belay.watch(randomUUID())) void event;
  };
  await assert.rejects(watching(), (e: unknown) => e instanceof NotFound && e.method === "belay.v1.RunService/WatchRun");
});

test("arguments that are not JSON are refused before any call", async () => {
  // Nothing listens on port 1: a call would be Unavailable. The messages
  // are the Python client's, word for word (clients/python/tests/test_sync.py).
  const nowhere = track(new BelayClient({ url: "http://127.0.0.1:1", retry: { maxAttempts: 1, initialBackoffMs: 0, maxBackoffMs: 0 } }));
  const circular: unknown[] = [];
  circular.push(circular);
  const refusals: [() => Promise<unknown>, string][] = [
    [() => nowhere.startRun("w", { n: Number.NaN }), "the run's input is not JSON: $.n is a number that is not finite (NaN)"],
    [() => nowhere.startRun("w", { a: [1, { f: console.log }] } as never), "the run's input is not JSON: $.a[1].f is a function"],
    [() => nowhere.startRun("w", { "x y": Number.POSITIVE_INFINITY }), 'the run\'s input is not JSON: $["x y"] is a number that is not finite (Infinity)'],
    [() => nowhere.signal("r", "s", { l: circular } as never), "the signal's payload is not JSON: $.l[0] is a circular reference"],
    [() => nowhere.approve("r", "n", { editedSubject: { when: new Date(0) } as never }), "the edited subject is not JSON: $.when is an object of type Date"],
    [() => nowhere.provideToolInput("r", "c", { n: 1n } as never), "the answer is not JSON: $.n is a bigint"],
    [() => nowhere.startRun("w", { u: undefined } as never), "the run's input is not JSON: $.u is undefined"],
  ];
  for (const [call, message] of refusals) {
    await assert.rejects(call(), (e: unknown) => e instanceof InvalidJson && e instanceof TypeError && e.message === message);
  }
  // A string is a JSON string, sent as it is (not parsed as JSON text); no
  // input (null) is {}, as in Python: both reach the engine.
  for (const value of ["{not json", null]) await assert.rejects(nowhere.startRun("w", value), Unavailable);
});

test("getRun shows open requests and unclaimable tasks", async () => {
  const belay = admin();
  const { run } = await belay.startRun("onboarding", customer("requests"), { callerGrants: GRANTS });
  assert.deepEqual((await belay.getRun(run.runId)).openRequests, []);
  for await (const event of belay.watch(run.runId, 0, { timeoutMs: 60_000 })) {
    if (event.kind === "wait_started") await belay.signal(run.runId, "documents_received", { files: ["passport.pdf"] });
    if (event.kind === "approval_requested") {
      const waiting = await belay.getRun(run.runId);
      assert.deepEqual(waiting.openRequests, [{ requestId: "approve.approval", kind: "approval", node: "approve", callId: "", approverGrant: "onboarding.approve" }]);
      assert.deepEqual(waiting.unclaimable, []);
      await belay.approve(run.runId, "approve", { approverGrants: ["onboarding.approve"], requestId: waiting.openRequests[0]?.requestId ?? "" });
    }
  }
  const done = await belay.wait(run.runId, 30_000);
  assert.equal(done.status, "completed");
  assert.deepEqual(done.openRequests, []);

  // A tool only a worker of pool `nowhere` may call (tests/client-fixtures).
  const stuck = (await belay.startRun("client_unclaimable", { email: "x@example.com" }, { callerGrants: GRANTS })).run;
  await until(belay, stuck.runId, "tool_call_scheduled");
  const { unclaimable } = await belay.getRun(stuck.runId);
  assert.equal(unclaimable.length, 1);
  const task = unclaimable[0];
  assert.ok(task !== undefined && task.kind === "tool_call" && task.taskId.length > 0);
  assert.ok(task.requires.includes("pool:nowhere"));
  assert.deepEqual(task.missing, ["pool:nowhere"]);
  assert.equal(task.reason, "no live worker has pool:nowhere");
  await belay.cancel(stuck.runId);
});

test("options are checked, and UNAVAILABLE is retried then raised", async () => {
  assert.throws(() => new BelayClient({ url: "http://127.0.0.1:1", caFile: "ca.pem" }), (e: unknown) => e instanceof ConfigError && /plaintext http/.test(e.message));
  assert.throws(() => new BelayClient({ url: "grpc://127.0.0.1:1" }), ConfigError);
  assert.throws(() => new BelayClient({ url: "https://127.0.0.1:1", caFile: "/nonexistent/ca.pem" }), /reading the CA file/);
  assert.throws(() => new BelayClient({ url: "https://127.0.0.1:1", clientCert: "c.pem" }), /go together/);
  const nowhere = track(new BelayClient({ url: "http://127.0.0.1:1", retry: { maxAttempts: 3, initialBackoffMs: 100, maxBackoffMs: 100 } }));
  await assert.rejects(nowhere.getRun("x"), (e: unknown) => e instanceof Unavailable && e.code === Code.Unavailable);
});

test("answers larger than gRPC's default 4 MiB are read (as in Python)", async () => {
  const belay = admin();
  const notes = "x".repeat(2_500_000);
  const runs = [];
  for (const i of [0, 1]) runs.push((await belay.startRun("client_unclaimable", { email: `big${i}@example.com`, notes }, { callerGrants: GRANTS })).run);
  try {
    const page = await belay.listRuns({ pageSize: 2 });
    assert.deepEqual(new Set(page.runs.map((r) => r.runId)), new Set(runs.map((r) => r.runId)));
    assert.ok(page.runs.every((r) => (r.input as { notes?: string }).notes === notes));
  } finally {
    for (const run of runs) await belay.cancel(run.runId);
  }
});

test("a timeout or retry policy that cannot work is a ConfigError", () => {
  // As in Python (test_sync.py); a timeout of 0 used to mean none, a policy of 0 attempts one.
  const cases: [ClientOptions, string][] = [
    [{ timeoutMs: 0 }, "timeoutMs must be a positive number of milliseconds, not 0"],
    [{ timeoutMs: -1.5 }, "timeoutMs must be a positive number of milliseconds, not -1.5"],
    [{ timeoutMs: NaN }, "timeoutMs must be a positive number of milliseconds, not NaN"],
    [{ retry: { maxAttempts: 0, initialBackoffMs: 100, maxBackoffMs: 100 } }, "maxAttempts must be at least 1, not 0"],
    [{ retry: { maxAttempts: 3, initialBackoffMs: -1, maxBackoffMs: 100 } }, "0 <= initialBackoffMs <= maxBackoffMs"],
    [{ retry: { maxAttempts: 3, initialBackoffMs: 1, maxBackoffMs: 1, maxElapsedMs: -1 } }, "maxElapsedMs must not be negative"],
  ];
  for (const [options, says] of cases) {
    assert.throws(() => new BelayClient({ url: "http://127.0.0.1:1", ...options }), (e: unknown) => e instanceof ConfigError && e.message.includes(says), says);
  }
});

test("the README's example runs as written", async () => {
  const example = join(dirname(fileURLToPath(import.meta.url)), "..", "examples", "onboarding.js");
  const { stdout } = await promisify(execFile)(process.execPath, [example], { env: process.env, timeout: 120_000 });
  const lines = stdout.trim().split("\n");
  assert.match(lines[0] ?? "", /^1 /);
  assert.ok(lines.some((l) => l.endsWith(" approval_requested")));
  assert.match(lines.at(-1) ?? "", /^completed \{/);
});
