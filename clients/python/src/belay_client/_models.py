"""Typed values the client returns: runs, events, definitions, pages. JSON
fields of the wire (``*_json``) are decoded here, once."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
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
class Run:
    """One run, as ``GetRun`` shows it.

    ``status`` is ``pending``, ``running``, ``paused``, ``waiting``,
    ``completed``, ``failed`` or ``cancelled``; ``status_reason`` says why a
    run is paused, waiting, failed or cancelled. ``input`` and ``output``
    are the decoded JSON documents (``output`` is ``None`` until the run
    completes). Times are RFC 3339 strings in UTC.
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

    @property
    def is_final(self) -> bool:
        """True when the run has ended (completed, failed or cancelled)."""
        return self.status in FINAL_STATUSES

    @classmethod
    def from_pb(cls, run: pb.Run) -> Run:
        """From the wire message."""
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
