"""Fixtures of the client suite. It runs against a real engine and worker
that ``tests/tests/clients.rs`` starts (on PostgreSQL or SQLite) and
describes in the environment:

- ``BELAY_ENGINE_URL``, ``BELAY_API_KEY`` (an admin), ``BELAY_TENANT``;
- ``BELAY_TEST_CLIENT_KEY``: a key of role ``client`` for the tenant;
- ``BELAY_TEST_ENGINE_PID_FILE``: the engine's pid; when the suite kills
  the engine, the harness starts it again on the same port and writes the
  new pid there;
- ``BELAY_TEST_DEFINITIONS``: the onboarding example's definitions;
- ``BELAY_TEST_PKI_DIR``: a test CA's files (``server.pem``,
  ``server-key.pem`` for 127.0.0.1, ``other-ca.pem``: a CA that issued
  none of them), for the TLS listeners the suite starts itself.

A test may freeze the engine (SIGSTOP: its connections stay open and
nothing answers) through the ``freezer`` fixture, which thaws it
(SIGCONT) when the test ends; the harness thaws it too when the suite ends.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
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


class Freezer:
    """Freezes the engine (SIGSTOP) and thaws it (SIGCONT)."""

    def __init__(self) -> None:
        self._frozen: list[int] = []

    def freeze(self) -> None:
        """Stop the engine process: its sockets stay open, nothing answers."""
        pid = engine_pid()
        os.kill(pid, signal.SIGSTOP)
        self._frozen.append(pid)

    def thaw(self) -> None:
        """Let every engine this froze run again."""
        while self._frozen:
            os.kill(self._frozen.pop(), signal.SIGCONT)


@pytest.fixture
def freezer() -> Iterator[Freezer]:
    """A :class:`Freezer` whose engine is thawed when the test ends, whatever happened."""
    f = Freezer()
    try:
        yield f
    finally:
        f.thaw()


def pki_file(name: str) -> Path:
    """A file of the harness's test CA (``server.pem``, ``other-ca.pem``, …)."""
    return Path(env("BELAY_TEST_PKI_DIR")) / name


def _answer(conn: socket.socket, tls: ssl.SSLContext | None) -> None:
    """One connection: a TLS handshake the client refuses, or bytes that are not TLS."""
    with conn:
        if tls is None:
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            return
        try:
            tls.wrap_socket(conn, server_side=True).close()
        except (ssl.SSLError, OSError):
            pass  # the client gave up on our certificate: what the test wants


@contextmanager
def listener(tls: bool) -> Iterator[str]:
    """An ``https://`` URL on 127.0.0.1 where no engine is: a TLS server with
    the test CA's certificate (``tls``), or a server that answers a TLS
    client with plain HTTP/1.1 bytes."""
    context = None
    if tls:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pki_file("server.pem"), pki_file("server-key.pem"))
        context.set_alpn_protocols(["h2"])
    sock = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:  # closed: the test is over
                return
            _answer(conn, context)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        thread.join(timeout=10)
