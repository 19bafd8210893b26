/**
 * How the client ends when the engine cannot answer: a watch on an engine
 * that froze (keepalive pings), a watch whose reconnections outlast the
 * retry policy's `maxElapsedMs`, and TLS handshakes that fail (as in
 * clients/python/tests/test_resilience.py).
 * @module
 */
import assert from "node:assert/strict";
import { after, afterEach, test } from "node:test";

import { BelayClient, Code, Unavailable, type RetryPolicy } from "../src/index.js";
import { setImmediate as nextTurn } from "node:timers/promises";

import { GRANTS, admin, closeAll, customer, freezeEngine, listener, pkiFile, silentServer, thawEngine, track } from "./harness.js";

after(closeAll);
afterEach(thawEngine);

/** Many attempts, so only `maxElapsedMs` can end the reconnections early. */
const BOUNDED: RetryPolicy = { maxAttempts: 1000, initialBackoffMs: 50, maxBackoffMs: 200, maxElapsedMs: 2000 };

/**
 * The bound a frozen engine's watch is held to: keepalive (1 s + 1 s), then
 * `maxElapsedMs` (2 s) of reconnections, with room for a slow machine.
 */
const FROZEN_BOUND_MS = 30_000;

test("a watch on a frozen engine ends Unavailable", async () => {
  const belay = admin();
  const { run } = await belay.startRun("onboarding", customer("frozen"), { callerGrants: GRANTS });
  const watcher = track(BelayClient.fromEnv({ retry: BOUNDED, keepaliveMs: 1000, keepaliveTimeoutMs: 1000 }));
  let frozenAt = 0;
  const watching = async (): Promise<void> => {
    // The overall timeout only keeps a broken client from hanging the suite.
    for await (const event of watcher.watch(run.runId, 0, { timeoutMs: 120_000 })) {
      if (event.kind === "wait_started" && frozenAt === 0) {
        freezeEngine();
        frozenAt = Date.now();
      }
    }
  };
  await assert.rejects(watching(), (e: unknown) => e instanceof Unavailable && e.code === Code.Unavailable && e.method === "belay.v1.RunService/WatchRun");
  const took = Date.now() - frozenAt;
  thawEngine();
  assert.ok(frozenAt > 0 && took < FROZEN_BOUND_MS, `the watch ended ${took} ms after the engine froze`);
  assert.equal((await belay.cancel(run.runId)).status, "cancelled"); // the thawed engine answers again
});

test("a watch stops reconnecting after maxElapsedMs", async () => {
  const nowhere = track(new BelayClient({ url: "http://127.0.0.1:1", retry: BOUNDED }));
  const started = Date.now();
  const watching = async (): Promise<void> => {
    for await (const event of nowhere.watch("run-1")) void event;
  };
  await assert.rejects(watching(), (e: unknown) => e instanceof Unavailable && e.method === "belay.v1.RunService/WatchRun");
  const took = Date.now() - started;
  // 1000 attempts would take minutes; maxElapsedMs (2 s) ends them.
  assert.ok(took >= 2000 && took < 15_000, `${took} ms`);
});

test("a unary call stops retrying after maxElapsedMs", async () => {
  const nowhere = track(new BelayClient({ url: "http://127.0.0.1:1", retry: BOUNDED }));
  const started = Date.now();
  await assert.rejects(nowhere.getRun("run-1"), Unavailable);
  assert.ok(Date.now() - started < 15_000);
});

test("close() right after a keepalive ping timed out leaves the process running", async () => {
  // connect-node 2.1 drops its listener from a session it leaves, though a
  // session a ping timeout destroyed emits its error only when the socket
  // has closed: unheard, that error ended the process (exit code 1).
  const server = await silentServer();
  try {
    const belay = new BelayClient({ url: server.url, keepaliveMs: 100, keepaliveTimeoutMs: 100, retry: { maxAttempts: 1, initialBackoffMs: 0, maxBackoffMs: 0 } });
    await assert.rejects(belay.getRun("run-1"), (e: unknown) => e instanceof Unavailable && e.rawMessage.includes("PING timed out"));
    belay.close();
    await server.disconnected(); // the client's socket closed: its session has emitted what it had
    await nextTurn();
  } finally {
    await server.close();
  }
});

for (const [tls, name] of [
  [true, "untrusted certificate"],
  [false, "not TLS"],
] as const) {
  test(`a failed TLS handshake is Unavailable (${name})`, async () => {
    const server = await listener(tls);
    try {
      const belay = track(new BelayClient({ url: server.url, caFile: pkiFile("other-ca.pem"), retry: { maxAttempts: 1, initialBackoffMs: 0, maxBackoffMs: 0 } }));
      await assert.rejects(belay.getRun("run-1"), (e: unknown) => e instanceof Unavailable && e.code === Code.Unavailable && e.method === "belay.v1.RunService/GetRun");
    } finally {
      await server.close();
    }
  });
}
