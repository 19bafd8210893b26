"""Typed values the client returns: runs, events, definitions, pages. JSON
fields of the wire (``*_json``) are decoded here, once."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from ._gen.belay.v1 import belay_pb2 as pb

#: Event kinds after which a run does not change any more.
FINAL_EVENT_KINDS = frozenset({"run_completed", "run_failed", "run_cancelled"})

#: Run statuses that are final.
FINAL_STATUSES = frozenset({"completed", "failed", "cancelled"})


def _json_or_none(text: str) -> Any:
    """A ``*_json`` field: its document, or ``None`` when empty."""
    return json.loads(text) if text else None


@dataclass(frozen=True)
class OpenRequest:
    """A request for a person that a run holds open (``GetRun``'s
    ``open_requests``): ``request_id`` is what ``approve``/``decline`` or
    ``provide_tool_input`` name as ``request_id`` (``<node>.approval``,
    ``<node>~<n>.approval`` on the n-th visit of a node in a loop, a
    confirmation's call id, ``<call_id>.input<n>``); ``kind`` is
    ``approval``, ``confirmation`` or ``tool_input``; ``call_id`` is empty
    for an approval node; ``approver_grant`` is the permission a decider
    needs (empty for a tool's question)."""

    request_id: str
    kind: str
    node: str
    call_id: str
    approver_grant: str

    @classmethod
    def from_pb(cls, r: pb.OpenRequest) -> OpenRequest:
        """From the wire message."""
        return cls(r.request_id, r.kind, r.node, r.call_id, r.approver_grant)


@dataclass(frozen=True)
class UnclaimableTask:
    """A ready task of the run that no live worker can take (``GetRun``'s
    ``unclaimable``): ``kind`` is ``model_call`` or ``tool_call``;
    ``requires`` every requirement of the task (``mcp:<server>``,
    ``pool:<name>``), ``missing`` those no live worker has; ``reason`` is
    for people (``no live worker has pool:gpu``)."""

    task_id: str
    kind: str
    requires: tuple[str, ...]
    missing: tuple[str, ...]
    reason: str

    @classmethod
    def from_pb(cls, t: pb.UnclaimableTask) -> UnclaimableTask:
        """From the wire message."""
        return cls(t.task_id, t.kind, tuple(t.requires), tuple(t.missing), t.reason)


@dataclass(frozen=True)
class Run:
    """One run, as ``GetRun`` shows it.

    ``status`` is ``pending``, ``running``, ``paused``, ``waiting``,
    ``completed``, ``failed`` or ``cancelled``; ``status_reason`` says why a
    run is paused, waiting, failed or cancelled. ``input`` and ``output``
    are the decoded JSON documents (``output`` is ``None`` until the run
    completes). Times are RFC 3339 strings in UTC.

    ``open_requests`` (the approvals, confirmations and tools' questions
    the run waits for) and ``unclaimable`` (its ready tasks no live worker
    can take) are filled by ``get_run`` and ``wait``, which ask ``GetRun``;
    the runs other calls answer with leave them empty.
    """

    run_id: str
    tenant: str
    workflow: str
    workflow_version: int
    status: str
    status_reason: str
    input: Any
    output: Any
    idempotency_key: str
    caller: str
    last_seq: int
    created_at: str
    updated_at: str
    open_requests: tuple[OpenRequest, ...] = ()
    unclaimable: tuple[UnclaimableTask, ...] = ()

    @property
    def is_final(self) -> bool:
        """True when the run has ended (completed, failed or cancelled)."""
        return self.status in FINAL_STATUSES

    @classmethod
    def from_get_run(cls, response: pb.GetRunResponse) -> Run:
        """From ``GetRun``'s answer: the run with its open requests and unclaimable tasks."""
        return replace(
            cls.from_pb(response.run),
            open_requests=tuple(OpenRequest.from_pb(r) for r in response.open_requests),
            unclaimable=tuple(UnclaimableTask.from_pb(t) for t in response.unclaimable),
        )

    @classmethod
    def from_pb(cls, run: pb.Run) -> Run:
        """From the wire message (no open requests or unclaimable tasks: only ``GetRun`` has them)."""
        return cls(
            run_id=run.run_id,
            tenant=run.tenant,
            workflow=run.workflow,
            workflow_version=run.workflow_version,
            status=run.status,
            status_reason=run.status_reason,
            input=_json_or_none(run.input_json),
            output=_json_or_none(run.output_json),
            idempotency_key=run.idempotency_key,
            caller=run.caller,
            last_seq=run.last_seq,
            created_at=run.created_at,
            updated_at=run.updated_at,
        )


@dataclass(frozen=True)
class RunEvent:
    """One event of a run's history.

    ``seq`` is gapless per run from 1; ``kind`` is the snake_case type
    (``wait_started``, ``approval_requested``, ``run_completed``, …);
    ``payload`` is the whole event as a JSON object (``{"type": kind, …}``).
    """

    run_id: str
    seq: int
    kind: str
    payload: dict[str, Any] = field(repr=False)
    recorded_at: str

    @property
    def is_final(self) -> bool:
        """True for the event that ends the run."""
        return self.kind in FINAL_EVENT_KINDS

    @classmethod
    def from_pb(cls, event: pb.RunEvent) -> RunEvent:
        """From the wire message."""
        payload = _json_or_none(event.payload_json)
        return cls(
            run_id=event.run_id,
            seq=event.seq,
            kind=event.kind,
            payload=payload if isinstance(payload, dict) else {"type": event.kind},
            recorded_at=event.recorded_at,
        )


@dataclass(frozen=True)
class StartedRun:
    """The answer of ``start_run``: the run, and whether this call created it
    (``False`` when the idempotency key named an existing run)."""

    run: Run
    created: bool


@dataclass(frozen=True)
class SignalResult:
    """The answer of ``signal``: the run, and whether a signal with this
    ``signal_id`` had already been delivered."""

    run: Run
    duplicate: bool


@dataclass(frozen=True)
class RunPage:
    """One page of ``list_runs``; ``next_page_token`` is empty on the last."""

    runs: list[Run]
    next_page_token: str


@dataclass(frozen=True)
class Definition:
    """A registered definition: ``kind`` (``tool``, ``agent``, ``workflow``),
    name, version, ``content_hash`` (hex SHA-256) and whether the
    registration created it."""

    kind: str
    name: str
    version: int
    content_hash: str
    created_at: str
    created: bool

    @classmethod
    def from_pb(cls, d: pb.Definition) -> Definition:
        """From the wire message."""
        return cls(d.kind, d.name, d.version, d.content_hash, d.created_at, d.created)
