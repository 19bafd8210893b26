/**
 * How a client reaches an engine: the URL (`http://` plaintext or
 * `https://` TLS), the trust (a CA file or Node's roots), an optional
 * client certificate (mTLS) and the API key, sent as `authorization:
 * Bearer <key>` with every call, as the Rust SDK does.
 * @module
 */
import { readFileSync } from "node:fs";
import type { SecureClientSessionOptions } from "node:http2";

import type { Interceptor, Transport } from "@connectrpc/connect";
import { Http2SessionManager, createGrpcTransport } from "@connectrpc/connect-node";

import { ConfigError } from "./errors.js";
import { DEFAULT_RETRY, type RetryPolicy } from "./retry.js";

/** The engine the CLI and `belay dev` default to. */
export const DEFAULT_URL = "http://127.0.0.1:50051";

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
  /** How `UNAVAILABLE` is retried; default `DEFAULT_RETRY`. */
  retry?: RetryPolicy;
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
  sessions: Http2SessionManager;
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

/** Check `options` and make the gRPC transport; ConfigError for options that cannot work. */
export function resolve(options: ClientOptions): Resolved {
  const url = options.url ?? DEFAULT_URL;
  const parsed = checkUrl(url);
  const nodeOptions = tlsOptions(options, url, parsed.protocol === "https:");
  const interceptors: Interceptor[] = [];
  const apiKey = options.apiKey;
  if (apiKey) {
    interceptors.push((next) => (req) => {
      req.header.set("authorization", `Bearer ${apiKey}`);
      return next(req);
    });
  }
  // Idle connections close after 30 s (connect-node's default is 15 min),
  // so a process that forgot `close()` still exits.
  const sessions = new Http2SessionManager(parsed.origin, { idleConnectionTimeoutMs: 30_000 }, nodeOptions);
  const transport = createGrpcTransport({ baseUrl: parsed.origin, interceptors, sessionManager: sessions });
  return {
    transport,
    sessions,
    tenant: options.tenant ?? "",
    timeoutMs: options.timeoutMs ?? 30_000,
    retry: options.retry ?? DEFAULT_RETRY,
  };
}
