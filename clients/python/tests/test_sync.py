"""The synchronous client against a real engine and worker: every call,
a watch that outlives an engine restart, and the error mapping."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any
from pathlib import Path

import grpc
import pytest

from belay_client import (
    Client,
    ConfigError,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    InvalidJson,
    NotFound,
    OpenRequest,
    PermissionDenied,
    RetryPolicy,
    RunEvent,
    Unauthenticated,
    Unavailable,
)

from conftest import GRANTS, env, kill_engine, wait_for_new_engine


def customer(tag: str) -> dict[str, str]:
    return {"email": f"{tag}-{uuid.uuid4().hex[:8]}@example.com", "name": "Ada Lovelace", "plan": "pro"}


def assert_gapless(events: list[RunEvent]) -> None:
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), [(e.seq, e.kind) for e in events]


def test_start_is_idempotent_and_wait_returns_the_finished_run(client: Client) -> None:
    key = f"express-{uuid.uuid4()}"
    started = client.start_run("onboarding_express", customer("express"), idempotency_key=key, caller_grants=GRANTS)
    assert started.created and started.run.workflow == "onboarding_express"
    again = client.start_run("onboarding_express", started.run.input, idempotency_key=key, caller_grants=GRANTS)
    assert not again.created and again.run.run_id == started.run.run_id
    with pytest.raises(FailedPrecondition, match=started.run.run_id):  # the key, with other input
        client.start_run("onboarding_express", customer("other"), idempotency_key=key, caller_grants=GRANTS)

    done = client.wait(started.run.run_id, timeout=60)
    assert done.status == "completed", done.status_reason
    assert done.output["account_id"].startswith("acct_")
    assert client.get_run(done.run_id) == done

    events = client.events(done.run_id)
    assert_gapless(events)
    assert events[-1].kind == "run_completed" and events[-1].is_final
    assert events[0].payload["type"] == events[0].kind
    assert [e.seq for e in client.events(done.run_id, after_seq=2, limit=3)] == [3, 4, 5]

    page = client.list_runs(status="completed", page_size=500)
    assert done.run_id in {r.run_id for r in page.runs}
    assert done.run_id in {r.run_id for r in client.iter_runs(page_size=1)}


def test_watch_signal_and_approve_outlive_an_engine_restart(client: Client) -> None:
    run = client.start_run("onboarding", customer("watch"), caller_grants=GRANTS).run
    seen: list[RunEvent] = []
    killed: list[int] = []
    for event in client.watch(run.run_id):
        seen.append(event)
        if event.kind == "wait_started" and not killed:
            # The engine dies with the watch open; the signal is retried
            # until its replacement answers, and the watch resumes.
            killed.append(kill_engine())
            result = client.signal(run.run_id, "documents_received", {"files": ["passport.pdf"]}, signal_id="docs-1")
            assert not result.duplicate
            assert client.signal(run.run_id, "documents_received", {"files": ["passport.pdf"]}, signal_id="docs-1").duplicate
        elif event.kind == "approval_requested":
            approved = client.approve(
                run.run_id, "approve", approver="grace", approver_grants=["onboarding.approve"], reason="KYC clear"
            )
            assert approved.run_id == run.run_id
    assert killed and wait_for_new_engine(killed[0]) != killed[0]
    assert_gapless(seen)
    assert seen[-1].kind == "run_completed"
    assert [e.seq for e in seen] == [e.seq for e in client.events(run.run_id)]
    done = client.get_run(run.run_id)
    assert done.status == "completed" and done.output["plan"] == "pro"


def watch_until(client: Client, run_id: str, kind: str) -> RunEvent:
    for event in client.watch(run_id, timeout=60):
        if event.kind == kind:
            return event
    raise AssertionError(f"run {run_id} ended without {kind}")


def test_pause_resume_cancel_and_wait_timeout(client: Client) -> None:
    run = client.start_run("onboarding", customer("pause"), caller_grants=GRANTS).run
    watch_until(client, run.run_id, "wait_started")
    with pytest.raises(DeadlineExceeded) as waited:
        client.wait(run.run_id, timeout=0.5)
    assert waited.value.code == grpc.StatusCode.DEADLINE_EXCEEDED and "waiting" in waited.value.message
    paused = client.pause(run.run_id, "maintenance", operator="ops")
    assert paused.status == "paused", paused
    resumed = client.resume(run.run_id, "done", operator="ops")
    assert resumed.status == "waiting", resumed
    cancelled = client.cancel(run.run_id, "customer withdrew")
    assert cancelled.status == "cancelled"
    assert client.wait(run.run_id, timeout=10).status == "cancelled"
    events = client.events(run.run_id)
    assert {"run_paused", "run_resumed", "run_cancelled"} <= {e.kind for e in events}
    with pytest.raises(FailedPrecondition):
        client.cancel(run.run_id)
    with pytest.raises(FailedPrecondition):
        client.signal(run.run_id, "documents_received", {"files": []})


def test_definitions_grants_and_tool_input(client: Client, definitions: Path) -> None:
    registered = client.register_paths([definitions])
    assert {"onboarding", "onboarding_express"} <= {d.name for d in registered if d.kind == "workflow"}
    assert not any(d.created for d in registered)  # the harness registered them already
    workflows = client.list_definitions("workflow")
    assert all(d.kind == "workflow" for d in workflows) and "onboarding" in {d.name for d in workflows}
    assert client.set_tenant_grants(GRANTS) == GRANTS
    assert sorted(client.get_tenant_grants()) == sorted(GRANTS)
    with pytest.raises(InvalidArgument) as refused:
        client.register_bundle({"broken.yaml": "kind: workflow\nname: [\n"})
    assert "broken.yaml" in refused.value.message

    run = client.start_run("onboarding", customer("input"), caller_grants=GRANTS).run
    watch_until(client, run.run_id, "wait_started")
    with pytest.raises((FailedPrecondition, InvalidArgument)) as no_question:
        client.provide_tool_input(run.run_id, "intake.t1", {"action": "accept", "content": {}})
    assert no_question.value.message
    client.cancel(run.run_id)


def test_errors_carry_the_code_and_the_engines_message(client: Client) -> None:
    url = env("BELAY_ENGINE_URL")
    with Client(url, api_key="belay_nope_nope", tenant=client.tenant, retry=RetryPolicy(max_attempts=1)) as bad:
        with pytest.raises(Unauthenticated) as e:
            bad.list_runs()
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED and e.value.message
    assert e.value.method == "belay.v1.RunService/ListRuns"  # as the TypeScript client, and the engine's spans

    with Client(url, api_key=env("BELAY_TEST_CLIENT_KEY"), tenant=client.tenant) as plain:
        with pytest.raises(PermissionDenied) as denied:
            plain.set_tenant_grants(["crm.read"])
        assert denied.value.code == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(PermissionDenied):
            Client(url, api_key=env("BELAY_TEST_CLIENT_KEY"), tenant="globex").list_runs()

    with pytest.raises(NotFound) as missing:
        client.get_run(str(uuid.uuid4()))
    assert missing.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(NotFound, match="workflow `nope` not found"):
        client.start_run("nope", {})
    with pytest.raises(InvalidArgument, match="input schema"):
        client.start_run("onboarding", {"name": "no email"})
    with pytest.raises(NotFound) as no_run:
        for _ in client.watch(str(uuid.uuid4())):
            pass
    assert no_run.value.method == "belay.v1.RunService/WatchRun"


def test_arguments_that_are_not_json_are_refused_before_any_call() -> None:
    # Nothing listens on port 1: a call would be Unavailable. The messages
    # are the TypeScript client's, word for word (clients/typescript/test).
    circular: list[object] = []
    circular.append(circular)
    with Client("http://127.0.0.1:1", retry=RetryPolicy(max_attempts=1)) as nowhere:
        refusals: list[tuple[Callable[[], object], str]] = [
            (lambda: nowhere.start_run("w", {"n": float("nan")}), "the run's input is not JSON: $.n is a number that is not finite (NaN)"),
            (lambda: nowhere.start_run("w", {"a": [1, {"f": print}]}), "the run's input is not JSON: $.a[1].f is a function"),
            (lambda: nowhere.start_run("w", {"x y": float("inf")}), 'the run\'s input is not JSON: $["x y"] is a number that is not finite (Infinity)'),
            (lambda: nowhere.signal("r", "s", {"l": circular}), "the signal's payload is not JSON: $.l[0] is a circular reference"),
            (lambda: nowhere.approve("r", "n", edited_subject={"when": object()}), "the edited subject is not JSON: $.when is an object of type object"),
            (lambda: nowhere.provide_tool_input("r", "c", {1: "one"}), "the answer is not JSON: $ is an object with a key that is not a string (1)"),
        ]
        for call, message in refusals:
            with pytest.raises(InvalidJson) as refused:
                call()
            assert str(refused.value) == message
            assert isinstance(refused.value, TypeError)
        # A string is a JSON string, sent as it is (not parsed as JSON text);
        # no input is {} (as in TypeScript), so both reach the engine.
        for value in ("{not json", None):
            with pytest.raises(Unavailable):
                nowhere.start_run("w", value)


def test_get_run_shows_open_requests_and_unclaimable_tasks(client: Client) -> None:
    run = client.start_run("onboarding", customer("requests"), caller_grants=GRANTS).run
    assert client.get_run(run.run_id).open_requests == ()
    for event in client.watch(run.run_id, timeout=60):
        if event.kind == "wait_started":
            client.signal(run.run_id, "documents_received", {"files": ["passport.pdf"]})
        elif event.kind == "approval_requested":
            waiting = client.get_run(run.run_id)
            assert waiting.open_requests == (
                OpenRequest("approve.approval", "approval", "approve", "", "onboarding.approve"),
            )
            assert waiting.unclaimable == ()
            request = waiting.open_requests[0].request_id
            client.approve(run.run_id, "approve", approver_grants=["onboarding.approve"], request_id=request)
    done = client.wait(run.run_id, timeout=30)
    assert done.status == "completed" and done.open_requests == ()

    # A tool only a worker of pool `nowhere` may call (tests/client-fixtures).
    stuck = client.start_run("client_unclaimable", {"email": "x@example.com"}, caller_grants=GRANTS).run
    watch_until(client, stuck.run_id, "tool_call_scheduled")
    (task,) = client.get_run(stuck.run_id).unclaimable
    assert task.kind == "tool_call" and task.task_id
    assert "pool:nowhere" in task.requires and task.missing == ("pool:nowhere",)
    assert task.reason == "no live worker has pool:nowhere"
    client.cancel(stuck.run_id)


def test_options_are_checked_and_unavailable_is_retried_then_raised() -> None:
    with pytest.raises(ConfigError, match="plaintext http://"):
        Client("http://127.0.0.1:1", ca_file="ca.pem")
    with pytest.raises(ConfigError, match="scheme"):
        Client("grpc://127.0.0.1:1")
    with pytest.raises(ConfigError, match="reading the CA file"):
        Client("https://127.0.0.1:1", ca_file="/nonexistent/ca.pem")
    with pytest.raises(ConfigError, match="go together"):
        Client("https://127.0.0.1:1", client_cert="cert.pem")
    policy = RetryPolicy(max_attempts=3, initial_backoff=0.2, max_backoff=0.2)
    started = time.monotonic()
    with Client("http://127.0.0.1:1", retry=policy) as nowhere:
        with pytest.raises(Unavailable) as e:
            nowhere.get_run("x")
    # Three attempts, two waits of 0.1 to 0.2 s (half-jittered) between them.
    assert time.monotonic() - started >= 0.2
    assert e.value.code == grpc.StatusCode.UNAVAILABLE


def test_answers_larger_than_grpcs_default_4_mib_are_read(client: Client) -> None:
    # Two runs of 2.5 MB inputs: a page of both is over grpcio's default
    # receive limit (4 MiB), which failed it RESOURCE_EXHAUSTED; the client
    # reads up to 64 MiB, as the Rust SDK and the TypeScript client do.
    notes = "x" * 2_500_000
    runs = [
        client.start_run("client_unclaimable", {"email": f"big{i}@example.com", "notes": notes}, caller_grants=GRANTS).run
        for i in range(2)
    ]
    try:
        page = client.list_runs(page_size=2)
        assert {r.run_id for r in page.runs} == {r.run_id for r in runs}
        assert all(r.input["notes"] == notes for r in page.runs)
    finally:
        for run in runs:
            client.cancel(run.run_id)


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: Client("http://127.0.0.1:1", timeout=0), "timeout must be a positive number of seconds, not 0"),
        (lambda: Client("http://127.0.0.1:1", timeout=-1.5), "timeout must be a positive number of seconds, not -1.5"),
        (lambda: Client("http://127.0.0.1:1", timeout=float("nan")), "timeout must be a positive number of seconds, not nan"),
        (lambda: RetryPolicy(max_attempts=0), "max_attempts must be at least 1, not 0"),
        (lambda: RetryPolicy(initial_backoff=-1), "0 <= initial_backoff <= max_backoff"),
        (lambda: RetryPolicy(max_elapsed=-1), "max_elapsed must not be negative"),
    ],
)
def test_a_timeout_or_retry_policy_that_cannot_work_is_a_config_error(make: Any, says: str) -> None:
    # As in TypeScript (client.test.ts); a timeout of 0 used to fail each call CANCELLED.
    with pytest.raises(ConfigError, match=re.escape(says)):
        make()


def test_the_readme_example_runs_as_written() -> None:
    example = Path(__file__).parent.parent / "examples" / "onboarding.py"
    out = subprocess.run([sys.executable, str(example)], env=os.environ, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("1 ") and any(line.endswith(" approval_requested") for line in lines)
    assert lines[-1].startswith("completed {"), out.stdout
