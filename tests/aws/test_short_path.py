"""The short path end to end (scheduler tick -> Lambda async Invoke -> executor), through
moto running the project's real function code against the three sandboxes.

Every test reads both sides: the sandbox's own job history (what the server saw) and
the ledger in the emulated state table (what the worker recorded).
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Any

import pytest
from e2e_support import (
    HANDLERS_PATH,
    PROTOCOLS,
    done,
    http_calls_per_job,
    in_flight,
    job_id,
    jobs_by_id,
    ledger,
    results,
    run_until,
    unsettled_peak,
    wait_for,
)

from serverless_worker.model import LedgerStatus

pytestmark = pytest.mark.aws


def _all_acknowledged(env: Any, count: int) -> None:
    items = ledger(env)
    assert len(items) == count
    assert Counter(item.status for item in items) == {LedgerStatus.ACKNOWLEDGED: count}
    assert in_flight(env) == 0


# -- 1. one tick, fifty jobs ---------------------------------------------------------------------
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_one_tick_gets_fifty_jobs_done(worker_env: Any, recorder: Any, protocol: str) -> None:
    # One pull batch of 50: the emulated fan-out is slower than Lambda's, and a tick of a
    # few seconds must not depend on how many batches fit in it.
    env = worker_env(protocol, handlers=["e2e.echo"], handler_module=HANDLERS_PATH,
                     settings={"batch_size": 50})
    inputs = [{"n": i} for i in range(50)]
    env.seed("e2e.echo", inputs)

    report = env.tick(2.5)

    assert report["pulled"] == 50 and report["dispatched"] == 50, report
    assert report["duplicates"] == report["dispatch_failed"] == report["reaped"] == 0 and not report["errors"]
    env.stack.wait_idle()
    wait_for(lambda: all(done(protocol, job) for job in env.admin.jobs()), what="all 50 jobs done")

    jobs = jobs_by_id(env)
    assert len(jobs) == 50
    outputs = []
    for job in jobs.values():
        received = results(protocol, job)
        assert len(received) == 1, job          # exactly one final outcome on the server
        if protocol == "pipelogiq":
            events = Counter(h["event"] for h in job["history"])
            assert events["delivered"] == events["lease_acquired"] == events["result_applied"] == 1, events
            assert events["ack"] == 1 and events["requeue"] == 0 and len(job["executions"]) == 1, events
            assert received[0]["isSuccess"] is True and job["status"] == "Completed"
            outputs.append(json.loads(job["output"]))
        elif protocol == "priostack":
            assert len(job["activations"]) == 1 and received[0]["action"] == "complete"
            assert job["state"] == "completed" and job["instance"]["state"] == "COMPLETED"
            outputs.append(received[0]["body"]["variables"])
        else:
            assert job["attempts"] == 1 and received[0]["accepted"] is True and job["status"] == "finished"
            outputs.append(job["result"])
    assert sorted(outputs, key=lambda o: o["n"]) == inputs
    assert recorder.counts() == Counter({job_id: 1 for job_id in jobs})  # the handler ran once per job
    _all_acknowledged(env, 50)

    per_job = http_calls_per_job(env, 50)
    print(f"\n[{protocol}] HTTP calls per job over 50 jobs, by endpoint: {per_job} "
          f"(total {sum(per_job.values()):.2f})")


# -- 3. backpressure at max in flight ----------------------------------------------------------------
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_backpressure_holds_max_in_flight(worker_env: Any, recorder: Any, protocol: str) -> None:
    limit, count = 5, 10
    env = worker_env(protocol, handlers=["e2e.slow"], handler_module=HANDLERS_PATH,
                     settings={"max_in_flight": limit})
    env.seed("e2e.slow", [{"sleep": 0.3, "n": i} for i in range(count)])
    ledger_peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal ledger_peak
        while not stop.is_set():
            ledger_peak = max(ledger_peak, in_flight(env))
            stop.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        reports = run_until(env, lambda: sum(done(protocol, j) for j in env.admin.jobs()) == count,
                            what="all slow jobs done", window=2.0, ticks=3)
    finally:
        stop.set()
        sampler.join(5)

    assert sum(r["full_waits"] for r in reports) >= 1, reports  # the limit was reached and held
    assert recorder.max_active <= limit and ledger_peak <= limit
    assert ledger_peak == limit, ledger_peak
    jobs = jobs_by_id(env)
    assert unsettled_peak(protocol, jobs.values()) == limit  # the server never had more out to us
    assert recorder.counts() == Counter({job_id: 1 for job_id in jobs})
    _all_acknowledged(env, count)


# -- 7. duplicate deliveries ------------------------------------------------------------------------
_PULL_LABEL = {"pipelogiq": "pull", "priostack": "activate", "claimqueue": "claim"}


def _sandbox_duplicates(protocol: str, jobs: dict[str, dict[str, Any]]) -> int:
    """Deliveries the sandbox handed out again while the first was still ours."""
    if protocol == "pipelogiq":
        return sum(sum(h["event"] == "delivered" for h in job["history"]) - 1 for job in jobs.values())
    if protocol == "priostack":
        return sum(a["duplicate"] for job in jobs.values() for a in job["activations"])
    return sum(h["event"] == "duplicate_delivery" for job in jobs.values() for h in job["history"])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_duplicate_deliveries_are_acknowledged_and_discarded(worker_env: Any, recorder: Any,
                                                             protocol: str) -> None:
    # Priostack duplicates only a job that is still active when the next activation comes
    # (after a 1 s empty-poll backoff), so its handler outlasts that; one duplicate there.
    duplicates = 1 if protocol == "priostack" else 2
    sleep = 1.5 if protocol == "priostack" else 0.2
    env = worker_env(protocol, handlers=["e2e.slow"], handler_module=HANDLERS_PATH)
    env.seed("e2e.slow", [{"sleep": sleep, "n": i} for i in range(4)])
    env.admin.faults([{"kind": "duplicate_delivery", "endpoint": _PULL_LABEL[protocol], "count": duplicates}])

    reports = run_until(env, lambda: all(done(protocol, j) for j in env.admin.jobs()), what="all jobs done",
                        window=2.5 if protocol == "priostack" else 1.5)

    jobs = jobs_by_id(env)
    assert _sandbox_duplicates(protocol, jobs) == duplicates
    assert sum(r["duplicates"] for r in reports) == duplicates  # each one recognised by the ledger
    for job in jobs.values():
        assert len(results(protocol, job)) == 1, job
        if protocol == "pipelogiq":
            # Every token, the duplicates' too, was settled: acked without requeue.
            events = Counter(h["event"] for h in job["history"])
            assert events["ack"] == events["delivered"] and events["requeue"] == 0, events
            assert events["lease_acquired"] == 1 and events["lease_refused"] == 0, events
    assert recorder.counts() == Counter({job_id: 1 for job_id in jobs})  # each job ran once
    _all_acknowledged(env, 4)  # duplicates get no ledger item of their own


# -- 8 and 9. bad input, unknown handler, business rejection, plain exception ---------------------
_OUTCOME_HANDLERS = ["e2e.validated", "e2e.ghost", "e2e.reject", "e2e.boom"]  # e2e.ghost: no such handler


def _seed_outcomes(env: Any) -> None:
    env.seed("e2e.validated", [{"orderId": "o-1", "amount": 12.5}])
    env.seed("e2e.validated", [{"orderId": "", "amount": -1}])         # fails the Order model
    if env.protocol == "pipelogiq":
        env.seed("e2e.ghost", [{"x": 1}])
        env.seed("e2e.reject", [{"sku": "sku-9"}])
        env.seed("e2e.boom", [{"n": 1}], maxRetries=1, retryInterval=0)  # retryable: one retry
    else:
        env.seed("e2e.ghost", [{"x": 1}], retries=1)
        env.seed("e2e.reject", [{"sku": "sku-9"}])
        env.seed("e2e.boom", [{"n": 1}], retries=2)                       # Priostack: fails 2 -> 1 -> 0


def _handler_of(protocol: str, job: dict[str, Any]) -> str:
    if protocol == "pipelogiq":
        return str(job["handler"])
    if protocol == "priostack":
        return str(job["type"])
    return str(job["queue"])


def _terminal(protocol: str, job: dict[str, Any]) -> bool:
    if protocol == "pipelogiq":
        events = Counter(h["event"] for h in job["history"])
        return job["status"] in ("Completed", "Failed") and events["ack"] == events["delivered"]
    if protocol == "priostack":
        return job["state"] in ("completed", "incident")
    return bool(job["status"] == "finished")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_outcomes_map_per_protocol(worker_env: Any, recorder: Any, protocol: str) -> None:
    env = worker_env(protocol, handlers=_OUTCOME_HANDLERS, handler_module=HANDLERS_PATH)
    _seed_outcomes(env)

    run_until(env, lambda: all(_terminal(protocol, j) for j in env.admin.jobs()), what="every job settled",
              window=2.0, ticks=5)

    jobs = jobs_by_id(env)
    by_handler: dict[str, list[dict[str, Any]]] = {}
    for job in jobs.values():
        by_handler.setdefault(_handler_of(protocol, job), []).append(job)
    good, bad = sorted(by_handler["e2e.validated"], key=lambda j: "amount\": -1" in json.dumps(j))
    (ghost,), (rejected,) = by_handler["e2e.ghost"], by_handler["e2e.reject"]
    (failed,) = by_handler["e2e.boom"]
    runs = recorder.counts()
    ran = {name: runs[job_id(protocol, job)] for name, job in
           (("good", good), ("bad", bad), ("ghost", ghost), ("rejected", rejected), ("failed", failed))}
    # The handler never starts on bad input or without a handler; a business rejection is
    # final; a plain exception is retried where the protocol retries (Priostack, Pipelogiq).
    assert ran == {"good": 1, "bad": 0, "ghost": 0, "rejected": 1,
                   "failed": 1 if protocol == "claimqueue" else 2}

    if protocol == "pipelogiq":
        _check_pipelogiq_outcomes(good, bad, ghost, rejected, failed)
    elif protocol == "priostack":
        _check_priostack_outcomes(good, bad, ghost, rejected, failed)
    else:
        _check_claimqueue_outcomes(good, bad, ghost, rejected, failed)
    items = ledger(env)
    assert items and all(item.status is LedgerStatus.ACKNOWLEDGED for item in items)
    assert len(items) == (5 if protocol == "claimqueue" else 6)  # one per delivery (the retry is its own)
    assert in_flight(env) == 0


def _only_result(protocol: str, job: dict[str, Any]) -> dict[str, Any]:
    received = results(protocol, job)
    assert len(received) == 1, job
    return received[0]


def _check_pipelogiq_outcomes(good: dict[str, Any], bad: dict[str, Any], ghost: dict[str, Any],
                              rejected: dict[str, Any], failed: dict[str, Any]) -> None:
    p = "pipelogiq"
    assert good["status"] == "Completed" and json.loads(good["output"]) == {"orderId": "o-1", "charged": 12.5}
    result = _only_result(p, bad)
    assert (result["isSuccess"], result["retryable"]) == (False, False)
    assert result["errorCode"] == "VALIDATION_ERROR"
    assert "orderId" in result["result"] and "amount" in result["result"]  # names the bad fields
    assert bad["status"] == "Failed" and bad["errorCode"] == "VALIDATION_ERROR"
    result = _only_result(p, ghost)
    assert (result["isSuccess"], result["errorCode"]) == (False, "UNKNOWN_HANDLER")
    assert ghost["status"] == "Failed"
    result = _only_result(p, rejected)
    assert (result["isSuccess"], result["retryable"]) == (False, False)
    assert result["errorCode"] == "BUSINESS_REJECTED"
    assert json.loads(result["result"]) == {"code": "OUT_OF_STOCK", "message": "nothing left to ship",
                                            "variables": {"sku": "sku-9"}}
    assert rejected["status"] == "Failed" and rejected["failures"] == 1  # not retried
    received = results(p, failed)
    assert [(r["isSuccess"], r["errorCode"], r["retryable"]) for r in received] == [
        (False, "ValueError", True)] * 2
    assert [e["cause"] for e in failed["executions"]] == ["activation", "retry"]
    assert failed["status"] == "Failed" and failed["failures"] == 2


def _check_priostack_outcomes(good: dict[str, Any], bad: dict[str, Any], ghost: dict[str, Any],
                              rejected: dict[str, Any], failed: dict[str, Any]) -> None:
    p = "priostack"
    call = _only_result(p, good)
    assert call["action"] == "complete" and call["body"]["variables"] == {"orderId": "o-1", "charged": 12.5}
    call = _only_result(p, bad)
    assert call["action"] == "fail" and call["body"]["retries"] == 0       # retries 0: an incident
    assert bad["state"] == "incident" and bad["incident"]["error_message"].startswith("VALIDATION_ERROR")
    call = _only_result(p, ghost)
    assert call["action"] == "fail" and call["body"]["retries"] == 0 and ghost["state"] == "incident"
    assert "UNKNOWN_HANDLER" in call["body"]["errorMessage"] and ghost["retries_history"] == [1, 0]
    call = _only_result(p, rejected)
    assert call["action"] == "complete" and rejected["state"] == "completed"
    assert call["body"]["variables"] == {"sku": "sku-9", "errorCode": "OUT_OF_STOCK",
                                         "errorMessage": "nothing left to ship"}
    calls = results(p, failed)
    assert [(c["action"], c["body"]["retries"]) for c in calls] == [("fail", 1), ("fail", 0)]  # retries - 1
    assert failed["retries_history"] == [2, 1, 0] and failed["state"] == "incident"
    assert "ValueError" in calls[0]["body"]["errorMessage"]


def _check_claimqueue_outcomes(good: dict[str, Any], bad: dict[str, Any], ghost: dict[str, Any],
                               rejected: dict[str, Any], failed: dict[str, Any]) -> None:
    p = "claimqueue"
    for job in (good, bad, ghost, rejected, failed):
        assert _only_result(p, job)["accepted"] is True
        assert job["status"] == "finished" and job["attempts"] == 1
    assert good["result"] == {"orderId": "o-1", "charged": 12.5}
    assert bad["result"]["errorCode"] == "VALIDATION_ERROR" and "orderId" in bad["result"]["error"]
    assert ghost["result"]["errorCode"] == "UNKNOWN_HANDLER" and "e2e.ghost" in ghost["result"]["error"]
    assert rejected["result"] == {"sku": "sku-9", "error": "nothing left to ship",
                                  "errorCode": "OUT_OF_STOCK"}
    assert failed["result"]["errorCode"] == "ValueError" and "boom" in failed["result"]["error"]
