"""How the clients end when the engine cannot answer: a watch on an engine
that froze (keepalive pings), a watch whose reconnections outlast the
retry policy's ``max_elapsed``, and TLS handshakes that fail."""

from __future__ import annotations

import time
import uuid

import grpc
import pytest

from belay_client import AsyncClient, Client, RetryPolicy, RunEvent, Unavailable

from conftest import GRANTS, Freezer, listener, pki_file

#: Many attempts, so only ``max_elapsed`` can end the reconnections early.
BOUNDED = RetryPolicy(max_attempts=1000, initial_backoff=0.05, max_backoff=0.2, max_elapsed=2.0)

#: The bound the tests hold a frozen engine's watch to: keepalive (1 s + 1 s),
#: then ``max_elapsed`` (2 s) of reconnections, with room for a slow machine;
#: far below grpcio's 60 s ping timeout and gRPC's forever.
FROZEN_BOUND = 30.0


def customer(tag: str) -> dict[str, str]:
    return {"email": f"{tag}-{uuid.uuid4().hex[:8]}@example.com", "name": "Ada Lovelace"}


class FreezeOnWait:
    """Freezes the engine at a watch's ``wait_started`` (the run then waits
    for a signal: nothing else goes on) and times how long the watch takes
    to end after that."""

    def __init__(self, freezer: Freezer) -> None:
        self._freezer = freezer
        self._frozen_at: float | None = None

    def saw(self, event: RunEvent) -> None:
        """Freeze the engine at the first ``wait_started``."""
        if event.kind == "wait_started" and self._frozen_at is None:
            self._freezer.freeze()
            self._frozen_at = time.monotonic()

    def ended(self, error: BaseException) -> None:
        """The watch ended with ``error``: thaw the engine, check the end was typed and bounded."""
        took = None if self._frozen_at is None else time.monotonic() - self._frozen_at
        self._freezer.thaw()
        assert took is not None, f"the engine was never frozen; the watch ended with {error!r}"
        assert took < FROZEN_BOUND, f"the watch ended {took:.1f} s after the engine froze"
        assert isinstance(error, Unavailable) and error.code == grpc.StatusCode.UNAVAILABLE, repr(error)
        assert error.method == "belay.v1.RunService/WatchRun"


def test_a_watch_on_a_frozen_engine_ends_unavailable(client: Client, freezer: Freezer) -> None:
    run = client.start_run("onboarding", customer("frozen"), caller_grants=GRANTS).run
    freeze = FreezeOnWait(freezer)
    with Client.from_env(retry=BOUNDED, keepalive_time=1.0, keepalive_timeout=1.0) as watcher:
        with pytest.raises(Unavailable) as ended:
            # The overall timeout only keeps a broken client from hanging the suite.
            for event in watcher.watch(run.run_id, timeout=120):
                freeze.saw(event)
    freeze.ended(ended.value)
    assert client.cancel(run.run_id).status == "cancelled"  # the thawed engine answers again


async def test_an_async_watch_on_a_frozen_engine_ends_unavailable(aclient: AsyncClient, freezer: Freezer) -> None:
    run = (await aclient.start_run("onboarding", customer("afrozen"), caller_grants=GRANTS)).run
    freeze = FreezeOnWait(freezer)
    async with AsyncClient.from_env(retry=BOUNDED, keepalive_time=1.0, keepalive_timeout=1.0) as watcher:
        with pytest.raises(Unavailable) as ended:
            async for event in watcher.watch(run.run_id, timeout=120):
                freeze.saw(event)
    freeze.ended(ended.value)
    assert (await aclient.cancel(run.run_id)).status == "cancelled"


def test_a_watch_stops_reconnecting_after_max_elapsed() -> None:
    started = time.monotonic()
    with Client("http://127.0.0.1:1", retry=BOUNDED) as nowhere:
        with pytest.raises(Unavailable) as ended:
            for _ in nowhere.watch("run-1"):
                pass
    took = time.monotonic() - started
    # 1000 attempts would take minutes; max_elapsed (2 s) ends them.
    assert BOUNDED.max_elapsed <= took < 15, took
    assert ended.value.method == "belay.v1.RunService/WatchRun"


async def test_an_async_watch_stops_reconnecting_after_max_elapsed() -> None:
    started = time.monotonic()
    async with AsyncClient("http://127.0.0.1:1", retry=BOUNDED) as nowhere:
        with pytest.raises(Unavailable):
            async for _ in nowhere.watch("run-1"):
                pass
    assert BOUNDED.max_elapsed <= time.monotonic() - started < 15


@pytest.mark.parametrize("tls", [True, False], ids=["untrusted certificate", "not TLS"])
def test_a_failed_tls_handshake_is_unavailable(tls: bool) -> None:
    with listener(tls) as url:
        with Client(url, ca_file=pki_file("other-ca.pem"), retry=RetryPolicy(max_attempts=1)) as belay:
            with pytest.raises(Unavailable) as refused:
                belay.get_run("run-1")
    assert refused.value.code == grpc.StatusCode.UNAVAILABLE
    assert refused.value.method == "belay.v1.RunService/GetRun"
