/**
 * What the client suite needs from the harness (tests/tests/clients.rs): a
 * real engine and worker described in the environment (`BELAY_ENGINE_URL`,
 * `BELAY_API_KEY` of an admin, `BELAY_TENANT`, `BELAY_TEST_CLIENT_KEY` of
 * role client, `BELAY_TEST_ENGINE_PID_FILE`: the engine's pid, rewritten
 * when the harness restarts a killed engine, `BELAY_TEST_DEFINITIONS`).
 * @module
 */
import { readFileSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";

import { BelayClient, type RetryPolicy } from "../src/index.js";

/** Patient enough to ride out an engine restart. */
export const PATIENT: RetryPolicy = { maxAttempts: 60, initialBackoffMs: 50, maxBackoffMs: 1000 };

/** The example's grants. */
export const GRANTS = ["crm.read", "crm.write", "email.send"];

/** A variable the harness sets. */
export function env(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: run this suite through \`cargo nextest run --test clients\``);
  return value;
}

const open: BelayClient[] = [];

/** Keep `client` to be closed by `closeAll` (after the suite). */
export function track(client: BelayClient): BelayClient {
  open.push(client);
  return client;
}

/** Close every tracked client, so the test process exits at once. */
export function closeAll(): void {
  for (const client of open.splice(0)) client.close();
}

/** An admin client of the test tenant. */
export function admin(): BelayClient {
  return track(BelayClient.fromEnv({ retry: PATIENT }));
}

function enginePid(): number {
  return Number.parseInt(readFileSync(env("BELAY_TEST_ENGINE_PID_FILE"), "utf8").trim(), 10);
}

/** SIGKILL the engine (the harness restarts it); the killed pid. */
export function killEngine(): number {
  const pid = enginePid();
  process.kill(pid, "SIGKILL");
  return pid;
}

/** The pid of the engine that replaced `old`. */
export async function newEngine(old: number, timeoutMs = 60_000): Promise<number> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const pid = enginePid();
    if (Number.isFinite(pid) && pid !== old) return pid;
    await sleep(50);
  }
  throw new Error(`no engine replaced pid ${old} within ${timeoutMs} ms`);
}

/** A customer with a fresh email. */
export function customer(tag: string): { email: string; name: string; plan: string } {
  return { email: `${tag}-${Math.random().toString(16).slice(2, 10)}@example.com`, name: "Ada Lovelace", plan: "pro" };
}
