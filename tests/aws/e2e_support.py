"""Reading the two sides of an end-to-end run: the sandbox's own job histories and the
ledger in the emulated DynamoDB table. Shared by test_short_path, test_recovery and
test_drain.

Each protocol's sandbox describes jobs its own way; the helpers here turn that into the
few facts the tests assert on (job id, the outcomes the server received, whether the
job is done, how many deliveries were unsettled at once). The one scenario two files run
(an executor dying between storing and reporting its outcome: test_recovery, and the
reliability suite's fault matrix) lives here too.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
import requests

from serverless_worker.model import LedgerStatus
from serverless_worker.runtime.context import LocalContext
from serverless_worker.runtime.scheduler import Scheduler, TickReport
from serverless_worker.sandbox.admin import job_id
from serverless_worker.state import LedgerItem
from serverless_worker.state.items import from_item
from support.waiting import poll, wait_for

__all__ = [
    "HANDLERS_PATH",
    "PROTOCOLS",
    "LambdaCrash",
    "backdate",
    "crash_between_storing_and_reporting",
    "done",
    "http_calls_per_job",
    "in_flight",
    "instance",
    "job_id",
    "jobs_by_id",
    "ledger",
    "replace_session_once_running",
    "results",
    "run_until",
    "take_background_errors",
    "tick_with",
    "unsettled_peak",
    "wait_for",
]

PROTOCOLS = ("pipelogiq", "priostack", "claimqueue")
HANDLERS_PATH = str(Path(__file__).resolve().parent / "handlers_e2e.py")
_SETTLED = ("ack", "requeue", "visibility_requeue")  # Pipelogiq history events that end a delivery


# -- the sandbox's side ------------------------------------------------------------------
def jobs_by_id(env: Any) -> dict[str, dict[str, Any]]:
    return {job_id(env.protocol, job): job for job in env.admin.jobs()}


def results(protocol: str, job: dict[str, Any]) -> list[dict[str, Any]]:
    """Every outcome the server received for the job and applied (in order):
    Pipelogiq result posts, Priostack complete/fail calls that applied, claim-queue
    result posts (accepted or not)."""
    if protocol == "pipelogiq":
        return [h for h in job["history"] if h["event"] == "result_received"]
    if protocol == "priostack":
        return [c for c in job["calls"] if c.get("applied")]
    return [h for h in job["history"] if h["event"] == "result"]


def done(protocol: str, job: dict[str, Any]) -> bool:
    """Completed successfully on the server (and, for Pipelogiq, the delivery acked)."""
    if protocol == "pipelogiq":
        return job["status"] == "Completed" and any(h["event"] == "ack" for h in job["history"])
    if protocol == "priostack":
        return bool(job["state"] == "completed")
    return bool(job["status"] == "finished")


def unsettled_peak(protocol: str, jobs: Iterable[dict[str, Any]]) -> int:
    """The most deliveries the server had handed out and not yet seen settled, at once.

    Pipelogiq: a delivery token is out from ``delivered`` until its ``ack``/``requeue``
    (or the visibility sweep). Priostack: a job is out from its activation until a
    complete/fail applies (duplicate activations hand out nothing new). Claim queue: an
    item is out from its claim until its result, a lapse or the queue's timeout.
    """
    edges: list[tuple[float, int]] = []
    for job in jobs:
        if protocol == "pipelogiq":
            open_at: dict[str, float] = {}
            for h in job["history"]:
                if h["event"] == "delivered":
                    open_at[h["tokenFingerprint"]] = h["at"]
                elif h["event"] in _SETTLED and h["tokenFingerprint"] in open_at:
                    edges += [(open_at.pop(h["tokenFingerprint"]), 1), (h["at"], -1)]
            edges += [(at, 1) for at in open_at.values()]
        elif protocol == "priostack":
            starts = sorted(a["at"] for a in job["activations"] if not a["duplicate"])
            ends = sorted(c["at"] for c in job["calls"] if c.get("applied"))
            edges += [(at, 1) for at in starts] + [(at, -1) for at in ends[:len(starts)]]
        else:
            for h in job["history"]:
                if h["event"] == "claim":
                    edges.append((h["at"], 1))
                elif h["event"] in ("lapse", "timeout", "socket_drop_requeue") or (
                        h["event"] == "result" and h["accepted"] and h.get("item_was") == "processing"):
                    edges.append((h["at"], -1))
    peak = current = 0
    for _at, delta in sorted(edges, key=lambda e: (e[0], e[1])):  # at a tie, settle first
        current += delta
        peak = max(peak, current)
    return peak


def http_calls_per_job(env: Any, jobs: int) -> dict[str, float]:
    """The sandbox's HTTP call counts per endpoint label, divided by the number of jobs."""
    calls = env.admin.stats()["calls"]
    return {label: round(count / jobs, 3) for label, count in sorted(calls.items())}


