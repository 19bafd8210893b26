"""The synchronous client: every call of ``RunService``,
``DefinitionService`` and ``TenantService``, with retries of
``UNAVAILABLE`` and typed errors; :meth:`Client.watch` is an iterator of
events that reconnects from its last ``seq`` when the stream breaks."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from . import _rpc
from ._base import ClientBase, PathLike
from ._errors import BelayError, DeadlineExceeded, error_from_rpc
from ._files import bundle_files
from ._gen.belay.v1 import belay_pb2 as pb
from ._models import Definition, Run, RunEvent, RunPage, SignalResult, StartedRun
from ._options import Endpoint
from ._retry import Reconnects

Resp = TypeVar("Resp", bound=Message)


class Client(ClientBase[grpc.Channel]):
    """A client of one engine, acting for one tenant.

    ``url`` is ``http://host:port`` (plaintext) or ``https://host:port``
    (TLS: ``ca_file`` names the CA to trust, else the system's roots;
    ``client_cert`` and ``client_key`` give a certificate for mTLS).
    ``api_key`` is sent as ``authorization: Bearer <key>`` on every call.
    ``tenant`` empty means the key's only tenant. ``timeout`` bounds each
    unary call in seconds; ``retry`` says how ``UNAVAILABLE`` is retried
    (a watch's reconnections too). ``keepalive_time`` is the seconds
    between HTTP/2 pings (default 30, 0: none) and ``keepalive_timeout``
    how long one may go unanswered (default 10) before the connection is
    dropped: a call or watch on an engine that froze then fails
    ``UNAVAILABLE`` (and is retried) instead of hanging.

    Raises :class:`ConfigError` for options that cannot work. Calls raise a
    :class:`BelayError` subclass (``NotFound``, ``PermissionDenied``, …)
    carrying the gRPC code and the engine's message.
    """

    def _open(self, e: Endpoint) -> grpc.Channel:
        """A channel of this client's kind to ``e``."""
        if e.credentials is None:
            return grpc.insecure_channel(e.target, options=e.options)
        return grpc.secure_channel(e.target, e.credentials, options=e.options)

    def close(self) -> None:
        """Close the channel (open watches end)."""
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _call(self, method: _rpc.Method[Resp], request: Message) -> Resp:
        stub = self._channel.unary_unary(
            method.path, request_serializer=_rpc.serialize, response_deserializer=method.response.FromString
        )

        def once() -> Resp:
            try:
                response: Resp = stub(request, metadata=self._endpoint.metadata, timeout=self._timeout)
                return response
            except grpc.RpcError as e:
                raise error_from_rpc(e, method.name) from None

        return self._retry.retrying()(once)

    # RunService

    def start_run(
        self,
        workflow: str,
        input: Any = None,
        *,
        idempotency_key: str | None = None,
        caller: str = "",
        caller_grants: Iterable[str] = (),
    ) -> StartedRun:
        """Start a run of the latest version of ``workflow`` with ``input`` (JSON).

        The same (tenant, ``idempotency_key``) always gives the same run; without
        one, a key is made for this call (its retries reuse it). ``caller_grants``
        may only narrow the key's grants. Raises ``NotFound`` for an unknown
        workflow, ``InvalidArgument`` for input its schema refuses.
        """
        request = _rpc.start_run(self.tenant, workflow, input, idempotency_key, caller, caller_grants)
        response = self._call(_rpc.START_RUN, request)
        return StartedRun(Run.from_pb(response.run), response.created)

    def get_run(self, run_id: str) -> Run:
        """One run with its current status (``NotFound`` for another tenant's)."""
        response = self._call(_rpc.GET_RUN, pb.GetRunRequest(tenant=self.tenant, run_id=run_id))
        return Run.from_get_run(response)

    def list_runs(self, *, status: str = "", page_size: int = 0, page_token: str = "") -> RunPage:
        """A page of the tenant's runs, newest first (``page_size`` 1..=500, 0: 50)."""
        request = pb.ListRunsRequest(tenant=self.tenant, status=status, page_size=page_size, page_token=page_token)
        response = self._call(_rpc.LIST_RUNS, request)
        return RunPage([Run.from_pb(r) for r in response.runs], response.next_page_token)

    def iter_runs(self, *, status: str = "", page_size: int = 0) -> Iterator[Run]:
        """Every run of the tenant (optionally of one ``status``), page by page."""
        token = ""
        while True:
            page = self.list_runs(status=status, page_size=page_size, page_token=token)
            yield from page.runs
            if not page.next_page_token:
                return
            token = page.next_page_token

    def events(self, run_id: str, after_seq: int = 0, limit: int = 0) -> list[RunEvent]:
        """A page of a run's events with ``seq > after_seq`` (``limit`` 1..=1000, 0: 1000)."""
        request = pb.ListRunEventsRequest(tenant=self.tenant, run_id=run_id, after_seq=after_seq, limit=limit)
        return [RunEvent.from_pb(e) for e in self._call(_rpc.LIST_RUN_EVENTS, request).events]

    def watch(self, run_id: str, after_seq: int = 0, *, timeout: float | None = None) -> Iterator[RunEvent]:
        """The run's events after ``after_seq``, as they happen, ending after the
        event that ends the run.

        When the stream breaks (an engine restart, a dropped connection, an
        engine that stopped answering the keepalive pings) it reconnects,
        with the retry policy's backoff, from the last ``seq`` it yielded: no
        event is missed or repeated. After ``max_attempts`` streams or
        ``max_elapsed`` seconds of failures in a row it raises the last
        error (``Unavailable``). ``timeout`` (seconds) bounds
        the whole watch (``DeadlineExceeded``). Leaving the loop early cancels
        the stream.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        last, reconnects = after_seq, Reconnects(self._retry, run_id, _rpc.WATCH_RUN.name)
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise DeadlineExceeded(f"watching run {run_id}: no end within {timeout} s", method=_rpc.WATCH_RUN.name)
            delay, progressed = 0.0, False
            try:
                for event in self._stream(run_id, last, remaining):
                    last, progressed = event.seq, True
                    reconnects.progressed()
                    yield event
                    if event.is_final:
                        return
            except BelayError as e:
                delay = reconnects.failed(e)
            else:
                if not progressed:
                    if self.get_run(run_id).is_final:
                        return
                    delay = reconnects.ended_empty()
            time.sleep(delay)

    def _stream(self, run_id: str, after_seq: int, timeout: float | None) -> Iterator[RunEvent]:
        stub = self._channel.unary_stream(
            _rpc.WATCH_RUN.path, request_serializer=_rpc.serialize, response_deserializer=pb.RunEvent.FromString
        )
        request = pb.WatchRunRequest(tenant=self.tenant, run_id=run_id, after_seq=after_seq)
        call = stub(request, metadata=self._endpoint.metadata, timeout=timeout)
        try:
            for message in call:
                yield RunEvent.from_pb(message)
        except grpc.RpcError as e:
            raise error_from_rpc(e, _rpc.WATCH_RUN.name) from None
        finally:
            call.cancel()

    def wait(self, run_id: str, timeout: float | None = None) -> Run:
        """Block until the run ends (completed, failed or cancelled) and return it.

        Raises ``DeadlineExceeded`` when it has not ended within ``timeout``
        seconds (``None``: no limit). Survives engine restarts as
        :meth:`watch` does.
        """
        run = self.get_run(run_id)
        if run.is_final:
            return run
        try:
            for _ in self.watch(run_id, run.last_seq, timeout=timeout):
                pass
        except DeadlineExceeded:
            status = self.get_run(run_id).status
            raise DeadlineExceeded(
                f"run {run_id} did not end within {timeout} s (it is {status})", method=_rpc.WATCH_RUN.name
            ) from None
        return self.get_run(run_id)

    def signal(
        self, run_id: str, name: str, payload: Any = None, *, signal_id: str | None = None, sent_by: str = ""
    ) -> SignalResult:
        """Deliver signal ``name`` with ``payload`` (JSON) to a run.

        A signal with the same ``signal_id`` is applied once; without one, an
        id is made for this call (its retries reuse it). ``InvalidArgument``
        when no wait takes that name or the payload does not match its schema.
        """
        request = _rpc.signal_run(self.tenant, run_id, name, payload, signal_id, sent_by)
        response = self._call(_rpc.SIGNAL_RUN, request)
        return SignalResult(Run.from_pb(response.run), response.duplicate)

    def approve(
        self,
        run_id: str,
        node: str,
        *,
        reason: str = "",
        approver: str = "",
        approver_grants: Iterable[str] = (),
        edited_subject: Any = None,
        request_id: str = "",
    ) -> Run:
        """Approve the waiting ``approval`` node ``node``, optionally with an
        edited subject (JSON; the node must allow edits). ``request_id`` names
        the request decided (``GetRun``'s ``open_requests``; needed once a loop
        visited the node twice, and safe to retry: the same decision again
        changes nothing). ``PermissionDenied`` without the node's
        ``approver_grant``, ``Aborted`` when already decided differently."""
        request = _rpc.decide_approval(
            self.tenant, run_id, node, True, edited_subject, approver, approver_grants, reason, request_id
        )
        return Run.from_pb(self._call(_rpc.DECIDE_APPROVAL, request).run)

    def decline(
        self,
        run_id: str,
        node: str,
        *,
        reason: str = "",
        approver: str = "",
        approver_grants: Iterable[str] = (),
        request_id: str = "",
    ) -> Run:
        """Decline the waiting ``approval`` node ``node`` (errors as :meth:`approve`)."""
        request = _rpc.decide_approval(
            self.tenant, run_id, node, False, None, approver, approver_grants, reason, request_id
        )
        return Run.from_pb(self._call(_rpc.DECIDE_APPROVAL, request).run)

    def cancel(self, run_id: str, reason: str = "") -> Run:
        """Cancel a run that has not ended (``FailedPrecondition`` once it has)."""
        request = pb.CancelRunRequest(tenant=self.tenant, run_id=run_id, reason=reason)
        return Run.from_pb(self._call(_rpc.CANCEL_RUN, request).run)

    def pause(self, run_id: str, reason: str = "", *, operator: str = "") -> Run:
        """Operator pause: no task of the run is claimed until :meth:`resume`."""
        request = pb.PauseRunRequest(tenant=self.tenant, run_id=run_id, operator=operator, reason=reason)
        return Run.from_pb(self._call(_rpc.PAUSE_RUN, request).run)

    def resume(self, run_id: str, reason: str = "", *, operator: str = "") -> Run:
        """Lift an operator pause (a run with open uncertain outcomes stays paused)."""
        request = pb.ResumeRunRequest(tenant=self.tenant, run_id=run_id, operator=operator, reason=reason)
        return Run.from_pb(self._call(_rpc.RESUME_RUN, request).run)

    def provide_tool_input(
        self, run_id: str, call_id: str, answer: Any, *, by: str = "", request_id: str = ""
    ) -> Run:
        """Answer a tool's question to a person (``tool_call_input_requested``)."""
        request = _rpc.provide_tool_input(self.tenant, run_id, call_id, answer, by, request_id)
        return Run.from_pb(self._call(_rpc.PROVIDE_TOOL_INPUT, request).run)

    # DefinitionService and TenantService (operators)

    def register_bundle(self, files: Mapping[str, str]) -> list[Definition]:
        """Register ``{path: content}`` (``.tools.abl``, ``.yaml``) as one bundle;
        ``InvalidArgument`` listing every error with file and line."""
        response = self._call(_rpc.REGISTER_BUNDLE, _rpc.register_bundle(self.tenant, files))
        return [Definition.from_pb(d) for d in response.definitions]

    def register_paths(self, paths: Iterable[PathLike]) -> list[Definition]:
        """Register every definition file under ``paths`` (files or directories)."""
        return self.register_bundle(bundle_files(paths))

    def list_definitions(self, kind: str = "") -> list[Definition]:
        """The tenant's definitions, optionally of one ``kind``."""
        response = self._call(_rpc.LIST_DEFINITIONS, pb.ListDefinitionsRequest(tenant=self.tenant, kind=kind))
        return [Definition.from_pb(d) for d in response.definitions]

    def set_tenant_grants(self, grants: Iterable[str]) -> list[str]:
        """Replace the permissions granted to the tenant; returns them."""
        request = pb.SetTenantGrantsRequest(tenant=self.tenant, grants=list(grants))
        return list(self._call(_rpc.SET_TENANT_GRANTS, request).grants)

    def get_tenant_grants(self) -> list[str]:
        """The permissions granted to the tenant."""
        return list(self._call(_rpc.GET_TENANT_GRANTS, pb.GetTenantGrantsRequest(tenant=self.tenant)).grants)
