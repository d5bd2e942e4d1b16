"""The long-running path end to end: scheduler -> StartExecution -> the real worker.asl.json
(Acquire -> Parallel[run slices or a callback, renew loop] -> Report -> Handover? -> Ack,
Catch -> GiveBack) inside moto, each step the real steps Lambda, against sandbox servers.

Handlers live in tests/aws/handlers_long.py and record every run. Leases are short (3 s
on Pipelogiq) and the renew loop waits one second, so renewals really have to outlive
the lease for a job to finish.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import handlers_long
import pytest
from e2e_support import wait_for as poll

from serverless_worker.model import LedgerStatus, OutcomeKind
from serverless_worker.registry import default_registry
from serverless_worker.runtime import steps
from serverless_worker.runtime.entry import reset_services
from serverless_worker.state.items import LedgerItem, from_item
from support.waiting import HANG_SECONDS

Env = Any  # tests/aws/conftest.py's Env

pytestmark = pytest.mark.aws

PROTOCOLS = ("pipelogiq", "priostack", "claimqueue")
ASL_PATH = Path(__file__).resolve().parents[2] / "functions" / "statemachine" / "worker.asl.json"
LAMBDA_TRANSIENT = {"Lambda.ServiceException", "Lambda.AWSLambdaException", "Lambda.SdkClientException",
                    "Lambda.TooManyRequestsException"}


# --------------------------------------------------------------------------- fixtures and helpers


@pytest.fixture(autouse=True)
def _long_handlers() -> Iterator[None]:
    """Only this module's handlers, and a fresh run record, for each test."""
    with default_registry.isolated():
        handlers_long.RUNS.clear()
        handlers_long.RELEASE.clear()
        yield


@pytest.fixture
def long_env(worker_env: Callable[..., Env]) -> Callable[..., Env]:
    """An env loading handlers_long. Pipelogiq leases last the tier's 10 s unless a test asks
    for the 3 s lease it is about: a loaded CI box must not lose leases the test is not about."""

    def make(protocol: str, handlers: list[str], sandbox: dict[str, Any] | None = None,
             **options: Any) -> Env:
        return worker_env(protocol, handlers=handlers, handler_module="handlers_long", sandbox=sandbox,
                          **options)

    return make


def dispatch(env: Env, count: int = 1, tries: int = 4) -> None:
    """Tick until ``count`` executions have started: under load a tick's bootstrap and
    heartbeat can use up its whole window before it pulls."""
    for _ in range(tries):
        env.tick(2.0)
        if len(env.stack.executions()) >= count:
            return
    raise AssertionError(f"fewer than {count} executions after {tries} ticks")


def wait_for(check: Callable[[], Any], timeout: float = HANG_SECONDS, what: str = "condition") -> Any:
    return poll(check, timeout, what, interval=0.1)