# -- the worker's side -------------------------------------------------------------------
def instance(env: Any) -> str:
    return str(env.stack.env["SW_INSTANCE_ID"])


def replace_session_once_running(env: Any, recorder: Any, count: int) -> threading.Thread:
    """Start a thread that, once ``count`` gated handlers (``e2e.gate``) run at once, bootstraps
    the same Pipelogiq instance again (the server replaces the worker's token: every holder of
    the old one meets 401 "replaced") and then releases them, so each one's next call meets
    the new token however slowly its executor started. Join it when the jobs are done."""

    def replace() -> None:
        try:
            if recorder.wait_active(count):
                requests.post(f"{env.server.url}/workers/bootstrap", timeout=5,
                              headers={"X-API-Key": "sandbox-api-key"},
                              json={"workerName": "intruder", "instanceId": instance(env)}).raise_for_status()
        finally:
            recorder.release.set()  # the handlers return (and report with the replaced token)

    intruder = threading.Thread(target=replace, daemon=True)
    intruder.start()
    return intruder


def ledger(env: Any) -> list[LedgerItem]:
    """Every ledger item in the table (a scan: the table holds one test's items only)."""
    stack = env.stack
    items: list[LedgerItem] = []
    request: dict[str, Any] = {"TableName": stack.table_name, "FilterExpression": "sk = :kind",
                               "ExpressionAttributeValues": {":kind": {"S": "delivery"}}}
    while True:
        page = stack.dynamodb.scan(**request)
        items += [LedgerItem.from_attributes(from_item(raw)) for raw in page.get("Items", [])]
        if "LastEvaluatedKey" not in page:
            return items
        request["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def in_flight(env: Any) -> int:
    """What the scheduler counts: the in-flight index of this worker instance."""
    return int(env.stack.store().count_in_flight(env.protocol, instance(env)))


def backdate(env: Any, key: str) -> None:
    """Move a ledger item's deadline into the past: time passing, without the wait (a run's
    deadline is the executor's whole Lambda timeout plus a grace). Both the index's
    ``deadline`` and the item's own ``due`` move (docs/ledger.md, write units)."""
    env.stack.dynamodb.update_item(
        TableName=env.stack.table_name, Key={"pk": {"S": key}, "sk": {"S": "delivery"}},
        UpdateExpression="SET #deadline = :past, #due = :past", ConditionExpression="attribute_exists(#deadline)",
        ExpressionAttributeNames={"#deadline": "deadline", "#due": "due"},
        ExpressionAttributeValues={":past": {"N": repr(time.time() - 1)}})


# -- driving -------------------------------------------------------------------------------
def run_until(env: Any, predicate: Callable[[], bool], *, what: str, window: float = 1.5,
              ticks: int = 4, settle: float = 0.5) -> list[dict[str, Any]]:
    """Tick, let every executor finish, and repeat until ``predicate`` holds (within
    ``settle`` seconds after a tick; Pipelogiq applies results asynchronously)."""
    reports: list[dict[str, Any]] = []
    for _ in range(ticks):
        reports.append(env.tick(window))
        env.stack.wait_idle()
        if poll(predicate, settle):
            return reports
    raise AssertionError(f"{what}: not reached after {ticks} ticks; reports: {reports}")


def tick_with(env: Any, window: float, *, sleep: Callable[[float], None],
              clock: Callable[[], float] | None = None, room_wait_max: float | None = None) -> TickReport:
    """One tick of a Scheduler on the stack's services, outside its Lambda, waiting through
    ``sleep``. With ``clock`` (``tick_clock``, its ``sleep`` moved by the waits) the tick alone
    runs on that clock: its window is the tick's own time, whatever the machine's load, and
    the executors it starts keep the stack's services and the real clock."""
    services = env.stack.services()
    if clock is not None:
        services = dataclasses.replace(services, clock=clock)
    scheduler = Scheduler(services, sleep=sleep)
    if room_wait_max is not None:
        scheduler.room_wait_max = room_wait_max
    try:
        return scheduler.tick(LocalContext("scheduler", timeout_seconds=120), window=window)
    finally:
        scheduler.close()
        if clock is not None:
            services.close()


def take_background_errors(env: Any, kind: str, count: int) -> None:
    """The invocations that died on purpose: check them and clear them (the harness
    re-raises any left over when the stack closes)."""
    errors = env.stack.lambdas.background_errors
    assert [type(e).__name__ for e in errors] == [kind] * count, errors
    errors.clear()


# -- a scenario ----------------------------------------------------------------------------
class LambdaCrash(RuntimeError):
    """The executor's sandbox dies: the Event invocation ends with an unhandled error."""


def crash_between_storing_and_reporting(worker_env: Callable[..., Any], recorder: Any,
                                        monkeypatch: pytest.MonkeyPatch, protocol: str) -> Any:
    """Two executors die right after storing their outcomes; one is invoked again and
    re-reports, the reaper re-reports the other; each job has exactly one result on the
    server and ran once. Returns the finished environment."""
    # A Pipelogiq lease longer than the test, so the server's own lease recovery (a new
    # execution) cannot stand in for the re-report being tested.
    sandbox = {"lease_seconds": 20} if protocol == "pipelogiq" else None
    env = worker_env(protocol, handlers=["e2e.echo"], handler_module=HANDLERS_PATH, sandbox=sandbox)
    env.seed("e2e.echo", [{"n": 1}, {"n": 2}])
    store = env.stack.store()
    real_store_outcome = store.store_outcome

    def store_then_crash(key: str, epoch: str, outcome: Any) -> None:
        real_store_outcome(key, epoch, outcome)
        raise LambdaCrash("the executor died right after storing its outcome")

    monkeypatch.setattr(store, "store_outcome", store_then_crash)
    first = env.tick(2.0)
    env.stack.wait_idle()
    monkeypatch.setattr(store, "store_outcome", real_store_outcome)

    assert first["dispatched"] == 2
    take_background_errors(env, "LambdaCrash", 2)
    assert Counter(item.status for item in ledger(env)) == {LedgerStatus.OUTCOME_STORED: 2}
    assert all(not results(protocol, job) for job in env.admin.jobs())  # nothing reported yet
    assert sum(recorder.counts().values()) == 2
    reinvoked, reaped = sorted(item.key for item in ledger(env))

    # The executor invoked again with the same event re-reports the stored outcome.
    answer = env.stack.invoke("ExecutorFunction", {"ledger_key": reinvoked})
    assert answer["action"] == "reported" and answer["resumed"] is True, answer
    # The reaper settles the other once its deadline passes.
    backdate(env, reaped)
    second = env.tick(1.2)
    env.stack.wait_idle()
    assert second["reaped"] == 1 and second["pulled"] == 0, second

    wait_for(lambda: all(done(protocol, j) for j in env.admin.jobs()), what="both jobs done")
    jobs = jobs_by_id(env)
    for job in jobs.values():
        assert len(results(protocol, job)) == 1, job  # exactly one result on the server
        if protocol == "pipelogiq":
            assert len(job["executions"]) == 1
    assert recorder.counts() == Counter({job_id: 1 for job_id in jobs})  # never run again
    return env
