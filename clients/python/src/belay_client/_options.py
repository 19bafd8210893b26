"""How a client reaches an engine: the URL (``http://`` plaintext or
``https://`` TLS), the trust (a CA file or the system's roots), an optional
client certificate (mTLS) and the API key, sent as ``authorization: Bearer
<key>`` with every call, as the Rust SDK does (``belay_proto::connect``)."""

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

# Reconnect quickly after an engine restart (gRPC's default backoff starts
# at 1 s and grows to 120 s); the retry policy bounds how long calls wait.
_CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.enable_retries", 0),  # retries are the client's (RetryPolicy), not the channel's
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


def endpoint(
    url: str,
    *,
    api_key: str | None = None,
    ca_file: str | os.PathLike[str] | None = None,
    client_cert: str | os.PathLike[str] | None = None,
    client_key: str | os.PathLike[str] | None = None,
) -> Endpoint:
    """Parse and check the options of a client.

    Raises :class:`ConfigError` for a URL that is not ``http(s)://host[:port]``,
    a TLS file with an ``http://`` URL, a certificate without its key (or the
    reverse), or a file that cannot be read.
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
    return Endpoint(target, credentials, metadata, list(_CHANNEL_OPTIONS))


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
