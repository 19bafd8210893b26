"""The asyncio client (``grpc.aio``): the same calls as :class:`Client`,
as coroutines; :meth:`AsyncClient.watch` is an async iterator of events
that reconnects from its last ``seq`` when the stream breaks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from types import TracebackType
from typing import Any, TypeVar

import grpc
import grpc.aio
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


class AsyncClient(ClientBase[grpc.aio.Channel]):
    """The asyncio twin of :class:`belay_client.Client`: same options, same
    methods (awaited), same errors. Make it inside a running event loop;
    ``await client.close()`` or ``async with`` ends it."""

    def _open(self, e: Endpoint) -> grpc.aio.Channel:
        """A channel of this client's kind to ``e``."""
        if e.credentials is None:
            return grpc.aio.insecure_channel(e.target, options=e.options)
        return grpc.aio.secure_channel(e.target, e.credentials, options=e.options)

    async def close(self) -> None:
        """Close the channel (open watches end)."""
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _call(self, method: _rpc.Method[Resp], request: Message) -> Resp:
        stub = self._channel.unary_unary(
            method.path, request_serializer=_rpc.serialize, response_deserializer=method.response.FromString
        )

        async def once() -> Resp:
            try:
                response: Resp = await stub(request, metadata=self._endpoint.metadata, timeout=self._timeout)
                return response
            except grpc.aio.AioRpcError as e:
                raise error_from_rpc(e, method.name) from None

        result: Resp = await self._retry.async_retrying()(once)
        return result

    async def start_run(
        self,
        workflow: str,
        input: Any = None,
        *,
        idempotency_key: str | None = None,
        caller: str = "",
        caller_grants: Iterable[str] = (),
    ) -> StartedRun:
        """See :meth:`Client.start_run`."""
        request = _rpc.start_run(self.tenant, workflow, input, idempotency_key, caller, caller_grants)
        response = await self._call(_rpc.START_RUN, request)
        return StartedRun(Run.from_pb(response.run), response.created)

    async def get_run(self, run_id: str) -> Run:
        """See :meth:`Client.get_run`."""
        response = await self._call(_rpc.GET_RUN, pb.GetRunRequest(tenant=self.tenant, run_id=run_id))
        return Run.from_get_run(response)

    async def list_runs(self, *, status: str = "", page_size: int = 0, page_token: str = "") -> RunPage:
        """See :meth:`Client.list_runs`."""
        request = pb.ListRunsRequest(tenant=self.tenant, status=status, page_size=page_size, page_token=page_token)
        response = await self._call(_rpc.LIST_RUNS, request)
        return RunPage([Run.from_pb(r) for r in response.runs], response.next_page_token)

    async def events(self, run_id: str, after_seq: int = 0, limit: int = 0) -> list[RunEvent]:
        """See :meth:`Client.events`."""
        request = pb.ListRunEventsRequest(tenant=self.tenant, run_id=run_id, after_seq=after_seq, limit=limit)
        return [RunEvent.from_pb(e) for e in (await self._call(_rpc.LIST_RUN_EVENTS, request)).events]

    async def watch(self, run_id: str, after_seq: int = 0, *, timeout: float | None = None) -> AsyncIterator[RunEvent]:
        """See :meth:`Client.watch`: reconnects from the last ``seq`` it yielded."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last, reconnects = after_seq, Reconnects(self._retry, run_id, _rpc.WATCH_RUN.name)
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise DeadlineExceeded(f"watching run {run_id}: no end within {timeout} s", method=_rpc.WATCH_RUN.name)
            delay, progressed = 0.0, False
            try:
                async for event in self._stream(run_id, last, remaining):
                    last, progressed = event.seq, True
                    reconnects.progressed()
                    yield event
                    if event.is_final:
                        return
            except BelayError as e:
                delay = reconnects.failed(e)
            else:
                if not progressed:
                    if (await self.get_run(run_id)).is_final:
                        return
                    delay = reconnects.ended_empty()
            await asyncio.sleep(delay)

    async def _stream(self, run_id: str, after_seq: int, timeout: float | None) -> AsyncIterator[RunEvent]:
        stub = self._channel.unary_stream(
            _rpc.WATCH_RUN.path, request_serializer=_rpc.serialize, response_deserializer=pb.RunEvent.FromString
        )
        request = pb.WatchRunRequest(tenant=self.tenant, run_id=run_id, after_seq=after_seq)
        call = stub(request, metadata=self._endpoint.metadata, timeout=timeout)
        try:
            async for message in call:
                yield RunEvent.from_pb(message)
        except grpc.aio.AioRpcError as e:
            raise error_from_rpc(e, _rpc.WATCH_RUN.name) from None
        finally:
            call.cancel()

    async def wait(self, run_id: str, timeout: float | None = None) -> Run:
        """See :meth:`Client.wait`."""
        run = await self.get_run(run_id)
        if run.is_final:
            return run
        try:
            async for _ in self.watch(run_id, run.last_seq, timeout=timeout):
                pass
        except DeadlineExceeded:
            status = (await self.get_run(run_id)).status
            raise DeadlineExceeded(
                f"run {run_id} did not end within {timeout} s (it is {status})", method=_rpc.WATCH_RUN.name
            ) from None
        return await self.get_run(run_id)

    async def signal(
        self, run_id: str, name: str, payload: Any = None, *, signal_id: str | None = None, sent_by: str = ""
    ) -> SignalResult:
        """See :meth:`Client.signal`."""
        request = _rpc.signal_run(self.tenant, run_id, name, payload, signal_id, sent_by)
        response = await self._call(_rpc.SIGNAL_RUN, request)
        return SignalResult(Run.from_pb(response.run), response.duplicate)

    async def approve(
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
        """See :meth:`Client.approve`."""
        request = _rpc.decide_approval(
            self.tenant, run_id, node, True, edited_subject, approver, approver_grants, reason, request_id
        )
        return Run.from_pb((await self._call(_rpc.DECIDE_APPROVAL, request)).run)

    async def decline(
        self,
        run_id: str,
        node: str,
        *,
        reason: str = "",
        approver: str = "",
        approver_grants: Iterable[str] = (),
        request_id: str = "",
    ) -> Run:
        """See :meth:`Client.decline`."""
        request = _rpc.decide_approval(
            self.tenant, run_id, node, False, None, approver, approver_grants, reason, request_id
        )
        return Run.from_pb((await self._call(_rpc.DECIDE_APPROVAL, request)).run)

    async def cancel(self, run_id: str, reason: str = "") -> Run:
        """See :meth:`Client.cancel`."""
        request = pb.CancelRunRequest(tenant=self.tenant, run_id=run_id, reason=reason)
        return Run.from_pb((await self._call(_rpc.CANCEL_RUN, request)).run)

    async def pause(self, run_id: str, reason: str = "", *, operator: str = "") -> Run:
        """See :meth:`Client.pause`."""
        request = pb.PauseRunRequest(tenant=self.tenant, run_id=run_id, operator=operator, reason=reason)
        return Run.from_pb((await self._call(_rpc.PAUSE_RUN, request)).run)

    async def resume(self, run_id: str, reason: str = "", *, operator: str = "") -> Run:
        """See :meth:`Client.resume`."""
        request = pb.ResumeRunRequest(tenant=self.tenant, run_id=run_id, operator=operator, reason=reason)
        return Run.from_pb((await self._call(_rpc.RESUME_RUN, request)).run)

    async def provide_tool_input(
        self, run_id: str, call_id: str, answer: Any, *, by: str = "", request_id: str = ""
    ) -> Run:
        """See :meth:`Client.provide_tool_input`."""
        request = _rpc.provide_tool_input(self.tenant, run_id, call_id, answer, by, request_id)
        return Run.from_pb((await self._call(_rpc.PROVIDE_TOOL_INPUT, request)).run)

    async def register_bundle(self, files: Mapping[str, str]) -> list[Definition]:
        """See :meth:`Client.register_bundle`."""
        response = await self._call(_rpc.REGISTER_BUNDLE, _rpc.register_bundle(self.tenant, files))
        return [Definition.from_pb(d) for d in response.definitions]

    async def register_paths(self, paths: Iterable[PathLike]) -> list[Definition]:
        """See :meth:`Client.register_paths`."""
        return await self.register_bundle(bundle_files(paths))

    async def list_definitions(self, kind: str = "") -> list[Definition]:
        """See :meth:`Client.list_definitions`."""
        response = await self._call(_rpc.LIST_DEFINITIONS, pb.ListDefinitionsRequest(tenant=self.tenant, kind=kind))
        return [Definition.from_pb(d) for d in response.definitions]

    async def set_tenant_grants(self, grants: Iterable[str]) -> list[str]:
        """See :meth:`Client.set_tenant_grants`."""
        request = pb.SetTenantGrantsRequest(tenant=self.tenant, grants=list(grants))
        return list((await self._call(_rpc.SET_TENANT_GRANTS, request)).grants)

    async def get_tenant_grants(self) -> list[str]:
        """See :meth:`Client.get_tenant_grants`."""
        request = pb.GetTenantGrantsRequest(tenant=self.tenant)
        return list((await self._call(_rpc.GET_TENANT_GRANTS, request)).grants)
