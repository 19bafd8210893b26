/**
 * How a client reaches an engine: the URL (`http://` plaintext or
 * `https://` TLS), the trust (a CA file or Node's roots), an optional
 * client certificate (mTLS), the API key, sent as `authorization:
 * Bearer <key>` with every call, as the Rust SDK does, and the HTTP/2
 * keepalive pings that find an engine that stopped answering.
 * @module
 */
import { readFileSync } from "node:fs";
import type { SecureClientSessionOptions } from "node:http2";

import type { Interceptor, Transport } from "@connectrpc/connect";
import { createGrpcTransport, type Http2SessionOptions } from "@connectrpc/connect-node";

import { ConfigError } from "./errors.js";
import { DEFAULT_RETRY, type RetryPolicy, checkRetry } from "./retry.js";
import { SessionManager } from "./sessions.js";

/** The engine the CLI and `belay dev` default to. */
export const DEFAULT_URL = "http://127.0.0.1:50051";

/** Milliseconds between HTTP/2 keepalive pings (`keepaliveMs`). */
export const DEFAULT_KEEPALIVE_MS = 30_000;

/** Milliseconds a keepalive ping may go unanswered before the connection is dropped (`keepaliveTimeoutMs`). */
export const DEFAULT_KEEPALIVE_TIMEOUT_MS = 10_000;

/**
 * Largest message the client sends or reads, bytes (64 MiB, as the Rust
 * SDK's `MAX_MESSAGE_BYTES` and the Python client; connect-node's default
 * is 4 GiB).
 */
export const MAX_MESSAGE_BYTES = 64 * 1024 * 1024;

/** Options of a client; see `BelayClient`. */
export interface ClientOptions {
  /** `http://host:port` or `https://host:port`; default `http://127.0.0.1:50051`. */
  url?: string;
  /** Sent as `authorization: Bearer <apiKey>`; none: no header. */
  apiKey?: string;
  /** The tenant to act for; empty: the key's only tenant. */
  tenant?: string;
  /** CA certificates (PEM file) the engine's certificate must chain to (https only). */
  caFile?: string;
  /** Client certificate (PEM file) for mTLS, with `clientKey` (https only). */
  clientCert?: string;
  /** Private key (PEM file) of `clientCert`. */
  clientKey?: string;
  /** Bound of each unary call in ms; default 30000. */
  timeoutMs?: number;
  /** How `UNAVAILABLE` is retried (a watch's reconnections too); default `DEFAULT_RETRY`. */
  retry?: RetryPolicy;
  /**
   * Milliseconds between HTTP/2 pings, default 30000; 0: none. Without
   * them a call or watch on an engine that froze (a stopped process, a
   * partitioned host: the TCP connection stays open, nothing answers)
   * hangs forever; with them it fails `UNAVAILABLE` (and is retried).
   */
  keepaliveMs?: number;
  /** Milliseconds a ping may go unanswered before the connection is dropped; default 10000. */
  keepaliveTimeoutMs?: number;
}

/** Options from the environment the CLI reads (`BELAY_ENGINE_URL`, `BELAY_API_KEY`, `BELAY_TENANT`, `BELAY_CA_FILE`, `BELAY_CLIENT_CERT`, `BELAY_CLIENT_KEY`). */
export function envOptions(env: NodeJS.ProcessEnv = process.env): ClientOptions {
  const options: ClientOptions = {};
  const set = (value: string | undefined, apply: (v: string) => void): void => {
    if (value) apply(value);
  };
  set(env.BELAY_ENGINE_URL, (v) => (options.url = v));
  set(env.BELAY_API_KEY, (v) => (options.apiKey = v));
  set(env.BELAY_TENANT, (v) => (options.tenant = v));
  set(env.BELAY_CA_FILE, (v) => (options.caFile = v));
  set(env.BELAY_CLIENT_CERT, (v) => (options.clientCert = v));
  set(env.BELAY_CLIENT_KEY, (v) => (options.clientKey = v));
  return options;
}

/** Options checked and filled in. */
export interface Resolved {
  transport: Transport;
  /** The HTTP/2 connection, closed by `BelayClient.close`. */
  sessions: SessionManager;
  tenant: string;
  timeoutMs: number;
  retry: RetryPolicy;
}

function read(path: string, what: string): Buffer {
  try {
    return readFileSync(path);
  } catch (e) {
    throw new ConfigError(`reading ${what} ${path}: ${(e as Error).message}`);
  }
}

