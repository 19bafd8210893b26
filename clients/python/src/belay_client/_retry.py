"""Retries of ``UNAVAILABLE`` (an engine restarting, a deploy, a dropped
connection) with exponential backoff and jitter, through tenacity. Only
``UNAVAILABLE`` is retried: every other code is an answer. Every call the
client retries is safe to repeat (idempotency keys and signal ids are made
once per call, before the first attempt)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import tenacity

from ._errors import BelayError, Unavailable


@dataclass(frozen=True)
class RetryPolicy:
    """How long to keep trying while the engine is unavailable.

    ``max_attempts`` counts the first try; delays grow from
    ``initial_backoff`` seconds, doubling, up to ``max_backoff`` seconds
    (each with random jitter of up to ``initial_backoff``); nothing more is tried after ``max_elapsed``
    seconds. ``RetryPolicy(max_attempts=1)`` disables retries. A watch
    applies the policy to each reconnection, counting from its last event.
    """

    max_attempts: int = 12
    initial_backoff: float = 0.1
    max_backoff: float = 2.0
    max_elapsed: float = 30.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"RetryPolicy.max_attempts must be at least 1, not {self.max_attempts}")
        if self.initial_backoff < 0 or self.max_backoff < self.initial_backoff:
            raise ValueError("RetryPolicy needs 0 <= initial_backoff <= max_backoff")

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


def should_resume(error: BelayError, failures: int, policy: RetryPolicy) -> bool:
    """Whether a watch reconnects after ``error``, its ``failures``-th in a row."""
    return isinstance(error, Unavailable) and failures < policy.max_attempts


def check_empty_ends(run_id: str, failures: int, policy: RetryPolicy) -> None:
    """Raise ``Unavailable`` when a watch's stream ended ``failures`` times in a
    row with no event while the run goes on (an engine that keeps stopping)."""
    if failures >= policy.max_attempts:
        raise Unavailable(
            f"watching run {run_id}: the stream ended {failures} times in a row without an event",
            method="/belay.v1.RunService/WatchRun",
        )
