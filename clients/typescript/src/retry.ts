/**
 * Retries of `UNAVAILABLE` (an engine restarting, a dropped connection)
 * with exponential backoff and full jitter, through `exponential-backoff`.
 * Only `UNAVAILABLE` is retried; every call the client retries is safe to
 * repeat (idempotency keys and signal ids are made once per call).
 * @module
 */
import { backOff } from "exponential-backoff";

import { BelayError, ConfigError, Unavailable } from "./errors.js";

/**
 * How long to keep trying while the engine is unavailable: `maxAttempts`
 * counts the first try; delays grow from `initialBackoffMs`, doubling, up
 * to `maxBackoffMs`; nothing more is tried after `maxElapsedMs` (default
 * 30000, as Python's `max_elapsed`). `{maxAttempts: 1}` disables retries.
 * A watch applies the policy to its reconnections, counting from its first
 * failure since its last event: at most `maxAttempts` streams, none opened
 * after `maxElapsedMs`. Values that cannot work (no attempt, a negative
 * delay) are a `ConfigError` when the client is made.
 */
export interface RetryPolicy {
  maxAttempts: number;
  initialBackoffMs: number;
  maxBackoffMs: number;
  maxElapsedMs?: number;
}

/**
 * The default policy: 100 ms doubling to 2 s, for 30 s (`maxAttempts` is
 * high enough that `maxElapsedMs` decides: an engine restart of up to 30 s
 * is ridden out).
 */
export const DEFAULT_RETRY: RetryPolicy = { maxAttempts: 100, initialBackoffMs: 100, maxBackoffMs: 2000, maxElapsedMs: 30_000 };

function maxElapsedMs(policy: RetryPolicy): number {
  return policy.maxElapsedMs ?? 30_000;
}

/** `policy` when it can work, else a `ConfigError` naming what is wrong (the words of Python's `RetryPolicy`). */
export function checkRetry(policy: RetryPolicy): RetryPolicy {
  if (!Number.isInteger(policy.maxAttempts) || policy.maxAttempts < 1) {
    throw new ConfigError(`RetryPolicy.maxAttempts must be at least 1, not ${policy.maxAttempts}`);
  }
  if (!(policy.initialBackoffMs >= 0 && policy.maxBackoffMs >= policy.initialBackoffMs)) {
    throw new ConfigError("RetryPolicy needs 0 <= initialBackoffMs <= maxBackoffMs");
  }
  if (!(maxElapsedMs(policy) >= 0)) {
    throw new ConfigError(`RetryPolicy.maxElapsedMs must not be negative, not ${maxElapsedMs(policy)}`);
  }
  return policy;
}

/** Run `call`, retrying `Unavailable` as `policy` says. */
export function withRetries<T>(policy: RetryPolicy, call: () => Promise<T>): Promise<T> {
  const started = Date.now();
  return backOff(call, {
    numOfAttempts: policy.maxAttempts,
    startingDelay: policy.initialBackoffMs,
    maxDelay: policy.maxBackoffMs,
    timeMultiple: 2,
    jitter: "full",
    retry: (e: unknown) => e instanceof Unavailable && Date.now() - started < maxElapsedMs(policy),
  });
}

/** Milliseconds a watch waits after its `failures`-th consecutive failure (from 1). */
export function delayMs(policy: RetryPolicy, failures: number): number {
  const base = Math.min(policy.maxBackoffMs, policy.initialBackoffMs * 2 ** Math.max(failures - 1, 0));
  return base / 2 + Math.random() * (base / 2);
}

/**
 * The failures of a watch in a row since its last event, bounded by the
 * policy as a unary call's attempts are (so a frozen engine that accepts
 * connections but never answers ends the watch in bounded time instead of
 * keeping it reconnecting).
 */
export class Reconnects {
  #failures = 0;
  #since: number | undefined;

  constructor(
    private readonly policy: RetryPolicy,
    private readonly runId: string,
    private readonly method: string,
  ) {}

  /** An event arrived: the next failure starts a new streak. */
  progressed(): void {
    this.#failures = 0;
    this.#since = undefined;
  }

  /** Count `error`; the ms to wait before reconnecting, or throw `error` when it is not `Unavailable` or the policy is spent. */
  failed(error: BelayError): number {
    this.#count();
    if (!(error instanceof Unavailable) || this.#spent()) throw error;
    return this.#delay();
  }

  /** Count a stream that ended without an event while the run goes on; the delay, or `Unavailable` once the policy is spent. */
  endedEmpty(): number {
    this.#count();
    if (this.#spent()) {
      throw new Unavailable(14, `watching run ${this.runId}: the stream ended ${this.#failures} times in a row without an event`, this.method);
    }
    return this.#delay();
  }

  #count(): void {
    this.#failures += 1;
    this.#since ??= Date.now();
  }

  #elapsed(): number {
    return this.#since === undefined ? 0 : Date.now() - this.#since;
  }

  #spent(): boolean {
    return this.#failures >= this.policy.maxAttempts || this.#elapsed() >= maxElapsedMs(this.policy);
  }

  /** The backoff, never past the end of `maxElapsedMs`. */
  #delay(): number {
    return Math.max(0, Math.min(delayMs(this.policy, this.#failures), maxElapsedMs(this.policy) - this.#elapsed()));
  }
}