def release_after_renewals(env: Env, monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    """Set ``handlers_long.RELEASE`` once the run's deadline has been renewed ``count`` times
    (the renew loop's cycles, and each slice's end): a handler waiting for it works through
    that many renewals, however long a loaded machine takes for each."""
    store = env.stack.store()
    real = store.renew_deadline

    def renew_deadline(*args: Any, **kwargs: Any) -> int:
        renewals = int(real(*args, **kwargs))
        if renewals >= count:
            handlers_long.RELEASE.set()
        return renewals

    monkeypatch.setattr(store, "renew_deadline", renew_deadline)


def ledger(env: Env) -> list[LedgerItem]:
    """Every ledger item, oldest first (a consistent scan of the table)."""
    raw = env.stack.dynamodb.scan(TableName=env.stack.table_name, ConsistentRead=True)["Items"]
    items = [LedgerItem.from_attributes(a) for a in map(from_item, raw) if a["pk"].startswith("delivery#")]
    return sorted(items, key=lambda item: item.recorded_at)


def executions(env: Env, timeout: float = HANG_SECONDS) -> list[dict[str, Any]]:
    """Wait until no execution runs (the limit only bounds a hang); each one described
    (input, output, error), oldest first."""
    listed = env.stack.wait_for_executions(timeout)
    described = [env.stack.sfn.describe_execution(executionArn=e["executionArn"]) for e in listed]
    return sorted(described, key=lambda d: d["startDate"])


def history_events(env: Env, execution: dict[str, Any]) -> list[dict[str, Any]]:
    return env.stack.sfn.get_execution_history(executionArn=execution["executionArn"])["events"]


def states_entered(env: Env, execution: dict[str, Any]) -> list[str]:
    return [e["stateEnteredEventDetails"]["name"] for e in history_events(env, execution)
            if "stateEnteredEventDetails" in e]


def steps_invoked(env: Env, step: str) -> list[dict[str, Any]]:
    name = env.stack.function_names["StepsFunction"]
    return [i.event for i in list(env.stack.lambdas.invocations)
            if i.function_name == name and isinstance(i.event, dict) and i.event.get("step") == step]


def the_job(env: Env) -> dict[str, Any]:
    jobs = env.admin.jobs()
    assert len(jobs) == 1, jobs
    return jobs[0]


def events_of(job: dict[str, Any], *names: str) -> list[dict[str, Any]]:
    return [h for h in job.get("history", []) if h["event"] in names]


def reports(env: Env) -> list[dict[str, Any]]:
    """Every result the server received for the one job, in one shape for all protocols:
    ``{"success", "value", "code"}`` (plus ``retryable`` / ``retries`` where the protocol has it)."""
    job = the_job(env)
    if env.protocol == "pipelogiq":
        return [{"success": h["isSuccess"], "code": h["errorCode"], "retryable": h["retryable"],
                 "value": json.loads(h["result"]) if h["isSuccess"] else h["result"]}
                for h in events_of(job, "result_received")]
    if env.protocol == "priostack":
        out = []
        for call in job["calls"]:
            body = call.get("body") or {}
            if call["action"] == "complete":
                out.append({"success": True, "value": body.get("variables"), "code": None})
            elif call["action"] == "fail":
                out.append({"success": False, "value": body.get("errorMessage"), "code": None,
                            "retries": body.get("retries")})
        return out
    return [{"success": "errorCode" not in h["value"], "value": h["value"],
             "code": h["value"].get("errorCode")} for h in events_of(job, "result")]


def revoke(env: Env, job_id: str) -> dict[str, Any]:
    return env.admin.revoke(job_id)


def assert_nothing_leaks(env: Env, secrets: list[str]) -> None:
    """None of ``secrets`` in any execution's input, output or history, nor in any invoke payload."""
    assert secrets and all(secrets)
    for listed in env.stack.executions():
        described = env.stack.sfn.describe_execution(executionArn=listed["executionArn"])
        texts = {"input": described.get("input") or "", "output": described.get("output") or "",
                 "cause": described.get("cause") or "",
                 "history": env.stack.history(listed["executionArn"])}
        for where, text in texts.items():
            for secret in secrets:
                assert secret not in text, f"a secret is in the {where} of {listed['name']}"
    for invocation in list(env.stack.lambdas.invocations):
        payload = json.dumps(invocation.event, default=str)
        for secret in secrets:
            assert secret not in payload, f"a secret is in an invoke payload of {invocation.function_name}"


def delivery_tokens(env: Env) -> list[str]:
    return [item.delivery.token.get_secret_value() for item in ledger(env) if item.delivery.token is not None]


# --------------------------------------------------------------------------- 1. renewals outlive the lease


def test_pipelogiq_renewals_outlive_a_short_lease(long_env: Callable[..., Env],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # A 6 s lease renewed every second: a 3 s one lapsed between two renew cycles on a loaded
    # 2-core machine (each cycle is a Wait, a Lambda task and a call). 9 s of work, and on until
    # 4 renewals, outlive it.
    env = long_env("pipelogiq", ["long-steady"], sandbox={"lease_seconds": 6})
    release_after_renewals(env, monkeypatch, 4)
    env.seed("long-steady", [{"seconds": 9, "tag": "steady", "until_released": True}])

    dispatch(env)
    (execution,) = executions(env)

    assert execution["status"] == "SUCCEEDED"
    job = the_job(env)
    assert job["status"] == "Completed" and job["pipelineStatus"] == "Completed"
    assert len(events_of(job, "lease_renewed")) >= 4  # 9 s of work under a 6 s lease
    assert events_of(job, "lease_refused", "lease_recovered", "lease_revoked") == []
    assert len(events_of(job, "execution_created")) == 1 and len(events_of(job, "lease_acquired")) == 1
    assert reports(env) == [{"success": True, "code": None, "retryable": None,
                             "value": {"slept": 9.0, "tag": "steady"}}]
    assert len(events_of(job, "result_applied")) == 1
    (run,) = handlers_long.runs_of("long-steady")
    assert not run["cancelled"] and run["finished"] - run["started"] >= 9
    (item,) = ledger(env)
    assert item.status is LedgerStatus.ACKNOWLEDGED and item.outcome is not None
    assert item.outcome.kind is OutcomeKind.SUCCESS
    assert len(steps_invoked(env, "run_slice")) == 1 and len(steps_invoked(env, "renew")) >= 4
    output = json.loads(execution["output"])
    assert output["run"]["renew_seconds"] == 1 and output["report"]["reported"] is True


def test_priostack_has_no_lease_so_the_renew_loop_keeps_the_ledger_deadline_fresh(
        long_env: Callable[..., Env], monkeypatch: pytest.MonkeyPatch) -> None:
    env = long_env("priostack", ["long-steady"])
    release_after_renewals(env, monkeypatch, 3)  # 7 s of work, and on until 3 renewals
    env.seed("long-steady", [{"seconds": 7, "tag": "steady", "until_released": True}])

    dispatch(env)
    wait_for(lambda: handlers_long.runs_of("long-steady"), what="the handler to start")
    first = wait_for(lambda: [i for i in ledger(env) if i.renewals >= 1], what="a renewal")[0]
    later = wait_for(lambda: [i for i in ledger(env) if i.renewals > first.renewals], what="a later renewal")[0]
    (execution,) = executions(env)

    assert later.status is LedgerStatus.RUNNING and first.deadline is not None and later.deadline is not None
    assert later.deadline > first.deadline and later.renewals > first.renewals
    assert later.deadline > time.time()  # the reaper would leave it alone
    assert execution["status"] == "SUCCEEDED"
    assert reports(env) == [{"success": True, "code": None, "value": {"slept": 7.0, "tag": "steady"}}]
    assert the_job(env)["state"] == "completed"
    (item,) = ledger(env)
    assert item.status is LedgerStatus.ACKNOWLEDGED and item.renewals >= 3


def test_claim_queue_lease_long_enough_for_the_job(long_env: Callable[..., Env]) -> None:
    """The claim queue has no renew endpoint: the lease the claim came with must cover the job."""
    env = long_env("claimqueue", ["long-steady"], sandbox={"lease_seconds": 30})
    env.seed("long-steady", [{"seconds": 5, "tag": "steady"}])

    dispatch(env)
    (execution,) = executions(env)

    assert execution["status"] == "SUCCEEDED"
    job = the_job(env)
    assert job["status"] == "finished" and job["attempts"] == 1
    assert [h["event"] for h in job["history"]] == ["created", "claim", "result"]
    assert reports(env) == [{"success": True, "code": None, "value": {"slept": 5.0, "tag": "steady"}}]
    assert ledger(env)[0].status is LedgerStatus.ACKNOWLEDGED


def test_claim_queue_lease_too_short_stops_the_handler_before_it_lapses(long_env: Callable[..., Env]) -> None:
    """A slice never outlives a lease it cannot renew: the handler is stopped (a timeout, so
    no result) before the lease lapses, and the queue offers the item again afterwards."""
    env = long_env("claimqueue", ["long-steady"], sandbox={"lease_seconds": 8})
    env.seed("long-steady", [{"seconds": 30, "tag": "too-long"}])

    dispatch(env)
    (execution,) = executions(env)

    assert execution["status"] == "SUCCEEDED"
    (run,) = handlers_long.runs_of("long-steady")
    assert run["cancelled"] and run["cancel_reason"] == "timeout"
    job = the_job(env)
    lease_until = job["history"][1]["lease"]["until"] / 1000
    assert run["cancelled_at"] < lease_until  # stopped while the lease was still ours
    assert reports(env) == []  # a timeout sends no result: the lease lapses
    (item,) = ledger(env)
    assert item.outcome is not None and item.outcome.kind is OutcomeKind.TIMEOUT
    wait_for(lambda: events_of(the_job(env), "lapse"), what="the lease to lapse")


# --------------------------------------------------------------------------- 2. continuation slices


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_continuation_job_runs_one_slice_per_invocation(long_env: Callable[..., Env],
                                                           protocol: str) -> None:
    env = long_env(protocol, ["long-pages"])
    env.seed("long-pages", [{"pages": 4, "tag": "pg"}])

    dispatch(env)
    (execution,) = executions(env)

    assert execution["status"] == "SUCCEEDED"
    runs = handlers_long.runs_of("long-pages")
    assert [r["checkpoint"] for r in runs] == [
        None,
        {"page": 1, "parts": ["pg-1"]},
        {"page": 2, "parts": ["pg-1", "pg-2"]},
        {"page": 3, "parts": ["pg-1", "pg-2", "pg-3"]},
    ]
    assert len(steps_invoked(env, "run_slice")) == 4  # each slice its own Lambda invocation
    (report,) = reports(env)
    assert report["success"] and report["value"] == {"pages": 4, "parts": ["pg-1", "pg-2", "pg-3", "pg-4"]}
    (item,) = ledger(env)
    assert item.status is LedgerStatus.ACKNOWLEDGED and item.checkpoint is None


def test_continue_delay_pauses_between_slices(long_env: Callable[..., Env]) -> None:
    env = long_env("pipelogiq", ["long-pages"])
    env.seed("long-pages", [{"pages": 3, "tag": "d", "delay": 1}])

    dispatch(env)
    (execution,) = executions(env)

    assert execution["status"] == "SUCCEEDED"
    starts = [r["started"] for r in handlers_long.runs_of("long-pages")]
    assert len(starts) == 3 and all(b - a >= 1.0 for a, b in itertools.pairwise(starts))
    assert states_entered(env, execution).count("PauseBeforeSlice") == 2
    assert reports(env)[0]["value"] == {"pages": 3, "parts": ["d-1", "d-2", "d-3"]}


# --------------------------------------------------------------------------- 3. refused renewal


def test_a_refused_renewal_cancels_the_handler_and_server_recovery_runs_it_again(
        long_env: Callable[..., Env]) -> None:
    env = long_env("pipelogiq", ["long-steady"])
    env.seed("long-steady", [{"seconds": 60, "retry_seconds": 1, "tag": "revoked"}])
    dispatch(env)
    wait_for(lambda: events_of(the_job(env), "lease_renewed"), what="a first renewal")
    first_execution = the_job(env)["executions"][0]["executionId"]

    revoke(env, the_job(env)["job_id"])
    (execution,) = executions(env)

    assert execution["status"] == "SUCCEEDED"  # a definite end, through Report (discard)
    (run,) = handlers_long.runs_of("long-steady")
    assert run["cancelled"] and run["cancel_reason"] == "lease_lost"
    assert run["cancelled_at"] - run["started"] < 30
    job = the_job(env)
    refusals = events_of(job, "lease_refused")
    assert refusals and refusals[0]["op"] == "renew"
    assert refusals[0]["reason"] in ("lease_expired", "stale_execution")
    assert events_of(job, "result_received") == []  # no result from a run that lost its lease
    acks = [h for h in events_of(job, "ack", "requeue") if h["executionId"] == first_execution]
    assert [h["event"] for h in acks] == ["ack"]  # discarded: ack without requeue
    (item,) = ledger(env)
    assert item.status is LedgerStatus.DISCARDED and item.error == "lease lost while running"
    assert item.outcome is not None and item.outcome.kind is OutcomeKind.LEASE_LOST
    assert item.cancel_reason is not None and "renewal refused" in item.cancel_reason
    overview = env.admin.overview()
    worker_events = overview["workers"][0]["events"]
    assert any(e["eventType"] == "job.lease_lost" for e in worker_events)

    # The server recovered the stage with a new execution; the next tick runs that one.
    recovery = wait_for(lambda: [e for e in the_job(env)["executions"] if e["cause"] == "recovery"],
                        what="the server's recovery")[0]
    dispatch(env, count=2)
    wait_for(lambda: the_job(env)["status"] == "Completed", what="the recovered execution to complete")
    executions(env)
    second = handlers_long.runs_of("long-steady")[1]
    assert second["attempt"] == 2 and not second["cancelled"]
    applied = events_of(the_job(env), "result_applied")
    assert [h["executionId"] for h in applied] == [recovery["executionId"]]
    assert [i.status for i in ledger(env)] == [LedgerStatus.DISCARDED, LedgerStatus.ACKNOWLEDGED]


def test_a_refused_renewal_ends_a_callback_wait_at_once(long_env: Callable[..., Env]) -> None:
    """The task token belongs to the execution: a lost lease fails the waiting task now
    (LeaseLost) instead of leaving it to its 60 s timeout, and nothing is reported."""
    env = long_env("pipelogiq", ["long-callback-patient"])
    env.seed("long-callback-patient", [{}])
    dispatch(env)
    wait_for(lambda: events_of(the_job(env), "lease_renewed"), what="a first renewal")
    revoked_at = time.monotonic()

    revoke(env, the_job(env)["job_id"])
    (execution,) = executions(env)

    assert execution["status"] == "SUCCEEDED" and time.monotonic() - revoked_at < 15
    failed = [e["taskFailedEventDetails"]["error"] for e in history_events(env, execution)
              if e["type"] == "TaskFailed"]
    assert failed == ["LeaseLost"]
    assert events_of(the_job(env), "result_received") == []
    (item,) = ledger(env)
    assert item.status is LedgerStatus.DISCARDED and item.outcome is not None
    assert item.outcome.kind is OutcomeKind.LEASE_LOST


# --------------------------------------------------------------------------- 4. waitForTaskToken


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("mode", ["success", "failure", "never"])
def test_a_callback_handler_ends_with_the_callbacks_outcome(long_env: Callable[..., Env], protocol: str,
                                                            mode: str) -> None:
    env = long_env(protocol, ["long-callback"])
    env.seed("long-callback", [{"mode": mode, "delay": 0.5, "tag": f"cb-{mode}"}])
    started = time.monotonic()

    dispatch(env)
    (execution,) = executions(env)

    assert execution["status"] == "SUCCEEDED"
    assert time.monotonic() - started < 20  # "never" ends by the task's 4 s timeout
    (run,) = handlers_long.runs_of("long-callback")
    assert run["callback_token"]
    run_info = json.loads(execution["output"])["run"]
    assert run_info["mode"] == "callback" and run_info["callback_timeout_seconds"] == 4
    assert 0 < run_info["callback_heartbeat_seconds"] < run_info["callback_timeout_seconds"]
    assert "StartCallback" in states_entered(env, execution)
    (item,) = ledger(env)
    assert item.status is LedgerStatus.ACKNOWLEDGED and item.outcome is not None
    assert item.callback_token == run["callback_token"]
    results = reports(env)
    if mode == "success":
        assert item.outcome.kind is OutcomeKind.SUCCESS
        expected = {"external": "done", "tag": "cb-success"}
        assert results == [{**results[0], "success": True, "value": expected}]
        return
    if mode == "failure":
        assert item.outcome.kind is OutcomeKind.FAILURE and item.outcome.error_code == "ExternalFailed"
    else:
        assert item.outcome.kind is OutcomeKind.TIMEOUT and item.outcome.error_code == "CALLBACK_TIMEOUT"
        assert "CallbackFailed" in states_entered(env, execution)
    if protocol == "claimqueue" and mode == "never":
        assert results == []  # a timeout sends nothing; the lease lapses
        return
    (result,) = results
    assert result["success"] is False
    if protocol == "pipelogiq":
        assert result["retryable"] is True
        assert result["code"] == ("ExternalFailed" if mode == "failure" else "HANDLER_TIMEOUT")
    elif protocol == "priostack":
        assert result["retries"] == 2  # an attempt used
    else:
        assert result["code"] == "ExternalFailed"


# --------------------------------------------------------------------------- 5. continue-as-new


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_run_continues_as_a_new_execution_before_the_history_fills_up(
        long_env: Callable[..., Env], monkeypatch: pytest.MonkeyPatch, protocol: str) -> None:
    monkeypatch.setattr(steps, "MAX_RENEW_CYCLES", 4)
    short_lease = {"lease_seconds": 5} if protocol == "pipelogiq" else None  # shorter than the job
    env = long_env(protocol, ["long-pages"], sandbox=short_lease)
    # The first slice lasts until the renew loop has made 5 cycles (counted, not timed: a
    # loaded machine's cycles take longer than their 1 s Wait), so the run hands over at its
    # boundary; the fast slices of the continued execution stay far below the limit.
    release_after_renewals(env, monkeypatch, steps.MAX_RENEW_CYCLES + 1)
    env.seed("long-pages", [{"pages": 3, "tag": "h", "first_slice_until_released": True}])

    dispatch(env)
    first, second = wait_for(lambda: len(env.stack.executions()) == 2 and executions(env),
                             what="the continued execution")

    assert first["status"] == "SUCCEEDED" and second["status"] == "SUCCEEDED"
    assert "ContinueAsNew" in states_entered(env, first)
    assert "ContinueAsNew" not in states_entered(env, second)
    first_input, second_input = json.loads(first["input"]), json.loads(second["input"])
    assert first_input["handover_epoch"] is None
    (item,) = ledger(env)
    assert second_input == {"ledger_key": first_input["ledger_key"], "handover_epoch": item.epoch}
    assert item.epoch != first["executionArn"]
    assert json.loads(second["output"])["run"]["epoch"] == item.epoch
    runs = handlers_long.runs_of("long-pages")
    assert [r["checkpoint"] for r in runs] == [None, {"page": 1, "parts": ["h-1"]},
                                               {"page": 2, "parts": ["h-1", "h-2"]}]
    # Each slice its own invocation; the first under the first execution's epoch, the last
    # (and every one after the handover) under the successor epoch the second one holds.
    epochs = [event["epoch"] for event in steps_invoked(env, "run_slice")]
    assert len(epochs) == 3 and epochs[0] == first["executionArn"] and epochs[-1] == item.epoch
    assert epochs == sorted(epochs, key=[first["executionArn"], item.epoch].index)
    assert reports(env) == [{**reports(env)[0], "success": True,
                             "value": {"pages": 3, "parts": ["h-1", "h-2", "h-3"]}}]
    assert item.status is LedgerStatus.ACKNOWLEDGED
    if protocol == "pipelogiq":  # the 5 s lease survived the handover: renewed, never acquired again
        job = the_job(env)
        assert len(events_of(job, "lease_acquired")) == 1
        assert events_of(job, "lease_refused", "lease_recovered") == []
        handed_over = min(e["timestamp"] for e in history_events(env, second)).timestamp()
        assert [e for e in events_of(job, "lease_renewed") if e["at"] > handed_over]
        assert len(events_of(job, "result_applied")) == 1


# --------------------------------------------------------------------------- 6. give back


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_crash_mid_run_ends_in_give_back_with_a_failure(
        long_env: Callable[..., Env], monkeypatch: pytest.MonkeyPatch, protocol: str) -> None:
    real = steps.STEPS["run_slice"]
    calls: list[int] = []

    def crashing(services: Any, event: dict[str, Any], context: Any) -> dict[str, Any]:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected crash in run_slice")
        return real(services, event, context)

    monkeypatch.setitem(steps.STEPS, "run_slice", crashing)
    # After the pull that finds the job, the tick waits past its window: the server's retry
    # of the failed job (Priostack puts it back with retries left) is for a later tick.
    env = long_env(protocol, ["long-pages"], settings={"poll_backoff_seconds": 5.0})
    env.seed("long-pages", [{"pages": 3, "tag": "c"}])

    dispatch(env)
    (execution,) = executions(env)

    assert execution["status"] == "FAILED" and execution["error"] == "JobGivenBack"
    assert "GiveBack" in states_entered(env, execution)
    assert len(handlers_long.runs_of("long-pages")) == 1
    (item,) = ledger(env)
    assert item.status is LedgerStatus.ACKNOWLEDGED and item.outcome is not None
    assert item.outcome.kind is OutcomeKind.FAILURE and item.outcome.error_code == "STATE_MACHINE_ERROR"
    (result,) = reports(env)
    assert result["success"] is False
    if protocol == "pipelogiq":
        assert result["code"] == "STATE_MACHINE_ERROR" and result["retryable"] is True
    elif protocol == "priostack":
        assert result["retries"] == 2
    else:
        assert result["code"] == "STATE_MACHINE_ERROR"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_unstarted_delivery_is_handed_back_and_runs_later(
        long_env: Callable[..., Env], monkeypatch: pytest.MonkeyPatch, protocol: str) -> None:
    """The first execution fails before the lease: HandBack returns the delivery without
    using an attempt, the server delivers it again, and the next execution runs it once."""
    real = steps.STEPS["acquire"]
    calls: list[int] = []

    def failing_once(services: Any, event: dict[str, Any], context: Any) -> dict[str, Any]:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected failure before the lease")
        return real(services, event, context)

    monkeypatch.setitem(steps.STEPS, "acquire", failing_once)
    lapses_soon = {"lease_seconds": 6} if protocol == "claimqueue" else None
    env = long_env(protocol, ["long-steady"], sandbox=lapses_soon)
    env.seed("long-steady", [{"seconds": 0.2, "tag": "later"}])

    dispatch(env)
    executions(env)
    if protocol == "claimqueue":  # no release call: the item comes back when its lease lapses
        wait_for(lambda: events_of(the_job(env), "lapse"), what="the lease to lapse")
    if len(env.stack.executions()) < 2:  # not delivered again within the first tick's window
        dispatch(env, count=2)
    first, second = executions(env)

    assert first["status"] == "FAILED" and first["error"] == "JobGivenBack"
    assert "HandBack" in states_entered(env, first) and "Work" not in states_entered(env, first)
    assert second["status"] == "SUCCEEDED"
    (run,) = handlers_long.runs_of("long-steady")
    assert not run["cancelled"]
    job = the_job(env)
    items = ledger(env)
    assert items[-1].status is LedgerStatus.ACKNOWLEDGED
    if protocol == "pipelogiq":
        assert [h["event"] for h in events_of(job, "requeue", "ack")] == ["requeue", "ack"]
        assert len(events_of(job, "execution_created")) == 1  # the same execution, delivered again
        assert [r["success"] for r in reports(env)] == [True]
    elif protocol == "priostack":
        calls = [(c["action"], c["body"].get("retries")) for c in job["calls"]]
        assert calls == [("fail", 3), ("complete", None)]  # handed back without using an attempt
    else:
        assert job["attempts"] == 2 and [r["success"] for r in reports(env)] == [True]
        assert [i.status for i in items] == [LedgerStatus.HANDED_BACK, LedgerStatus.ACKNOWLEDGED]
    if protocol != "claimqueue":  # the same execution comes back under the same ledger key
        assert len(items) == 1 and items[0].error is None


class _Transient(RuntimeError):
    error_type = "Lambda.ServiceException"  # what the harness reports as the Lambda error name


def test_a_retried_acquire_reconciles_instead_of_refusing_its_own_lease(
        long_env: Callable[..., Env], monkeypatch: pytest.MonkeyPatch) -> None:
    """Acquire is not reentrant: the Retry of an acquire step whose first try took the lease
    (and then failed) must find the lease ours, not discard the job as lease_held."""
    real = steps.STEPS["acquire"]
    calls: list[int] = []

    def lost_answer(services: Any, event: dict[str, Any], context: Any) -> dict[str, Any]:
        calls.append(1)
        answer = real(services, event, context)
        if len(calls) == 1:
            raise _Transient("the answer of the first try was lost")
        return answer

    monkeypatch.setitem(steps.STEPS, "acquire", lost_answer)
    env = long_env("pipelogiq", ["long-steady"])
    env.seed("long-steady", [{"seconds": 1, "tag": "retried"}])

    dispatch(env)
    (execution,) = executions(env)

    assert execution["status"] == "SUCCEEDED" and len(calls) == 2
    job = the_job(env)
    assert len(events_of(job, "lease_acquired")) == 1 and events_of(job, "lease_refused") == []
    assert job["status"] == "Completed" and len(handlers_long.runs_of("long-steady")) == 1
    assert ledger(env)[0].status is LedgerStatus.ACKNOWLEDGED


def test_steps_of_a_stale_epoch_do_nothing(long_env: Callable[..., Env]) -> None:
    """A step from an execution that no longer owns the run (an older execution, one that was
    reaped or taken over) changes nothing; the live run finishes once. Every answer carries
    the keys the ASL's Choice states read."""
    env = long_env("pipelogiq", ["long-steady"])
    env.seed("long-steady", [{"seconds": 4, "tag": "live"}])
    dispatch(env)
    (running,) = wait_for(lambda: [i for i in ledger(env) if i.status is LedgerStatus.RUNNING], what="the run")
    stale = {"ledger_key": running.key, "epoch": "arn:aws:states:us-east-1:123456789012:execution:old:x"}

    def step(name: str, **extra: Any) -> dict[str, Any]:
        return dict(env.stack.invoke("StepsFunction", {"step": name, **stale, **extra}))

    assert step("run_slice") == steps._slice()
    assert step("renew") == {"finished": True}
    assert step("report")["handover"] is False
    assert step("finish_callback", output={"forged": True}) == steps._slice()
    assert step("continue_as_new") == {"handed_over": False}
    assert step("give_back", phase="run", error={"Error": "X"}) == {"action": "none", "reason": "not owned"}
    missing = {"ledger_key": "delivery#pipelogiq#missing:1", "epoch": "e"}
    assert env.stack.invoke("StepsFunction", {"step": "report", **missing}) == {"reported": False,
                                                                               "handover": False}

    (execution,) = executions(env)
    assert execution["status"] == "SUCCEEDED"
    assert reports(env) == [{"success": True, "code": None, "retryable": None,
                             "value": {"slept": 4.0, "tag": "live"}}]
    assert len(handlers_long.runs_of("long-steady")) == 1
    assert ledger(env)[0].status is LedgerStatus.ACKNOWLEDGED


# --------------------------------------------------------------------------- 7. secrets


SECRET_CREDENTIAL = "sw-long-Kq7Zt1Vx9Lm3Pr8Ns2"
SANDBOX_CREDENTIAL = {
    "pipelogiq": {"api_keys": {SECRET_CREDENTIAL: 12}},
    "priostack": {"api_keys": [SECRET_CREDENTIAL]},
    "claimqueue": {"tokens": [SECRET_CREDENTIAL]},
}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_secrets_and_payloads_never_reach_executions_or_invoke_payloads(
        long_env: Callable[..., Env], monkeypatch: pytest.MonkeyPatch, protocol: str) -> None:
    env = long_env(protocol, ["long-pages", "long-steady"], sandbox=SANDBOX_CREDENTIAL[protocol])
    monkeypatch.setenv("SW_API_KEY", SECRET_CREDENTIAL)
    reset_services()
    marker = "payload-marker-Hb4Jw8Qe"
    env.seed("long-pages", [{"pages": 2, "tag": marker}])
    env.seed("long-steady", [{"seconds": 1.5, "tag": marker}])

    dispatch(env, count=2)
    described = executions(env)

    assert len(described) == 2 and all(d["status"] == "SUCCEEDED" for d in described)
    assert all(item.status is LedgerStatus.ACKNOWLEDGED for item in ledger(env))
    secrets = [SECRET_CREDENTIAL, marker, *delivery_tokens(env)]
    if protocol == "pipelogiq":
        loaded = env.stack.store().load_session("pipelogiq", env.stack.env["SW_INSTANCE_ID"])
        assert loaded is not None
        secrets.append(loaded[0].token.get_secret_value())
        assert len(delivery_tokens(env)) == 2
    assert_nothing_leaks(env, secrets)


def test_secrets_stay_out_of_a_failed_execution_and_a_refused_renewal(
        long_env: Callable[..., Env], monkeypatch: pytest.MonkeyPatch) -> None:
    def crashing(services: Any, event: dict[str, Any], context: Any) -> dict[str, Any]:
        raise RuntimeError(f"injected crash for {event['ledger_key']}")

    monkeypatch.setitem(steps.STEPS, "report", crashing)
    sandbox = SANDBOX_CREDENTIAL["pipelogiq"]
    env = long_env("pipelogiq", ["long-steady"], sandbox=sandbox)
    monkeypatch.setenv("SW_API_KEY", SECRET_CREDENTIAL)
    reset_services()
    env.seed("long-steady", [{"seconds": 30, "tag": "secret-tag-Zy62"}])
    dispatch(env)
    wait_for(lambda: events_of(the_job(env), "lease_renewed"), what="a first renewal")
    revoke(env, the_job(env)["job_id"])
    (execution,) = executions(env)

    assert execution["status"] == "FAILED" and execution["error"] == "JobGivenBack"
    assert "injected crash" in env.stack.history(execution["executionArn"])
    (item,) = ledger(env)
    assert item.status is LedgerStatus.DISCARDED  # GiveBack settled the lost lease
    loaded = env.stack.store().load_session("pipelogiq", env.stack.env["SW_INSTANCE_ID"])
    assert loaded is not None
    assert_nothing_leaks(env, [SECRET_CREDENTIAL, "secret-tag-Zy62", loaded[0].token.get_secret_value(),
                               *delivery_tokens(env)])


# --------------------------------------------------------------------------- the ASL itself


def _paths(node: Any) -> Iterator[str]:
    """Every JSONPath a state reads: ``*.$`` parameters, Choice variables, ``*Path`` fields."""
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, str) and (key.endswith(".$") or key == "Variable" or
                                           (key.endswith("Path") and key not in ("ResultPath",))):
                yield value
            elif key not in ("Branches", "Catch", "Retry"):
                yield from _paths(value)
    elif isinstance(node, list):
        for value in node:
            yield from _paths(value)


def _successors(state: dict[str, Any]) -> list[tuple[str, str | None]]:
    """(next state, top-level key the transition adds) pairs."""
    out: list[tuple[str, str | None]] = []
    added = None
    if state["Type"] in ("Task", "Parallel"):
        # A result replacing the whole input ("$", the default) would drop the ledger key.
        assert "ResultPath" in state and state["ResultPath"] != "$", state
        added = state["ResultPath"].split(".")[1] if state["ResultPath"] is not None else None
    if "Next" in state:
        out.append((state["Next"], added))
    for rule in state.get("Choices", []):
        out.append((rule["Next"], None))
    if "Default" in state:
        out.append((state["Default"], None))
    for catch in state.get("Catch", []):
        assert catch.get("ResultPath", "$") != "$", catch
        out.append((catch["Next"], catch["ResultPath"].split(".")[1]))
    return out


def _check_machine(machine: dict[str, Any], entry_keys: set[str], produced: dict[str, set[str]],
                   problems: list[str], where: str) -> None:
    """Dataflow over every route: the top-level keys present on *all* routes into a state must
    hold every path it reads (AWS fails a missing path with States.Runtime)."""
    states = machine["States"]
    available: dict[str, set[str]] = {machine["StartAt"]: set(entry_keys)}
    work = [machine["StartAt"]]
    while work:
        name = work.pop()
        state = states[name]
        for target, added in _successors(state):
            assert target in states, f"{where}{name} -> unknown state {target}"
            keys = available[name] | ({added} if added else set())
            merged = keys if target not in available else available[target] & keys
            if target not in available or merged != available[target]:
                available[target] = merged
                work.append(target)
    unreachable = set(states) - set(available)
    assert not unreachable, f"{where}unreachable states {unreachable}"
    for name, state in states.items():
        for path in _paths({k: v for k, v in state.items() if k != "Branches"}):
            if not path.startswith("$.") or path.startswith("$$."):
                continue
            first, *rest = path[2:].split(".")
            if first not in available[name]:
                problems.append(f"{where}{name} reads {path}, absent on some route")
            elif rest and first in produced and rest[0] not in produced[first]:
                problems.append(f"{where}{name} reads {path}, which the step never returns")
        for branch in state.get("Branches", []):
            _check_machine(branch, available[name], produced, problems, f"{where}{name}/")


def test_the_asl_reads_only_paths_that_exist_on_every_route() -> None:
    asl = json.loads(ASL_PATH.read_text())
    produced = {
        "run": {"action", "epoch", "mode", "renew_seconds", "callback_timeout_seconds",
                "callback_heartbeat_seconds"},
        "slice": set(steps._slice()),
        "renewal": {"finished"},
        "report": {"reported", "handover"},
        "error": {"Error", "Cause"},
        "callback_error": {"Error", "Cause"},
    }
    problems: list[str] = []
    # The scheduler's (and continue_as_new's) execution input always has both keys.
    _check_machine(asl, {"ledger_key", "handover_epoch"}, produced, problems, "")
    assert problems == []


def test_the_asl_bounds_every_wait_and_catches_every_failure() -> None:
    asl = json.loads(ASL_PATH.read_text())
    top = asl["States"]
    branch_states = {name: state for parallel in top.values() for branch in parallel.get("Branches", [])
                     for name, state in branch["States"].items()}
    give_backs = {name for name, s in top.items()
                  if s["Type"] == "Task" and s.get("Parameters", {}).get("step") == "give_back"}
    assert give_backs == {"GiveBack", "HandBack"}
    for name, state in {**top, **branch_states}.items():
        if state["Type"] != "Task":
            continue
        resource = state["Resource"]
        if resource.endswith(".waitForTaskToken"):
            assert {"TimeoutSeconds", "TimeoutSecondsPath"} & set(state), name
            assert {"HeartbeatSeconds", "HeartbeatSecondsPath"} & set(state), name
            assert any("States.ALL" in c["ErrorEquals"] for c in state["Catch"]), name
        elif name not in give_backs:
            retried = {e for r in state.get("Retry", []) for e in r["ErrorEquals"]}
            assert retried >= LAMBDA_TRANSIENT, f"{name} does not retry transient Lambda errors"
        if name in top and name not in give_backs:
            assert any(c["ErrorEquals"] == ["States.ALL"] and c["Next"] in give_backs
                       for c in state.get("Catch", [])), f"{name} has no way to the give-back"
        if name in give_backs:
            assert state["Retry"] and state["Next"] == "GaveBack"
    assert any(c["Next"] == "GiveBack" for c in top["Work"]["Catch"])
    assert top["Acquire"]["Catch"][0]["Next"] == "HandBack"
