"""Python client of Belay's gRPC API (``belay.v1``): :class:`Client`
(synchronous) and :class:`AsyncClient` (asyncio), typed results
(:class:`Run`, :class:`RunEvent`, …) and one exception class per gRPC code
(:class:`BelayError` and its subclasses, each with ``code`` and ``message``).

    from belay_client import Client

    with Client("http://127.0.0.1:50051", api_key=key, tenant="acme") as belay:
        run = belay.start_run("onboarding", {"email": "ada@example.com"}).run
        for event in belay.watch(run.run_id):
            print(event.seq, event.kind)
"""

from ._aio import AsyncClient
from ._client import Client
from ._errors import (
    Aborted,
    AlreadyExists,
    BelayError,
    ConfigError,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    InvalidJson,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from ._models import (
    FINAL_EVENT_KINDS,
    FINAL_STATUSES,
    Definition,
    OpenRequest,
    Run,
    RunEvent,
    RunPage,
    SignalResult,
    StartedRun,
    UnclaimableTask,
)
from ._options import DEFAULT_KEEPALIVE_TIME, DEFAULT_KEEPALIVE_TIMEOUT
from ._retry import RetryPolicy

__all__ = [
    "Aborted",
    "AlreadyExists",
    "AsyncClient",
    "BelayError",
    "Client",
    "ConfigError",
    "DEFAULT_KEEPALIVE_TIME",
    "DEFAULT_KEEPALIVE_TIMEOUT",
    "DeadlineExceeded",
    "Definition",
    "FINAL_EVENT_KINDS",
    "FINAL_STATUSES",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "InvalidJson",
    "NotFound",
    "OpenRequest",
    "PermissionDenied",
    "ResourceExhausted",
    "RetryPolicy",
    "Run",
    "RunEvent",
    "RunPage",
    "SignalResult",
    "StartedRun",
    "Unauthenticated",
    "Unavailable",
    "UnclaimableTask",
]
