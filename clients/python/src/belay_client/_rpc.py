"""The ``belay.v1`` methods the clients call (path and response type) and
the requests they send, built once here for the sync and the asyncio
client alike. JSON arguments are encoded here (``*_json`` fields, by
:func:`belay_client._json.dumps`)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from google.protobuf.message import Message

from ._gen.belay.v1 import belay_pb2 as pb
from ._json import dumps

Resp = TypeVar("Resp", bound=Message)


@dataclass(frozen=True)
class Method(Generic[Resp]):
    """One RPC: its name (``belay.v1.RunService/StartRun``, what errors
    carry as ``method``) and the message it answers with."""

    name: str
    response: type[Resp]

    @property
    def path(self) -> str:
        """The HTTP/2 path gRPC calls it by (``/belay.v1.RunService/StartRun``)."""
        return f"/{self.name}"


def _run(name: str, response: type[Resp]) -> Method[Resp]:
    return Method(f"belay.v1.RunService/{name}", response)


START_RUN = _run("StartRun", pb.StartRunResponse)
GET_RUN = _run("GetRun", pb.GetRunResponse)
LIST_RUNS = _run("ListRuns", pb.ListRunsResponse)
LIST_RUN_EVENTS = _run("ListRunEvents", pb.ListRunEventsResponse)
WATCH_RUN = _run("WatchRun", pb.RunEvent)
CANCEL_RUN = _run("CancelRun", pb.CancelRunResponse)
PAUSE_RUN = _run("PauseRun", pb.PauseRunResponse)
RESUME_RUN = _run("ResumeRun", pb.ResumeRunResponse)
SIGNAL_RUN = _run("SignalRun", pb.SignalRunResponse)
DECIDE_APPROVAL = _run("DecideApproval", pb.DecideApprovalResponse)
PROVIDE_TOOL_INPUT = _run("ProvideToolInput", pb.ProvideToolInputResponse)
REGISTER_BUNDLE = Method("belay.v1.DefinitionService/RegisterBundle", pb.RegisterBundleResponse)
LIST_DEFINITIONS = Method("belay.v1.DefinitionService/ListDefinitions", pb.ListDefinitionsResponse)
SET_TENANT_GRANTS = Method("belay.v1.TenantService/SetTenantGrants", pb.SetTenantGrantsResponse)
GET_TENANT_GRANTS = Method("belay.v1.TenantService/GetTenantGrants", pb.GetTenantGrantsResponse)


def serialize(message: Message) -> bytes:
    """The wire bytes of a request."""
    return message.SerializeToString()


def start_run(
    tenant: str,
    workflow: str,
    input: Any,
    idempotency_key: str | None,
    caller: str,
    caller_grants: Iterable[str],
) -> pb.StartRunRequest:
    """A StartRun request; a missing idempotency key is made here, once per call."""
    return pb.StartRunRequest(
        tenant=tenant,
        workflow=workflow,
        input_json=dumps({} if input is None else input, "the run's input"),
        idempotency_key=idempotency_key or str(uuid.uuid4()),
        caller=caller,
        caller_grants=list(caller_grants),
    )


def signal_run(
    tenant: str, run_id: str, name: str, payload: Any, signal_id: str | None, sent_by: str
) -> pb.SignalRunRequest:
    """A SignalRun request; a missing signal id is made here, once per call."""
    return pb.SignalRunRequest(
        tenant=tenant,
        run_id=run_id,
        name=name,
        signal_id=signal_id or str(uuid.uuid4()),
        payload_json="" if payload is None else dumps(payload, "the signal's payload"),
        sent_by=sent_by,
    )


def decide_approval(
    tenant: str,
    run_id: str,
    node: str,
    approve: bool,
    edited_subject: Any,
    approver: str,
    approver_grants: Iterable[str],
    reason: str,
    request_id: str = "",
) -> pb.DecideApprovalRequest:
    """A DecideApproval request (``request_id``: the request decided, see ``GetRun``'s ``open_requests``)."""
    return pb.DecideApprovalRequest(
        tenant=tenant,
        run_id=run_id,
        node=node,
        approve=approve,
        edited_subject_json="" if edited_subject is None else dumps(edited_subject, "the edited subject"),
        approver=approver,
        approver_grants=list(approver_grants),
        reason=reason,
        request_id=request_id,
    )


def register_bundle(tenant: str, files: Mapping[str, str]) -> pb.RegisterBundleRequest:
    """A RegisterBundle request of ``{path: content}``."""
    return pb.RegisterBundleRequest(
        tenant=tenant,
        files=[pb.DefinitionFile(path=path, content=content) for path, content in files.items()],
    )


def provide_tool_input(
    tenant: str, run_id: str, call_id: str, answer: Any, by: str, request_id: str = ""
) -> pb.ProvideToolInputRequest:
    """A ProvideToolInput request (``request_id``: the question answered, ``<call_id>.input<n>``)."""
    return pb.ProvideToolInputRequest(
        tenant=tenant,
        run_id=run_id,
        call_id=call_id,
        answer_json=dumps(answer, "the answer"),
        by=by,
        request_id=request_id,
    )
