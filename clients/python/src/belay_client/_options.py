"""How a client reaches an engine: the URL (``http://`` plaintext or
``https://`` TLS), the trust (a CA file or the system's roots), an optional
client certificate (mTLS), the API key, sent as ``authorization: Bearer
<key>`` with every call, as the Rust SDK does (``belay_proto::connect``),
and the HTTP/2 keepalive pings that find an engine that stopped answering."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc

from ._errors import ConfigError

#: The engine the CLI and ``belay dev`` default to.
DEFAULT_URL = "http://127.0.0.1:50051"

#: Seconds between HTTP/2 keepalive pings (``keepalive_time``).
DEFAULT_KEEPALIVE_TIME = 30.0

#: Seconds a keepalive ping may go unanswered before the connection is
#: dropped and its calls (an open watch too) fail ``UNAVAILABLE``.
DEFAULT_KEEPALIVE_TIMEOUT = 10.0

#: Largest message the client sends or reads, bytes (64 MiB, as the Rust
#: SDK's ``MAX_MESSAGE_BYTES``): grpcio reads 4 MiB by default, less than a
#: page of runs whose inputs (up to 4 MiB each) the engine accepted.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

# Reconnect quickly after an engine restart (gRPC's default backoff starts
# at 1 s and grows to 120 s); the retry policy bounds how long calls wait.
_CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.enable_retries", 0),  # retries are the client's (RetryPolicy), not the channel's
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]


@dataclass(frozen=True)
class Endpoint:
    """A parsed engine address: the gRPC target, its credentials (``None``
    for plaintext), the metadata every call carries, the channel options."""

    target: str
    credentials: grpc.ChannelCredentials | None
    metadata: tuple[tuple[str, str], ...] = field(repr=False)
    options: list[tuple[str, Any]]


def _read(path: str | os.PathLike[str] | None, what: str) -> bytes | None:
    """The bytes of an optional PEM file, or a ConfigError naming it."""
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"reading {what} {path}: {e.strerror or e}") from None


def _target(url: str) -> tuple[str, bool]:
    """``host:port`` of ``url`` and whether it is TLS."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ConfigError(f"engine URL {url!r}: the scheme must be http:// or https://")
    if not parts.hostname:
        raise ConfigError(f"engine URL {url!r}: no host")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ConfigError(f"engine URL {url!r}: a gRPC endpoint has no path, query or fragment")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as e:
        raise ConfigError(f"engine URL {url!r}: {e}") from None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{port}", parts.scheme == "https"


def keepalive_options(time: float, timeout: float) -> list[tuple[str, Any]]:
    """gRPC's channel arguments for a ping every ``time`` seconds, answered
    within ``timeout`` seconds (``time`` 0: no pings).

    Without them a connection to an engine that froze (a stopped process,
    a partitioned host: the TCP connection stays open, nothing answers)
    holds a watch forever. The pings go on while no call is open and while
    no data flows (a watch of a run that waits for days), which gRPC's
    defaults would stop after two; the engine (hyper's HTTP/2 server)
    answers every ping and sends no ``too_many_pings`` GOAWAY.
    """
    if time < 0 or timeout <= 0:
        raise ConfigError(
            f"keepalive_time must be >= 0 (0: no pings) and keepalive_timeout > 0, not {time} and {timeout}"
        )
    if time == 0:
        return []
    return [
        ("grpc.keepalive_time_ms", max(1, round(time * 1000))),
        ("grpc.keepalive_timeout_ms", max(1, round(timeout * 1000))),
        # grpcio (1.85) times a keepalive ping out by this one (60 s by
        # default), not by keepalive_timeout_ms: without it a frozen engine
        # is found after a minute, whatever the timeout says.
        ("grpc.http2.ping_timeout_ms", max(1, round(timeout * 1000))),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]


def call_timeout(timeout: float) -> float:
    """``timeout`` (seconds, the bound of each unary call) when it can work,
    else a :class:`ConfigError` (0 or less would fail every call at once)."""
    if not timeout > 0:  # also NaN
        raise ConfigError(f"timeout must be a positive number of seconds, not {timeout}")
    return timeout


def endpoint(
    url: str,
    *,
    api_key: str | None = None,
    ca_file: str | os.PathLike[str] | None = None,
    client_cert: str | os.PathLike[str] | None = None,
    client_key: str | os.PathLike[str] | None = None,
    keepalive_time: float = DEFAULT_KEEPALIVE_TIME,
    keepalive_timeout: float = DEFAULT_KEEPALIVE_TIMEOUT,
) -> Endpoint:
    """Parse and check the options of a client.

    Raises :class:`ConfigError` for a URL that is not ``http(s)://host[:port]``,
    a TLS file with an ``http://`` URL, a certificate without its key (or the
    reverse), a file that cannot be read, or a negative keepalive.
    """
    target, tls = _target(url)
    if not tls:
        for value, option in ((ca_file, "ca_file"), (client_cert, "client_cert"), (client_key, "client_key")):
            if value is not None:
                raise ConfigError(
                    f"{option} is set, but the engine URL {url!r} is plaintext http://: "
                    f"use https:// to connect with TLS, or drop {option}"
                )
    if (client_cert is None) != (client_key is None):
        raise ConfigError("client_cert and client_key go together: give both for mTLS, or neither")
    credentials = None
    if tls:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read(ca_file, "the CA file"),
            private_key=_read(client_key, "the client key"),
            certificate_chain=_read(client_cert, "the client certificate"),
        )
    metadata: tuple[tuple[str, str], ...] = ()
    if api_key:
        metadata = (("authorization", f"Bearer {api_key}"),)
    options = _CHANNEL_OPTIONS + keepalive_options(keepalive_time, keepalive_timeout)
    return Endpoint(target, credentials, metadata, options)


def env_options() -> dict[str, Any]:
    """Client options from the environment the CLI reads: ``BELAY_ENGINE_URL``,
    ``BELAY_API_KEY``, ``BELAY_TENANT``, ``BELAY_CA_FILE``, ``BELAY_CLIENT_CERT``,
    ``BELAY_CLIENT_KEY`` (unset ones are left out)."""
    names = {
        "url": "BELAY_ENGINE_URL",
        "api_key": "BELAY_API_KEY",
        "tenant": "BELAY_TENANT",
        "ca_file": "BELAY_CA_FILE",
        "client_cert": "BELAY_CLIENT_CERT",
        "client_key": "BELAY_CLIENT_KEY",
    }
    return {option: os.environ[var] for option, var in names.items() if os.environ.get(var)}
