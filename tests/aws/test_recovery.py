"""Recovery on the short path, end to end through moto: a re-bootstrapped Pipelogiq
session, an executor that dies between storing and reporting its outcome, and the
reaper giving stranded deliveries a definite outcome (docs/outcomes.md, docs/ledger.md).

Every test reads the sandbox's own job history and the ledger in the emulated table.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from typing import Any

import pytest
import requests
from e2e_support import (
    HANDLERS_PATH,
    PROTOCOLS,
    backdate,
    crash_between_storing_and_reporting,
    done,
    in_flight,
    instance,
    jobs_by_id,
    ledger,
    replace_session_once_running,
    results,
    run_until,
    take_background_errors,
)

from serverless_worker.model import LedgerStatus

pytestmark = pytest.mark.aws


def _statuses(env: Any) -> Counter[LedgerStatus]:
    return Counter(item.status for item in ledger(env))


# -- 2. Pipelogiq sessions -------------------------------------------------------------------------
def _session_fingerprint(env: Any) -> tuple[str, int]:
    """The stored session's token as the sandbox fingerprints it, and the sandbox's
    current fingerprint for this worker with its bootstrap count."""
    loaded = env.stack.store().load_session("pipelogiq", instance(env))
    assert loaded is not None
    stored = hashlib.sha256(loaded[0].token.get_secret_value().encode()).hexdigest()[:12]
    (worker,) = env.admin.overview()["workers"]
    assert worker["sessionFingerprint"] == stored, "the table must hold the token the server accepts now"
    return stored, int(worker["bootstraps"])


def _each_job_ran_once(env: Any, recorder: Any, count: int) -> None:
    jobs = jobs_by_id(env)
    assert len(jobs) == count
    for job in jobs.values():
        events = Counter(h["event"] for h in job["history"])
        assert len(job["executions"]) == 1 and events["lease_acquired"] == 1, events  # no lease recovery
        assert len(results("pipelogiq", job)) == 1 and job["status"] == "Completed"
    assert recorder.counts() == Counter({job_id: 1 for job_id in jobs})
    assert _statuses(env) == {LedgerStatus.ACKNOWLEDGED: count} and in_flight(env) == 0


@pytest.mark.parametrize("cause", ["ttl", "fault"])
def test_pipelogiq_rebootstraps_after_session_expiry(worker_env: Any, recorder: Any, cause: str) -> None:
    sandbox = {"session_ttl_seconds": 1.0} if cause == "ttl" else None
    env = worker_env("pipelogiq", handlers=["e2e.slow"], handler_module=HANDLERS_PATH, sandbox=sandbox)
    if cause == "fault":
        # The session dies under the running executors' lease renewals.
        env.admin.faults([{"kind": "expire_session", "endpoint": "lease.renew", "count": 1}])
    env.seed("e2e.slow", [{"sleep": 1.2, "n": i} for i in range(6)])

    run_until(env, lambda: all(done("pipelogiq", j) for j in env.admin.jobs()), what="all jobs done",
              window=2.0)

    _, bootstraps = _session_fingerprint(env)
    if cause == "fault":
        assert bootstraps == 2  # one expiry, one re-bootstrap, whatever the number of callers
    else:
        assert bootstraps >= 2
    _each_job_ran_once(env, recorder, 6)


def test_pipelogiq_recovers_once_from_a_replaced_session(worker_env: Any, recorder: Any,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    # Handlers held running until the intruder has bootstrapped (e2e_support's
    # replace_session_once_running): each one's next call meets the new token.
    caplog.set_level(logging.WARNING, logger="serverless_worker")
    env = worker_env("pipelogiq", handlers=["e2e.gate"], handler_module=HANDLERS_PATH)
    env.seed("e2e.gate", [{"n": i} for i in range(6)])

    intruder = replace_session_once_running(env, recorder, 6)  # while six executors run
    run_until(env, lambda: all(done("pipelogiq", j) for j in env.admin.jobs()), what="all jobs done",
              window=2.0)
    intruder.join(5)

    _, bootstraps = _session_fingerprint(env)
    assert bootstraps == 3  # ours, the intruder's, and exactly one recovery
    _each_job_ran_once(env, recorder, 6)
    # and each recovered call says what happened and that nothing was lost
    said = [r.getMessage() for r in caplog.records if "rejected the worker session" in r.getMessage()]
    assert said and all("a new session was opened and the call made again on it: nothing was lost" in line
                        for line in said), said


# -- 4. an executor dies between storing and reporting ---------------------------------------------------
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_executor_rereports_a_stored_outcome_without_rerunning(worker_env: Any, recorder: Any,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               protocol: str) -> None:
    env = crash_between_storing_and_reporting(worker_env, recorder, monkeypatch, protocol)
    assert _statuses(env) == {LedgerStatus.ACKNOWLEDGED: 2} and in_flight(env) == 0


def test_a_job_the_server_forgot_is_recorded_again_and_gets_its_stored_outcome(worker_env: Any,
                                                                                 recorder: Any) -> None:
    """Priostack restarts while our handlers run: the restart puts the active jobs back, so
    our ``complete`` answers 404 (the job is not activated). The job is re-activated later
    under the same key and retries: the ledger must record it again (not drop it as a
    duplicate, which would leave it active for good) and report the stored outcome without
    running the handler a second time."""
    # Handlers held running until the restart is done: it always comes while both run.
    env = worker_env("priostack", handlers=["e2e.gate"], handler_module=HANDLERS_PATH)
    env.seed("e2e.gate", [{"n": i} for i in range(2)])
    # A tick that ends before the handlers do (they wait for the release): no pull races
    # the restart below.
    assert env.tick(0.3)["dispatched"] == 2
    assert recorder.wait_active(2)
    restart = requests.post(f"{env.server.url}/_admin/restart", timeout=5)
    restart.raise_for_status()
    assert len(restart.json()["requeued"]) == 2, restart.json()
    recorder.release.set()  # the handlers return; their complete meets the forgotten jobs
    env.stack.wait_idle()
    forgotten = ledger(env)
    assert {item.status for item in forgotten} == {LedgerStatus.ACKNOWLEDGED}
    assert {item.report.status for item in forgotten if item.report} == {"not_found"}, forgotten

    run_until(env, lambda: all(done("priostack", j) for j in env.admin.jobs()), what="all jobs done",
              window=1.0)

    jobs = jobs_by_id(env)
    for job in jobs.values():
        assert [(c["action"], c["applied"]) for c in job["calls"]] == [("complete", False), ("complete", True)]
        assert len(job["activations"]) == 2
    assert recorder.counts() == Counter({job_id: 1 for job_id in jobs})  # the stored outcome, not a re-run
    assert _statuses(env) == {LedgerStatus.ACKNOWLEDGED: 2} and in_flight(env) == 0


# -- 5. the reaper and stranded deliveries ---------------------------------------------------------------
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_reaper_gives_stranded_deliveries_a_definite_outcome(worker_env: Any, recorder: Any,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             protocol: str) -> None:
    """Two kinds of strays: e2e.echo deliveries whose executor invocation was lost (recorded,
    never started, past the dispatch deadline) and e2e.die runs whose executor vanished
    mid-handler (running, past the run's deadline). The next tick's reaper hands the first
    back and settles the second as a timeout (docs/ledger.md); later ticks complete both."""
    # Pipelogiq: a lease outliving the dead executors, so the timeout result (not the
    # server's lease recovery) is what brings the retry. Claim queue: a short lease, since
    # handing back and timing out both mean letting it lapse there.
    sandbox = {"pipelogiq": {"lease_seconds": 20}, "claimqueue": {"lease_seconds": 5}}.get(protocol)
    env = worker_env(protocol, handlers=["e2e.echo", "e2e.die"], handler_module=HANDLERS_PATH, sandbox=sandbox)
    env.seed("e2e.echo", [{"n": 1}, {"n": 2}])
    if protocol == "pipelogiq":
        env.seed("e2e.die", [{"n": 3}, {"n": 4}], maxRetries=1, retryInterval=0)
    else:
        env.seed("e2e.die", [{"n": 3}, {"n": 4}])
    store, dispatcher = env.stack.store(), env.stack.services().dispatcher
    real_invoke = dispatcher.invoke_executor
    lost: list[str] = []

    def lose_echo_invocations(key: str) -> None:
        item = store.get(key)
        if item is not None and item.handler == "e2e.echo":
            lost.append(key)                               # silently dropped: never starts
        else:
            real_invoke(key)

    monkeypatch.setattr(dispatcher, "invoke_executor", lose_echo_invocations)
    first = env.tick(2.0)
    env.stack.wait_idle()
    monkeypatch.setattr(dispatcher, "invoke_executor", real_invoke)

    assert first["pulled"] == first["dispatched"] == 4 and len(lost) == 2, first
    take_background_errors(env, "ExecutorKilled", 2)
    stranded = {item.key: item for item in ledger(env)}
    assert sorted(item.status for item in stranded.values()) == sorted(
        [LedgerStatus.RECORDED] * 2 + [LedgerStatus.RUNNING] * 2)
    vanished = {key for key, item in stranded.items() if item.status is LedgerStatus.RUNNING}
    # Both deadlines pass without the wait: a run's is the Lambda timeout plus a grace, a
    # recorded delivery's the dispatch timeout (kept at its default, so the deliveries
    # recorded again below are never taken for stranded while their executors start).
    for key in stranded:
        backdate(env, key)

    reports = run_until(env, lambda: all(done(protocol, j) for j in env.admin.jobs()), what="all jobs done",
                        window=1.5, ticks=6)

    assert reports[0]["reaped"] == 4 and sum(r["reaped"] for r in reports) == 4, reports
    jobs = jobs_by_id(env)
    runs = recorder.counts()
    for job_id, job in jobs.items():
        if runs[job_id] == 1:
            _check_handed_back(protocol, job)
        else:
            assert runs[job_id] == 2, runs  # the run that vanished, then the retry
            _check_timed_out(protocol, job)
    assert sorted(runs.values()) == [1, 1, 2, 2] and set(runs) == set(jobs)
    final = _statuses(env)
    if protocol == "claimqueue":  # a re-claim is a new delivery (attempts + 1), with its own item
        assert final == {LedgerStatus.HANDED_BACK: 2, LedgerStatus.ACKNOWLEDGED: 6}
    else:  # the handed-back delivery came back: its item was recorded again and settled
        assert final == {LedgerStatus.ACKNOWLEDGED: 6}
    assert in_flight(env) == 0
    outcomes = [(item.outcome.kind.value, item.outcome.error_code) for item in ledger(env)
                if item.key in vanished and item.outcome is not None]
    assert outcomes == [("timeout", "EXECUTOR_LOST")] * 2


def _calls(received: list[dict[str, Any]]) -> list[tuple[str, int | None]]:
    """Priostack complete/fail calls as (action, retries sent)."""
    return [(c["action"], c["body"].get("retries")) for c in received]


def _check_handed_back(protocol: str, job: dict[str, Any]) -> None:
    """Never started: handed back without using an attempt, then run once."""
    received = results(protocol, job)
    if protocol == "pipelogiq":
        events = Counter(h["event"] for h in job["history"])
        # ack requeue:true, then delivered again: the same execution, no attempt used.
        assert events["requeue"] == 1 and events["delivered"] == 2 and events["ack"] == 1, events
        assert len(job["executions"]) == 1 and job["attempt"] == 1 and len(received) == 1
    elif protocol == "priostack":
        # fail with retries unchanged, then the complete.
        assert _calls(received) == [("fail", 3), ("complete", None)]
        assert job["retries_history"] == [3, 3] and len(job["activations"]) == 2
    else:
        events = [h["event"] for h in job["history"]]
        assert events == ["created", "claim", "lapse", "claim", "result"], events  # the lease lapsed
        assert job["attempts"] == 2 and len(received) == 1


def _check_timed_out(protocol: str, job: dict[str, Any]) -> None:
    """Vanished mid-handler: settled as a timeout, then retried and completed."""
    received = results(protocol, job)
    if protocol == "pipelogiq":
        # A retryable timeout, then the retry's success.
        assert [(r["isSuccess"], r["errorCode"], r["retryable"]) for r in received] == [
            (False, "HANDLER_TIMEOUT", True), (True, None, None)]
        assert [e["cause"] for e in job["executions"]] == ["activation", "retry"]
    elif protocol == "priostack":
        # fail with retries - 1, then the complete.
        assert _calls(received) == [("fail", 2), ("complete", None)]
        assert job["retries_history"] == [3, 2]
    else:
        # No result for the lost run: its lease lapsed and the item was claimed again.
        events = [h["event"] for h in job["history"]]
        assert events == ["created", "claim", "lapse", "claim", "result"], events
        assert len(received) == 1 and job["result"] == {"survived": True}


# The claim queue is left out: the late run is fenced by the same ledger write, and a timed
# out claim-queue run (no result; the lease lapses) is covered by the stranded test above.
@pytest.mark.parametrize("protocol", ["pipelogiq", "priostack"])
def test_a_late_executor_is_fenced_after_the_reaper_took_over(worker_env: Any, recorder: Any,
                                                              protocol: str) -> None:
    env = worker_env(protocol, handlers=["e2e.hang"], handler_module=HANDLERS_PATH)
    if protocol == "pipelogiq":
        env.seed("e2e.hang", [{"n": 1}])               # maxRetries 0: the timeout is final
    else:
        env.seed("e2e.hang", [{"n": 1}], retries=1)    # Priostack: retries 1 - 1 = 0, an incident

    env.tick(2.0)
    assert recorder.wait_active(1)                  # the executor is alive, but too slow
    (item,) = ledger(env)
    assert item.status is LedgerStatus.RUNNING
    backdate(env, item.key)
    second = env.tick(1.2)                             # the reaper takes the run over
    assert second["reaped"] == 1, second
    if protocol == "priostack":                        # Pipelogiq: the refused renewal cancels it
        recorder.release.set()
    env.stack.wait_idle()                            # the late executor ends without an error

    (job,) = env.admin.jobs()
    received = results(protocol, job)
    if protocol == "pipelogiq":
        assert [(r["isSuccess"], r["errorCode"]) for r in received] == [(False, "HANDLER_TIMEOUT")]
        assert job["status"] == "Failed" and any(h["event"] == "lease_refused" for h in job["history"])
    else:  # the late success was dropped: only the timeout's fail reached the server
        assert [(c["action"], c["body"]["retries"]) for c in received] == [("fail", 0)]
        assert job["state"] == "incident"
    (item,) = ledger(env)
    assert item.status is LedgerStatus.ACKNOWLEDGED and item.outcome is not None
    assert (item.outcome.kind.value, item.outcome.error_code) == ("timeout", "EXECUTOR_LOST")
    assert in_flight(env) == 0 and sum(recorder.counts().values()) == 1
