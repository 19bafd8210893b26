"""Errors of the client: one exception class per gRPC status code an engine
answers with, each carrying the code and Belay's message, and the local
errors (bad options, a wait that timed out)."""

from __future__ import annotations

import grpc


class BelayError(Exception):
    """A call the engine refused or could not serve.

    ``code`` is the gRPC status code, ``message`` the engine's message (it
    names what is wrong: the run, the field, the missing grant), ``method``
    the RPC as ``<package>.<Service>/<Method>``
    (``belay.v1.RunService/StartRun``, the form of the engine's trace spans
    and of the TypeScript client).
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, *, code: grpc.StatusCode | None = None, method: str = "") -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.method = method

    def __str__(self) -> str:
        where = f" ({self.method})" if self.method else ""
        return f"{self.code.name}{where}: {self.message}"


class InvalidArgument(BelayError):
    """``INVALID_ARGUMENT``: bad input (a schema mismatch, an unknown node)."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(BelayError):
    """``NOT_FOUND``: no such run or workflow for this tenant."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(BelayError):
    """``ALREADY_EXISTS``."""

    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(BelayError):
    """``PERMISSION_DENIED``: the key's role, tenants or grants do not admit the call."""

    code = grpc.StatusCode.PERMISSION_DENIED


class Unauthenticated(BelayError):
    """``UNAUTHENTICATED``: no key, or a malformed, revoked or expired one."""

    code = grpc.StatusCode.UNAUTHENTICATED


class FailedPrecondition(BelayError):
    """``FAILED_PRECONDITION``: the run is not in a state for the call (it ended, a signal id reused)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(BelayError):
    """``ABORTED``: a conflicting decision came first (an approval decided twice)."""

    code = grpc.StatusCode.ABORTED


class ResourceExhausted(BelayError):
    """``RESOURCE_EXHAUSTED``: a limit was reached."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(BelayError):
    """``UNAVAILABLE``: the engine could not be reached (after the retries of the policy)."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(BelayError):
    """``DEADLINE_EXCEEDED``: the call, or a :meth:`Client.wait`, ran out of time."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Internal(BelayError):
    """``INTERNAL``: the engine failed (its log has the detail)."""

    code = grpc.StatusCode.INTERNAL


class ConfigError(ValueError):
    """Options that cannot work (a bad URL, TLS files with ``http://``, a missing file)."""


class InvalidJson(TypeError):
    """An argument that must be JSON (a run's input, a signal's payload, an
    edited subject, an answer) holds a value JSON has not (an object, a
    set, bytes, a NaN, a key that is not a string, a cycle). Raised before
    anything is sent; the message names the argument, where the value is
    (``$.items[2].when``) and what it is."""


_BY_CODE: dict[grpc.StatusCode, type[BelayError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        AlreadyExists,
        PermissionDenied,
        Unauthenticated,
        FailedPrecondition,
        Aborted,
        ResourceExhausted,
        Unavailable,
        DeadlineExceeded,
        Internal,
    )
}


def error_from_status(code: grpc.StatusCode, message: str, method: str) -> BelayError:
    """The exception for a status: its class by code, ``BelayError`` for the others."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return BelayError(message, code=code, method=method)
    return cls(message, method=method)


def error_from_rpc(error: grpc.RpcError, method: str) -> BelayError:
    """The exception for a failed call (``grpc.RpcError`` of the sync or the asyncio API)."""
    if isinstance(error, (grpc.Call, grpc.aio.AioRpcError)):
        return error_from_status(error.code(), error.details() or "", method)
    return BelayError(str(error), method=method)
