/**
 * What the client suite needs from the harness (tests/tests/clients.rs): a
 * real engine and worker described in the environment (`BELAY_ENGINE_URL`,
 * `BELAY_API_KEY` of an admin, `BELAY_TENANT`, `BELAY_TEST_CLIENT_KEY` of
 * role client, `BELAY_TEST_ENGINE_PID_FILE`: the engine's pid, rewritten
 * when the harness restarts a killed engine, `BELAY_TEST_DEFINITIONS`,
 * `BELAY_TEST_PKI_DIR`: a test CA's `server.pem`, `server-key.pem` for
 * 127.0.0.1 and `other-ca.pem`, a CA that issued none of them). A test
 * may freeze the engine (SIGSTOP) with `freezeEngine`; `thawEngine`
 * (SIGCONT) runs after each test that froze it, and the harness thaws it
 * too when the suite ends.
 * @module
 */
import { readFileSync } from "node:fs";
import { type AddressInfo, type Socket, createServer as createTcpServer } from "node:net";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { createServer as createTlsServer } from "node:tls";

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

const frozen: number[] = [];

/** Stop the engine process (SIGSTOP): its sockets stay open, nothing answers. */
export function freezeEngine(): void {
  const pid = enginePid();
  process.kill(pid, "SIGSTOP");
  frozen.push(pid);
}

/** Let every engine `freezeEngine` stopped run again (SIGCONT). */
export function thawEngine(): void {
  for (const pid of frozen.splice(0)) process.kill(pid, "SIGCONT");
}

/** A file of the harness's test CA (`server.pem`, `other-ca.pem`, …). */
export function pkiFile(name: string): string {
  return join(env("BELAY_TEST_PKI_DIR"), name);
}

/**
 * An `https://` URL on 127.0.0.1 where no engine is: a TLS server with the
 * test CA's certificate (`tls`), or a server that answers a TLS client
 * with plain HTTP/1.1 bytes; `close` stops it.
 */
export async function listener(tls: boolean): Promise<{ url: string; close: () => Promise<void> }> {
  const sockets = new Set<Socket>();
  const server = tls
    ? createTlsServer({ cert: readFileSync(pkiFile("server.pem")), key: readFileSync(pkiFile("server-key.pem")), ALPNProtocols: ["h2"] })
    : createTcpServer((socket) => socket.end("HTTP/1.1 400 Bad Request\r\n\r\n"));
  server.on("connection", (socket: Socket) => {
    sockets.add(socket);
    socket.on("error", () => undefined); // the client gave up on us: what the test wants
    socket.on("close", () => sockets.delete(socket));
  });
  server.on("tlsClientError", () => undefined);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  const close = (): Promise<void> =>
    new Promise((resolve) => {
      for (const socket of sockets) socket.destroy();
      server.close(() => resolve());
    });
  return { url: `https://127.0.0.1:${port}`, close };
}

/**
 * An `http://` URL on 127.0.0.1 where a frozen engine is: connections are
 * accepted and read, nothing is ever answered (not even the HTTP/2
 * settings or a ping). `disconnected` resolves once every connection a
 * client made has closed; `close` stops the server.
 */
export async function silentServer(): Promise<{ url: string; disconnected: () => Promise<void>; close: () => Promise<void> }> {
  const sockets = new Set<Socket>();
  const closing: Promise<void>[] = [];
  const server = createTcpServer((socket) => {
    sockets.add(socket);
    socket.on("data", () => undefined);
    socket.on("error", () => undefined);
    closing.push(new Promise((resolve) => socket.on("close", () => resolve())));
    socket.on("close", () => sockets.delete(socket));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  const disconnected = async (): Promise<void> => {
    await Promise.all(closing);
  };
  const close = (): Promise<void> =>
    new Promise((resolve) => {
      for (const socket of sockets) socket.destroy();
      server.close(() => resolve());
    });
  return { url: `http://127.0.0.1:${port}`, disconnected, close };
}
