"""Retries of ``UNAVAILABLE`` (an engine restarting, a deploy, a dropped
connection) with exponential backoff and jitter, through tenacity. Only
``UNAVAILABLE`` is retried: every other code is an answer. Every call the
client retries is safe to repeat (idempotency keys and signal ids are made
once per call, before the first attempt)."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import tenacity

from ._errors import BelayError, ConfigError, Unavailable


@dataclass(frozen=True)
class RetryPolicy:
    """How long to keep trying while the engine is unavailable.

    ``max_attempts`` counts the first try; delays grow from
    ``initial_backoff`` seconds, doubling, up to ``max_backoff`` seconds
    (each with random jitter of up to ``initial_backoff``); nothing more is tried after ``max_elapsed``
    seconds. ``RetryPolicy(max_attempts=1)`` disables retries. A watch
    applies the policy to its reconnections, counting from its first
    failure since its last event: at most ``max_attempts`` streams, none
    opened after ``max_elapsed`` seconds. Values that cannot work (no
    attempt, a negative delay) raise :class:`ConfigError`.
    """

    # High enough that ``max_elapsed`` decides: an engine restart of up to
    # 30 s is ridden out (12 attempts gave up after about 11 s).
    max_attempts: int = 100
    initial_backoff: float = 0.1
    max_backoff: float = 2.0
    max_elapsed: float = 30.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError(f"RetryPolicy.max_attempts must be at least 1, not {self.max_attempts}")
        if self.initial_backoff < 0 or self.max_backoff < self.initial_backoff:
            raise ConfigError("RetryPolicy needs 0 <= initial_backoff <= max_backoff")
        if self.max_elapsed < 0:
            raise ConfigError(f"RetryPolicy.max_elapsed must not be negative, not {self.max_elapsed}")

    def delay(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th consecutive failure (from 1)."""
        base = min(self.max_backoff, self.initial_backoff * 2.0 ** max(failures - 1, 0))
        return base / 2 + random.uniform(0, base / 2)

    def _kwargs(self) -> dict[str, object]:
        return {
            "stop": tenacity.stop_after_attempt(self.max_attempts) | tenacity.stop_after_delay(self.max_elapsed),
            # initial_backoff * 2**n plus up to initial_backoff of jitter, capped.
            "wait": tenacity.wait_exponential_jitter(
                multiplier=self.initial_backoff, max=self.max_backoff, jitter=self.initial_backoff
            ),
            "retry": tenacity.retry_if_exception(_is_unavailable),
            "reraise": True,
        }

    def retrying(self) -> tenacity.Retrying:
        """A tenacity controller for one synchronous call."""
        return tenacity.Retrying(**self._kwargs())  # type: ignore[arg-type]

    def async_retrying(self) -> tenacity.AsyncRetrying:
        """A tenacity controller for one asyncio call."""
        return tenacity.AsyncRetrying(**self._kwargs())  # type: ignore[arg-type]


def _is_unavailable(error: BaseException) -> bool:
    return isinstance(error, Unavailable)


class Reconnects:
    """The failures of a watch in a row since its last event, bounded by the
    policy as a unary call's attempts are: at most ``max_attempts`` streams
    opened, and none after ``max_elapsed`` seconds since the first failure
    (so a frozen engine that accepts connections but never answers ends
    the watch in bounded time instead of keeping it reconnecting)."""

    def __init__(self, policy: RetryPolicy, run_id: str, method: str) -> None:
        self._policy = policy
        self._run_id = run_id
        self._method = method
        self._failures = 0
        self._since: float | None = None

    def progressed(self) -> None:
        """An event arrived: the next failure starts a new streak."""
        self._failures, self._since = 0, None

    def failed(self, error: BelayError) -> float:
        """Count ``error``; the seconds to wait before reconnecting, or raise
        ``error`` when it is not ``UNAVAILABLE`` or the policy is spent."""
        self._count()
        if not isinstance(error, Unavailable) or self._spent():
            raise error
        return self._delay()

    def ended_empty(self) -> float:
        """Count a stream that ended without an event while the run goes on
        (an engine that keeps stopping); the delay, or ``Unavailable`` once
        the policy is spent."""
        self._count()
        if self._spent():
            raise Unavailable(
                f"watching run {self._run_id}: the stream ended {self._failures} times in a row without an event",
                method=self._method,
            )
        return self._delay()

    def _count(self) -> None:
        self._failures += 1
        if self._since is None:
            self._since = time.monotonic()

    def _elapsed(self) -> float:
        return 0.0 if self._since is None else time.monotonic() - self._since

    def _spent(self) -> bool:
        return self._failures >= self._policy.max_attempts or self._elapsed() >= self._policy.max_elapsed

    def _delay(self) -> float:
        """The backoff, never past the end of ``max_elapsed``."""
        return max(0.0, min(self._policy.delay(self._failures), self._policy.max_elapsed - self._elapsed()))