function checkUrl(url: string): URL {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new ConfigError(`engine URL ${JSON.stringify(url)}: not a URL`);
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
    throw new ConfigError(`engine URL ${JSON.stringify(url)}: the scheme must be http:// or https://`);
  }
  if ((parsed.pathname !== "/" && parsed.pathname !== "") || parsed.search || parsed.hash) {
    throw new ConfigError(`engine URL ${JSON.stringify(url)}: a gRPC endpoint has no path, query or fragment`);
  }
  return parsed;
}

function tlsOptions(options: ClientOptions, url: string, tls: boolean): SecureClientSessionOptions {
  const given: [string | undefined, string][] = [
    [options.caFile, "caFile"],
    [options.clientCert, "clientCert"],
    [options.clientKey, "clientKey"],
  ];
  for (const [value, name] of given) {
    if (value !== undefined && !tls) {
      throw new ConfigError(
        `${name} is set, but the engine URL ${JSON.stringify(url)} is plaintext http://: use https:// to connect with TLS, or drop ${name}`,
      );
    }
  }
  if ((options.clientCert === undefined) !== (options.clientKey === undefined)) {
    throw new ConfigError("clientCert and clientKey go together: give both for mTLS, or neither");
  }
  const node: SecureClientSessionOptions = {};
  if (options.caFile !== undefined) node.ca = read(options.caFile, "the CA file");
  if (options.clientCert !== undefined) node.cert = read(options.clientCert, "the client certificate");
  if (options.clientKey !== undefined) node.key = read(options.clientKey, "the client key");
  return node;
}

/**
 * connect-node's ping options for `options`: pings while a stream is open,
 * however long no data flows (a watch of a run that waits for days); an
 * idle connection is checked with a ping before its next request once it
 * was unused for `keepaliveMs`. (Not `pingIdleConnection`: connect-node
 * 2.1 then arms a ping on a session `close()` destroyed, which throws.)
 * The engine (hyper's HTTP/2 server) answers every ping and sends no
 * `too_many_pings` GOAWAY.
 */
function keepalive(options: ClientOptions): Http2SessionOptions {
  const interval = options.keepaliveMs ?? DEFAULT_KEEPALIVE_MS;
  const timeout = options.keepaliveTimeoutMs ?? DEFAULT_KEEPALIVE_TIMEOUT_MS;
  if (!(interval >= 0) || !(timeout > 0)) {
    throw new ConfigError(`keepaliveMs must be >= 0 (0: no pings) and keepaliveTimeoutMs > 0, not ${interval} and ${timeout}`);
  }
  // Idle connections close after 30 s (connect-node's default is 15 min),
  // so a process that forgot `close()` still exits.
  const idle = { idleConnectionTimeoutMs: 30_000 };
  if (interval === 0) return idle;
  return { ...idle, pingIntervalMs: interval, pingTimeoutMs: timeout };
}

/** The bound of each unary call (`timeoutMs`) when it can work, else a `ConfigError` (connect takes 0 or less as no bound). */
function callTimeout(timeoutMs: number): number {
  if (!(timeoutMs > 0)) throw new ConfigError(`timeoutMs must be a positive number of milliseconds, not ${timeoutMs}`);
  return timeoutMs;
}

/** Check `options` and make the gRPC transport; ConfigError for options that cannot work. */
export function resolve(options: ClientOptions): Resolved {
  const url = options.url ?? DEFAULT_URL;
  const parsed = checkUrl(url);
  const timeoutMs = callTimeout(options.timeoutMs ?? 30_000);
  const retry = checkRetry(options.retry ?? DEFAULT_RETRY);
  const nodeOptions = tlsOptions(options, url, parsed.protocol === "https:");
  const interceptors: Interceptor[] = [];
  const apiKey = options.apiKey;
  if (apiKey) {
    interceptors.push((next) => (req) => {
      req.header.set("authorization", `Bearer ${apiKey}`);
      return next(req);
    });
  }
  const sessions = new SessionManager(parsed.origin, keepalive(options), nodeOptions);
  const transport = createGrpcTransport({
    baseUrl: parsed.origin,
    interceptors,
    sessionManager: sessions,
    readMaxBytes: MAX_MESSAGE_BYTES,
    writeMaxBytes: MAX_MESSAGE_BYTES,
  });
  return {
    transport,
    sessions,
    tenant: options.tenant ?? "",
    timeoutMs,
    retry,
  };
}
