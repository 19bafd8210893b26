"""Fixtures of the client suite. It runs against a real engine and worker
that ``tests/tests/clients.rs`` starts (on PostgreSQL or SQLite) and
describes in the environment:

- ``BELAY_ENGINE_URL``, ``BELAY_API_KEY`` (an admin), ``BELAY_TENANT``;
- ``BELAY_TEST_CLIENT_KEY``: a key of role ``client`` for the tenant;
- ``BELAY_TEST_ENGINE_PID_FILE``: the engine's pid; when the suite kills
  the engine, the harness starts it again on the same port and writes the
  new pid there;
- ``BELAY_TEST_DEFINITIONS``: the onboarding example's definitions.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from belay_client import AsyncClient, Client, RetryPolicy

#: Patient enough to ride out an engine restart.
PATIENT = RetryPolicy(max_attempts=60, initial_backoff=0.05, max_backoff=1.0, max_elapsed=60.0)

GRANTS = ["crm.read", "crm.write", "email.send"]


def env(name: str) -> str:
    """A variable the harness sets, or a failure saying how to run the suite."""
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: run this suite through `cargo nextest run --test clients`")
    return value


def engine_pid() -> int:
    """The running engine's pid."""
    return int(Path(env("BELAY_TEST_ENGINE_PID_FILE")).read_text().strip())


def kill_engine() -> int:
    """SIGKILL the engine (the harness restarts it); returns the killed pid."""
    pid = engine_pid()
    os.kill(pid, signal.SIGKILL)
    return pid


def wait_for_new_engine(old_pid: int, timeout: float = 60.0) -> int:
    """The pid of the engine the harness started after ``old_pid`` died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pid = engine_pid()
        except ValueError:  # the harness is writing the file
            pid = old_pid
        if pid != old_pid:
            return pid
        time.sleep(0.05)
    raise AssertionError(f"no engine replaced pid {old_pid} within {timeout} s")


@pytest.fixture
def client() -> Iterator[Client]:
    """A sync client as the admin of the test tenant."""
    with Client.from_env(retry=PATIENT) as c:
        yield c


@pytest.fixture
async def aclient() -> AsyncIterator[AsyncClient]:
    """An asyncio client as the admin of the test tenant."""
    async with AsyncClient.from_env(retry=PATIENT) as c:
        yield c


@pytest.fixture
def definitions() -> Path:
    """The onboarding example's definitions directory."""
    return Path(env("BELAY_TEST_DEFINITIONS"))
