"""The asyncio client against a real engine and worker: the same calls as
the sync suite, awaited, and its watch across an engine restart."""

from __future__ import annotations

import uuid

import grpc
import pytest

from belay_client import AsyncClient, DeadlineExceeded, NotFound, RetryPolicy, RunEvent, Unauthenticated

from conftest import GRANTS, env, kill_engine, wait_for_new_engine


async def test_async_onboarding_outlives_an_engine_restart(aclient: AsyncClient) -> None:
    body = {"email": f"async-{uuid.uuid4().hex[:8]}@example.com", "name": "Grace Hopper"}
    started = await aclient.start_run("onboarding", body, idempotency_key=f"async-{uuid.uuid4()}", caller_grants=GRANTS)
    run_id = started.run.run_id
    assert started.created
    with pytest.raises(DeadlineExceeded):
        await aclient.wait(run_id, timeout=0.3)
    seen: list[RunEvent] = []
    killed = 0
    async for event in aclient.watch(run_id):
        seen.append(event)
        if event.kind == "wait_started" and not killed:
            killed = kill_engine()
            await aclient.signal(run_id, "documents_received", {"files": ["id.pdf"]}, sent_by="portal")
        elif event.kind == "approval_requested":
            await aclient.approve(
                run_id, "approve", approver_grants=["onboarding.approve"], edited_subject=None, reason="ok"
            )
    assert wait_for_new_engine(killed) != killed
    assert [e.seq for e in seen] == list(range(1, len(seen) + 1))
    done = await aclient.wait(run_id, timeout=30)
    assert done.status == "completed" and done.output["plan"] == "starter"
    assert [e.seq for e in await aclient.events(run_id)] == [e.seq for e in seen]
    page = await aclient.list_runs(page_size=500)
    assert run_id in {r.run_id for r in page.runs}


async def test_async_calls_and_errors(aclient: AsyncClient) -> None:
    assert "onboarding" in {d.name for d in await aclient.list_definitions("workflow")}
    grants = await aclient.get_tenant_grants()
    assert await aclient.set_tenant_grants(grants) == grants
    assert not any(d.created for d in await aclient.register_paths([env("BELAY_TEST_DEFINITIONS")]))
    run = (await aclient.start_run("onboarding", {"email": "x@example.com", "name": "X"}, caller_grants=GRANTS)).run
    async for event in aclient.watch(run.run_id, timeout=60):
        if event.kind == "wait_started":
            break
    assert (await aclient.pause(run.run_id, "hold")).status == "paused"
    assert (await aclient.resume(run.run_id)).status == "waiting"
    assert (await aclient.cancel(run.run_id, "test")).status == "cancelled"
    with pytest.raises(NotFound):
        await aclient.get_run(str(uuid.uuid4()))
    policy = RetryPolicy(max_attempts=1)
    async with AsyncClient(env("BELAY_ENGINE_URL"), api_key="belay_x_y", tenant=aclient.tenant, retry=policy) as bad:
        with pytest.raises(Unauthenticated) as e:
            await bad.get_tenant_grants()
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED


async def test_async_decline_fails_the_run(aclient: AsyncClient) -> None:
    run = (await aclient.start_run("onboarding", {"email": "d@example.com", "name": "D"}, caller_grants=GRANTS)).run
    async for event in aclient.watch(run.run_id, timeout=60):
        if event.kind == "wait_started":
            await aclient.signal(run.run_id, "documents_received", {"files": ["a.pdf"]})
        elif event.kind == "approval_requested":
            await aclient.decline(run.run_id, "approve", approver_grants=["onboarding.approve"], reason="no")
    done = await aclient.wait(run.run_id, timeout=10)
    assert done.status == "failed" and "declined" in done.status_reason
