"""What the sync and the asyncio client share: their options, checked once
(:func:`belay_client._options.endpoint`), the channel each opens from them
(its own kind: ``grpc`` or ``grpc.aio``), and :meth:`ClientBase.from_env`."""

from __future__ import annotations

import os
from typing import Any, Generic, TypeVar

from ._options import (
    DEFAULT_KEEPALIVE_TIME,
    DEFAULT_KEEPALIVE_TIMEOUT,
    DEFAULT_URL,
    Endpoint,
    call_timeout,
    endpoint,
    env_options,
)
from ._retry import RetryPolicy

ChannelT = TypeVar("ChannelT")
Self = TypeVar("Self", bound="ClientBase[Any]")
PathLike = str | os.PathLike[str]


class ClientBase(Generic[ChannelT]):
    """The options of a client (documented on :class:`belay_client.Client`)
    and the channel it opens with them."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        api_key: str | None = None,
        tenant: str = "",
        ca_file: PathLike | None = None,
        client_cert: PathLike | None = None,
        client_key: PathLike | None = None,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        keepalive_time: float = DEFAULT_KEEPALIVE_TIME,
        keepalive_timeout: float = DEFAULT_KEEPALIVE_TIMEOUT,
    ) -> None:
        self._timeout = call_timeout(timeout)
        self._endpoint = endpoint(
            url,
            api_key=api_key,
            ca_file=ca_file,
            client_cert=client_cert,
            client_key=client_key,
            keepalive_time=keepalive_time,
            keepalive_timeout=keepalive_timeout,
        )
        self._channel: ChannelT = self._open(self._endpoint)
        self.tenant = tenant
        self._retry = retry or RetryPolicy()

    def _open(self, e: Endpoint) -> ChannelT:
        """The channel to ``e`` (plaintext when it has no credentials)."""
        raise NotImplementedError

    @classmethod
    def from_env(cls: type[Self], **overrides: Any) -> Self:
        """A client configured as the CLI is: ``BELAY_ENGINE_URL``,
        ``BELAY_API_KEY``, ``BELAY_TENANT``, ``BELAY_CA_FILE``,
        ``BELAY_CLIENT_CERT``, ``BELAY_CLIENT_KEY``; ``overrides`` win."""
        return cls(**{**env_options(), **overrides})
