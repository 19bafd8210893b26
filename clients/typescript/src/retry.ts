/**
 * Retries of `UNAVAILABLE` (an engine restarting, a dropped connection)
 * with exponential backoff and full jitter, through `exponential-backoff`.
 * Only `UNAVAILABLE` is retried; every call the client retries is safe to
 * repeat (idempotency keys and signal ids are made once per call).
 * @module
 */
import { backOff } from "exponential-backoff";

import { BelayError, Unavailable } from "./errors.js";

/**
 * How long to keep trying while the engine is unavailable: `maxAttempts`
 * counts the first try; delays grow from `initialBackoffMs`, doubling, up
 * to `maxBackoffMs`. `{maxAttempts: 1}` disables retries. A watch applies
 * the policy to each reconnection, counting from its last event.
 */
export interface RetryPolicy {
  maxAttempts: number;
  initialBackoffMs: number;
  maxBackoffMs: number;
}

/** The default policy: 12 attempts, 100 ms doubling to 2 s. */
export const DEFAULT_RETRY: RetryPolicy = { maxAttempts: 12, initialBackoffMs: 100, maxBackoffMs: 2000 };

/** Run `call`, retrying `Unavailable` as `policy` says. */
export function withRetries<T>(policy: RetryPolicy, call: () => Promise<T>): Promise<T> {
  return backOff(call, {
    numOfAttempts: policy.maxAttempts,
    startingDelay: policy.initialBackoffMs,
    maxDelay: policy.maxBackoffMs,
    timeMultiple: 2,
    jitter: "full",
    retry: (e: unknown) => e instanceof Unavailable,
  });
}

/** Milliseconds a watch waits after its `failures`-th consecutive failure (from 1). */
export function delayMs(policy: RetryPolicy, failures: number): number {
  const base = Math.min(policy.maxBackoffMs, policy.initialBackoffMs * 2 ** Math.max(failures - 1, 0));
  return base / 2 + Math.random() * (base / 2);
}

/** Whether a watch reconnects after `error`, its `failures`-th in a row. */
export function shouldResume(error: BelayError, failures: number, policy: RetryPolicy): boolean {
  return error instanceof Unavailable && failures < policy.maxAttempts;
}
