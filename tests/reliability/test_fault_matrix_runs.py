"""Fault-injection matrix B: crashes, budgets and leases, each x the three protocols, end to
end (the real functions and state machine in moto against a sandbox on loopback).

Scenarios: an executor killed mid-handler (Lambda retries the event, or no retry comes and
the reaper settles it), killed between storing and reporting its outcome (both also on the
self-pull path, where the killed delivery is one the executor pulled itself), killed after
recording a delivery it pulled itself but before taking its lease, killed during the
hand-over from one self-pulled delivery to the next, a handler past
its budget (cooperative, and one that ignores cancellation), a lease refused mid-run on
the long-running path, and redelivery while a long job runs. After each one the
invariants of ``invariants.py`` are checked against the sandbox's own history and one row
of the scenario x protocol table is recorded; where a re-run is unavoidable, ``why_reruns``
says which protocol rule makes it so.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from aws.conftest import Env
from aws.e2e_support import (
    HANDLERS_PATH,
    PROTOCOLS,
    LambdaCrash,
    backdate,
    crash_between_storing_and_reporting,
    jobs_by_id,
    ledger,
    results,
    run_until,
    take_background_errors,
    wait_for,
)
from reliability.conftest import HANDLERS, handlers_module
from reliability.invariants import Observed, check, observe, record_na, record_row
from reliability.paths import PATHS, claim_lease, retry_invocation, scenario, settings, watch_record_running
from serverless_worker.model import DispatchMode, LedgerStatus, OutcomeKind

pytestmark = pytest.mark.aws

OK = {"pipelogiq": "completed", "priostack": "completed", "claimqueue": "finished"}
# What a job that ran out of time ends as when the server does not retry it (Pipelogiq
# maxRetries 0, Priostack retries 1 - 1 = 0) or the queue's own timeout ends it.
TIMED_OUT = {"pipelogiq": "failed", "priostack": "incident", "claimqueue": "failed"}
SERVER_RETRY = {
    "pipelogiq": "the timeout result is retryable, so the server's retry execution runs it again",
    "priostack": "fail with retries - 1 puts the job back, so its next activation runs it again",
    "claimqueue": "no result is sent, the lease lapses and the queue hands the item out again",
}
WHY_CRASH_RERUN = ("the executor died mid-handler, so whether the handler's side effects happened "
                   "is unknown: the delivery is settled as a timeout (EXECUTOR_LOST), never re-run by "
                   "the same delivery, and {retry}")


# -- fixtures and drivers ---------------------------------------------------------------------------
@pytest.fixture
def fault_runs() -> Iterator[Any]:
    """reliability_handlers' per-job run counts, fresh; any handler still ignoring its
    cancellation is released afterwards."""
    runs = handlers_module().FAULT_RUNS
    runs.reset()
    yield runs
    runs.reset()


def _settled(env: Env) -> bool:
    """Every job final on the server, nothing of ours in flight, no execution running."""
    observed = observe(env, {})
    running = [e for e in env.stack.executions() if e["status"] == "RUNNING"]
    return not observed.not_final and observed.in_flight == 0 and not running


def _finish(scenario: str, env: Env, runs: Counter[str], outcome: str, *, final_states: set[str],
            reruns_allowed: int = 0, why_reruns: str = "") -> Observed:
    """The invariants, then the table row (only for a scenario whose invariants held); the
    row's outcome ends with what the server's history shows."""
    observed = observe(env, runs)
    check(observed, final_states=final_states, reruns_allowed=reruns_allowed, why_reruns=why_reruns)
    record_row(scenario, observed, f"{outcome}. {_summary(observed)}", why_reruns=why_reruns)
    return observed


def _summary(observed: Observed) -> str:
    final = ", ".join(f"{n} {state}" for state, n in sorted(observed.final.items()))
    runs = ", ".join(f"{jobs} ran {times}x" for times, jobs in sorted(Counter(observed.runs.values()).items()))
    return f"{observed.jobs} jobs: {final}; handler: {runs}"


def _executions_started(env: Env, count: int, tries: int = 4) -> list[dict[str, Any]]:
    """Tick until ``count`` state-machine executions have started (a loaded tick may spend
    its window on bootstrap and heartbeat before it pulls); the ticks' reports."""
    reports = []
    for _ in range(tries):
        reports.append(env.tick(2.0))
        if len(env.stack.executions()) >= count:
            return reports
    raise AssertionError(f"fewer than {count} executions after {tries} ticks: {reports}")


def _dispatch_all(env: Env, count: int, tries: int = 3) -> None:
    """Tick until ``count`` deliveries went to executors (under load a tick's window can end
    before it pulled them all), then wait for those executors to return."""
    reports: list[dict[str, Any]] = []
    while len(reports) < tries and sum(r["dispatched"] for r in reports) < count:
        reports.append(env.tick(2.0))
    env.stack.wait_idle()
    assert sum(r["dispatched"] for r in reports) == count, reports


def _history(job: dict[str, Any], *names: str) -> list[dict[str, Any]]:
    return [h for h in job.get("history", []) if h["event"] in names]


def _lambda_retry(env: Env, key: str) -> dict[str, Any]:
    """Lambda's retry of an Event invocation that ended in an unhandled error: the same event
    again, under the same request id (the harness gives every API invoke a new one, so the
    retry calls the registered entry point directly, as the Lambda service would)."""
    name = env.stack.function_names["ExecutorFunction"]
    (first,) = [i for i in list(env.stack.lambdas.invocations)
                if i.function_name == name and i.event == {"ledger_key": key}]
    return retry_invocation(env, first.context.aws_request_id)


# -- 1. an executor killed mid-handler ----------------------------------------------------------------------
def killed_sandbox(protocol: str, path: str) -> dict[str, Any] | None:
    """Pipelogiq: a lease outliving the dead executor, so the timeout result (not the server's
    lease recovery) brings the retry. Claim queue: a short lease that still leaves the handler
    a budget of 1 s or more (its budget stops 2 s before the lease ends), whatever the load;
    on the self-pull path one its handler's whole 2.5 s timeout fits (``claim_lease``). The
    retry's claim must hold until the retry has reported: on a 2-core machine kept busy, a
    5 s lease lapsed again under the retried run (lapse, claim, lapse), so 10 s on the
    scheduler's path."""
    return {"pipelogiq": {"lease_seconds": 20},
            "claimqueue": {"lease_seconds": claim_lease(path, 10)}}.get(protocol)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("recovery", ["lambda_retry", "reaper"])
@pytest.mark.parametrize("path", PATHS)
def test_executor_killed_mid_handler(worker_env: Any, recorder: Any, monkeypatch: pytest.MonkeyPatch,
                                     protocol: str, recovery: str, path: str) -> None:
    """e2e.die kills its executor in the first run of each job (the invocation ends with an
    unhandled error, its ledger item left RUNNING). Either Lambda retries the event with the
    same request id, or no retry comes and the reaper settles it once its deadline passed:
    both settle it as a timeout without running the handler; the server's retry runs it again.
    On the self-pull path the killed runs are deliveries the executors pulled themselves."""
    if path == "self-pull":
        _killed_mid_self_pulled_handler(worker_env, recorder, monkeypatch, protocol, recovery)
        return
    sandbox = killed_sandbox(protocol, path)
    env = worker_env(protocol, handlers=["e2e.die"], handler_module=HANDLERS_PATH, sandbox=sandbox,
                     settings=settings(path))
    env.seed("e2e.die", [{"n": i} for i in range(3)], maxRetries=1, retryInterval=0)  # Priostack: retries 3

    _dispatch_all(env, 3)
    take_background_errors(env, "ExecutorKilled", 3)
    killed = ledger(env)
    assert [item.status for item in killed] == [LedgerStatus.RUNNING] * 3
    if recovery == "lambda_retry":
        answers = [_lambda_retry(env, item.key) for item in killed]
        assert all(a["action"] == "reported" and a["detail"] == "executor lost" for a in answers), answers
        assert sum(recorder.counts().values()) == 3  # the retried invocations ran no handler
    else:
        for item in killed:
            backdate(env, item.key)  # a run's deadline is the Lambda timeout plus a grace: time passing

    reports = run_until(env, lambda: _settled(env), what="every job final", window=1.5, ticks=8, settle=1.0)

    if recovery == "reaper":
        assert reports[0]["reaped"] == 3 and sum(r["reaped"] for r in reports) == 3, reports
    outcomes = {(item.outcome.kind, item.outcome.error_code) for item in ledger(env)
                if item.key in {k.key for k in killed} and item.outcome is not None}
    assert outcomes == {(OutcomeKind.TIMEOUT, "EXECUTOR_LOST")}
    retried = recovery == "lambda_retry"
    how = ("Lambda's retry (same request id) found the run already started" if retried
           else "no retry came; the reaper found the run past its deadline")
    why = WHY_CRASH_RERUN.format(retry=SERVER_RETRY[protocol])
    observed = _finish(
        f"executor killed mid-handler ({'Lambda retries the event' if retried else 'no retry: reaper'})",
        env, recorder.counts(),
        f"{how} and settled it as a timeout without re-running it; {SERVER_RETRY[protocol]}",
        final_states={OK[protocol]}, reruns_allowed=3, why_reruns=why)
    assert observed.runs == dict.fromkeys(observed.states, 2), observed.facts()  # the dead run + the retry
    _check_timed_out_once(protocol, observed)


def _check_timed_out_once(protocol: str, observed: Observed, only: set[str] | None = None) -> None:
    """The server saw the lost run as exactly one timeout, then the retry's success (for the
    jobs ``only`` names, else every job)."""
    for jid, job in observed.jobs_raw.items():
        if only is not None and jid not in only:
            continue
        if protocol == "pipelogiq":
            received = [(h["isSuccess"], h["errorCode"], h["retryable"]) for h in _history(job, "result_received")]
            assert received == [(False, "HANDLER_TIMEOUT", True), (True, None, None)], job["history"]
            assert [e["cause"] for e in job["executions"]] == ["activation", "retry"]
        elif protocol == "priostack":
            assert [(c["action"], c["body"].get("retries")) for c in job["calls"]] == [
                ("fail", 2), ("complete", None)], job["calls"]
        else:
            events = [h["event"] for h in job["history"]]
            assert events == ["created", "claim", "lapse", "claim", "result"], events


# -- 2. an executor killed between storing its outcome and reporting it --------------------------------------
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("path", PATHS)
def test_executor_killed_between_storing_and_reporting(worker_env: Any, recorder: Any,
                                                        monkeypatch: pytest.MonkeyPatch, protocol: str,
                                                        path: str) -> None:
    """test_recovery's scenario as it is (its own assertions included, shared through
    e2e_support): two executors die right after storing their outcomes; one is invoked again
    and re-reports, the reaper re-reports the other. Here it is also checked against the
    invariants and recorded. On the self-pull path the executors die after storing the
    outcome of a delivery they pulled themselves."""
    if path == "self-pull":
        _killed_self_pulled_between_storing_and_reporting(worker_env, recorder, monkeypatch, protocol)
        return
    env = crash_between_storing_and_reporting(worker_env, recorder, monkeypatch, protocol)
    _finish("executor killed between storing and reporting", env, recorder.counts(),
            "the stored outcome was reported by the re-invoked executor (one job) and by the reaper "
            "(the other), never re-run",
            final_states={OK[protocol]})


# -- 2b. the self-pull path: executors killed holding deliveries they pulled themselves ------------------
class ExecutorDied(BaseException):
    """The error a killed executor invocation ends with (see :func:`_die_here`)."""


def _die_here(env: Any, why: str) -> None:
    """The calling executor invocation is killed here: it runs nothing more, not even the
    ``finally`` blocks a raised exception would run (a killed Lambda sandbox runs none). Its
    thread is parked for good and leaves the harness's list (so waiting for the executors
    does not wait for it); its error is kept, as an invocation that ended in one."""
    lambdas = env.stack.lambdas
    me = threading.current_thread()
    with lambdas._lock:
        if me in lambdas._threads:
            lambdas._threads.remove(me)
        lambdas.background_errors.append(ExecutorDied(why))
    threading.Event().wait()


# Two executors of capacity 2: a full pull of 2 hands each of them the pull flag, and with no
# slot free the scheduler starts no puller, so every delivery past the first two is one an
# executor pulled itself, before its last one's final write (the hand-over).
SELF_PULL = {"max_in_flight": 2, "batch_size": 2}


def _request_id(item: Any) -> str:
    """The invocation a run belongs to: its epoch is the request id, a self-pulled run's
    the request id and a suffix of its own (``<request id>/<run>``)."""
    return str(item.epoch).split("/", 1)[0]


def _work_until_stuck(env: Any, jobs: int, ticks: int = 6) -> list[dict[str, Any]]:
    """Tick and let the executors finish until every seeded job has a ledger item, or a tick
    pulls nothing (the dead executors' items hold the slots until the reaper frees them):
    what is not final then belongs to a dead invocation."""
    reports: list[dict[str, Any]] = []
    for _ in range(ticks):
        reports.append(env.tick(2.0))
        env.stack.wait_idle()
        if len({item.delivery.job_id for item in ledger(env)}) >= jobs or reports[-1]["pulled"] == 0:
            return reports
    raise AssertionError(f"still pulling after {ticks} ticks: {ledger(env)}; {reports}")


def _killed_mid_self_pulled_handler(worker_env: Any, recorder: Any, monkeypatch: pytest.MonkeyPatch,
                                    protocol: str, recovery: str) -> None:
    """e2e.die-self-pulled kills its executor in the first run of each job an executor pulled
    itself: the scheduler's deliveries succeed, then their executors pull the next job and die
    in it. Lambda's retry replays the dead invocation's first event (its own delivery, already
    final) and so cannot settle the self-pulled one: the reaper does, once its deadline passed,
    as a timeout without running the handler; the server's retry runs it again."""
    env = worker_env(protocol, handlers=["e2e.die-self-pulled"], handler_module=HANDLERS_PATH,
                     sandbox=killed_sandbox(protocol, "self-pull"), settings=settings("self-pull", **SELF_PULL))
    armed = threading.Event()
    armed.set()

    def note(delivery: Any, item: Any, handover: bool) -> None:
        if armed.is_set():
            recorder.self_pulled.add(str(delivery.job_id))

    noted = watch_record_running(monkeypatch, env, after=note)
    env.seed("e2e.die-self-pulled", [{"n": i} for i in range(4)], maxRetries=1, retryInterval=0)

    _work_until_stuck(env, 4)
    armed.clear()  # from here on every job survives: what died is recovered
    killed = [item for item in ledger(env) if item.status is LedgerStatus.RUNNING]
    assert killed, f"no executor died in a self-pulled job: {ledger(env)}; record_running saw {noted}"
    take_background_errors(env, "ExecutorKilled", len(killed))
    assert all(str(item.dispatch_mode) == str(DispatchMode.SELF_PULLED) for item in killed), killed
    assert {item.delivery.job_id for item in killed} <= recorder.self_pulled
    if recovery == "lambda_retry":
        for item in killed:
            answer = retry_invocation(env, _request_id(item))
            assert answer.get("action") != "reported" or answer.get("ledger_key") != item.key, answer
        env.stack.wait_idle()
        assert not env.stack.lambdas.background_errors, env.stack.lambdas.background_errors
    for item in ledger(env):
        if item.key in {k.key for k in killed} and item.status is LedgerStatus.RUNNING:
            backdate(env, item.key)  # its run's deadline passing

    reports = run_until(env, lambda: _settled(env), what="every job final", window=1.5, ticks=8, settle=1.0)

    assert sum(r["reaped"] for r in reports) >= 1, reports
    outcomes = {(item.outcome.kind, item.outcome.error_code) for item in ledger(env)
                if item.key in {k.key for k in killed} and item.outcome is not None}
    assert outcomes == {(OutcomeKind.TIMEOUT, "EXECUTOR_LOST")}, outcomes
    why = WHY_CRASH_RERUN.format(retry=SERVER_RETRY[protocol])
    how = "Lambda retries the event" if recovery == "lambda_retry" else "no retry: reaper"
    observed = _finish(
        scenario(f"executor killed mid-handler ({how})", "self-pull"), env, recorder.counts(),
        f"{len(killed)} executors died in a job they pulled themselves; Lambda's retry replays only the "
        "invocation's first (final) delivery, so the reaper settled each self-pulled run past its deadline as a "
        f"timeout without re-running it; {SERVER_RETRY[protocol]}",
        final_states={OK[protocol]}, reruns_allowed=len(killed), why_reruns=why)
    dead = {item.delivery.job_id for item in killed}
    assert {jid: n for jid, n in observed.runs.items() if n > 1} == dict.fromkeys(dead, 2), observed.runs
    assert all(n == 1 for jid, n in observed.runs.items() if jid not in dead), observed.runs
    _check_timed_out_once(protocol, observed, only=dead)


def _killed_self_pulled_between_storing_and_reporting(worker_env: Any, recorder: Any,
                                                       monkeypatch: pytest.MonkeyPatch, protocol: str) -> None:
    """Executors die right after storing the outcome of a delivery they pulled themselves:
    the stored outcome is reported by the reaper (Lambda's retry replays only the first,
    final, delivery of the invocation), never re-run."""
    sandbox = {"lease_seconds": 20} if protocol == "pipelogiq" else None
    env = worker_env(protocol, handlers=["e2e.echo-timed"], handler_module=HANDLERS_PATH, sandbox=sandbox,
                     settings=settings("self-pull", **SELF_PULL))
    store = env.stack.store()
    real_store_outcome = store.store_outcome
    crashed: list[str] = []

    def store_then_crash(key: str, epoch: str, outcome: Any) -> None:
        real_store_outcome(key, epoch, outcome)
        item = store.get(key)
        if item is not None and str(item.dispatch_mode) == str(DispatchMode.SELF_PULLED):
            crashed.append(key)
            raise LambdaCrash("the executor died right after storing a self-pulled outcome")

    monkeypatch.setattr(store, "store_outcome", store_then_crash)
    env.seed("e2e.echo-timed", [{"n": i} for i in range(4)])
    _work_until_stuck(env, 4)
    monkeypatch.setattr(store, "store_outcome", real_store_outcome)  # from here on nobody dies

    assert crashed, f"no self-pulled delivery stored an outcome: {ledger(env)}"
    take_background_errors(env, "LambdaCrash", len(crashed))
    stored = {item.key: item for item in ledger(env) if item.status is LedgerStatus.OUTCOME_STORED}
    assert set(stored) == set(crashed), (stored, crashed)
    for key in crashed:  # Lambda retries the dead invocation: its first delivery is final
        retry_invocation(env, _request_id(stored[key]))
    env.stack.wait_idle()
    for item in ledger(env):
        if item.status is LedgerStatus.OUTCOME_STORED:
            backdate(env, item.key)
    reports = run_until(env, lambda: _settled(env), what="every job final", window=1.5, ticks=6, settle=1.0)

    assert sum(r["reaped"] for r in reports) >= 1 or not any(
        i.status is LedgerStatus.OUTCOME_STORED for i in ledger(env)), reports
    jobs = jobs_by_id(env)
    for job in jobs.values():
        assert len(results(protocol, job)) == 1, job  # exactly one result on the server
    assert recorder.counts() == Counter(dict.fromkeys(jobs, 1))  # never run again
    _finish(scenario("executor killed between storing and reporting", "self-pull"), env, recorder.counts(),
            f"{len(crashed)} executors died right after storing the outcome of a job they pulled themselves; "
            "the reaper reported each stored outcome, never re-run", final_states={OK[protocol]})


def _settled_once_nothing_stranded(env: Any, recorder: Any, killed_jobs: set[str], name: str, how: str) -> None:
    """The reaper recovers what the dead executors held: every job final, one applied result
    each, nothing in flight, and no handler run twice (the killed deliveries never ran)."""
    for item in ledger(env):
        if not LedgerStatus(str(item.status)).is_final:
            backdate(env, item.key)  # the dead runs' deadlines passing
    try:
        reports = run_until(env, lambda: _settled(env), what="every job final", window=1.5, ticks=8, settle=1.0)
    except AssertionError as err:
        observed = observe(env, recorder.counts())
        stuck = {jid: observed.jobs_raw[jid].get("history") for jid in observed.not_final}
        left = [(i.key, str(i.status), i.error) for i in ledger(env) if not LedgerStatus(str(i.status)).is_final]
        raise AssertionError(f"{observed.facts()}; not final: {stuck}; ledger in flight: {left}") from err
    assert sum(r["reaped"] for r in reports) >= len(killed_jobs), reports
    observed = _finish(scenario(name, "self-pull"), env, recorder.counts(), how,
                       final_states={OK[env.protocol]})
    assert set(observed.runs.values()) == {1} and len(observed.runs) == observed.jobs, observed.runs


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_executor_killed_after_recording_a_self_pulled_delivery(worker_env: Any, recorder: Any,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                protocol: str) -> None:
    """An executor records the next delivery it pulled (record_running), then dies before it
    takes its lease or runs it: here right after its last delivery's final write. The item is
    RUNNING under the dead run's epoch with a short deadline; the reaper settles it as a timeout
    without running anything, and the server's retry (Pipelogiq maxRetries 1, Priostack
    retries, the claim queue's lease lapse) runs the job once."""
    env = worker_env(protocol, handlers=["e2e.echo-timed"], handler_module=HANDLERS_PATH,
                     sandbox=killed_sandbox(protocol, "self-pull"),
                     settings=settings("self-pull", **SELF_PULL))
    store = env.stack.store()
    pending: dict[int, str] = {}  # invocation thread -> the job it recorded and has not run yet
    killed: list[str] = []
    lock = threading.Lock()
    armed = threading.Event()
    armed.set()

    def after(delivery: Any, item: Any, handover: bool) -> None:
        with lock:
            if len(killed) >= 2 or not armed.is_set():
                return
            if not handover:  # a puller's first pull: nothing else to finish
                killed.append(str(delivery.job_id))
            else:
                pending[threading.get_ident()] = str(delivery.job_id)
                return
        _die_here(env, f"killed after recording {delivery.job_id}")

    noted = watch_record_running(monkeypatch, env, after=after)
    real_final = store.mark_acknowledged

    def final_then_die(key: str, *args: Any, **kwargs: Any) -> Any:
        result = real_final(key, *args, **kwargs)
        with lock:
            job = pending.pop(threading.get_ident(), None)
            if job is None or len(killed) >= 2 or not armed.is_set():
                return result
            killed.append(job)
        _die_here(env, f"killed after recording {job}, before its lease")
        return result

    monkeypatch.setattr(store, "mark_acknowledged", final_then_die)
    env.seed("e2e.echo-timed", [{"n": i} for i in range(4)], maxRetries=1, retryInterval=0)
    _work_until_stuck(env, 4)
    armed.clear()  # from here on nobody dies: what died is recovered

    assert killed, f"no executor recorded a delivery it pulled itself: {noted}"
    take_background_errors(env, "ExecutorDied", len(killed))
    held = [item for item in ledger(env) if item.delivery.job_id in set(killed)]
    assert all(item.status is LedgerStatus.RUNNING for item in held), held
    assert not any(jid in killed for jid in recorder.counts()), recorder.counts()  # none ran
    _settled_once_nothing_stranded(
        env, recorder, set(killed), "executor killed after recording a self-pulled delivery, before its lease",
        f"{len(killed)} executors died holding a delivery they had recorded but not started; the reaper "
        "settled each as a timeout past its deadline and the server handed the job out again; each job ran once")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_executor_killed_during_the_hand_over(worker_env: Any, recorder: Any, monkeypatch: pytest.MonkeyPatch,
                                              protocol: str) -> None:
    """An executor reported and acknowledged delivery N, pulled and recorded N+1, and died
    before N's final write. The reaper finishes N (its report is repeated and found applied)
    and settles N+1 as a timeout without running it; the server's retry runs N+1 once."""
    env = worker_env(protocol, handlers=["e2e.echo-timed"], handler_module=HANDLERS_PATH,
                     sandbox=killed_sandbox(protocol, "self-pull"),
                     settings=settings("self-pull", **SELF_PULL))
    killed: list[str] = []
    lock = threading.Lock()
    armed = threading.Event()
    armed.set()

    def after(delivery: Any, item: Any, handover: bool) -> None:
        with lock:
            if not handover or len(killed) >= 2 or not armed.is_set():
                return
            killed.append(str(delivery.job_id))
        _die_here(env, f"killed in the hand-over to {delivery.job_id}")

    noted = watch_record_running(monkeypatch, env, after=after)
    env.seed("e2e.echo-timed", [{"n": i} for i in range(4)], maxRetries=1, retryInterval=0)
    _work_until_stuck(env, 4)
    armed.clear()  # from here on nobody dies: what died is recovered

    assert killed, f"no executor handed its slot over to a delivery it pulled itself: {noted}"
    take_background_errors(env, "ExecutorDied", len(killed))
    items = ledger(env)
    taken = [item for item in items if item.delivery.job_id in set(killed)]
    assert all(item.status is LedgerStatus.RUNNING for item in taken), taken
    # N: reported and acknowledged on the server, its final write missing.
    unfinished = [item for item in items if item.delivery.job_id not in set(killed)
                  and not LedgerStatus(str(item.status)).is_final]
    assert len(unfinished) == len(killed), items
    assert all(item.status in (LedgerStatus.OUTCOME_STORED, LedgerStatus.REPORTED) for item in unfinished), items
    _settled_once_nothing_stranded(
        env, recorder, set(killed), "executor killed during the hand-over (N acked, N+1 recorded)",
        f"{len(killed)} executors died after acknowledging N and recording N+1, before N's final write; the "
        "reaper finished N (acknowledged again, found settled) and settled N+1 as a timeout; the server handed "
        "N+1 out again and it ran once")


# -- 3. a handler past its budget -----------------------------------------------------------------------------
BUDGET_OUTCOME = {
    "pipelogiq": "result isSuccess:false HANDLER_TIMEOUT retryable:true (maxRetries 0: the stage failed)",
    "priostack": "fail with retries 1 - 1 = 0 (an incident)",
    "claimqueue": "no result sent; the lease lapsed and the queue's timeout ended the item as failed",
}


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("kind", ["cooperative", "ignores cancellation"])
def test_handler_runs_past_its_budget(worker_env: Any, fault_runs: Any, protocol: str, kind: str) -> None:
    """A handler with a 1 s timeout that would work far longer. The cooperative one stops when
    cancelled; the deaf one ignores it, so the runner abandons its thread after the grace.
    Either way the outcome is the protocol's timeout, once, and the late return goes nowhere."""
    name = "rel-fault-overrun" if kind == "cooperative" else "rel-fault-deaf"
    # Claim queue: the budget stops 2 s before the lease ends (5 s leaves the 1 s timeout room),
    # and with no further tick the queue's own timeout (8 s after seeding, after the lapse)
    # gives the lapsed item its final state.
    sandbox = {"claimqueue": {"lease_seconds": 5, "timeout_seconds": 8}}.get(protocol)
    env = worker_env(protocol, handlers=[name], handler_module=HANDLERS, sandbox=sandbox)
    env.seed(name, [{"n": i} for i in range(3)], maxRetries=0, retries=1)

    _dispatch_all(env, 3)
    assert env.stack.lambdas.background_errors == []
    stored = [item.outcome for item in ledger(env)]
    assert all(o is not None and (o.kind, o.error_code) == (OutcomeKind.TIMEOUT, "HANDLER_TIMEOUT")
               for o in stored), stored
    if kind == "ignores cancellation":
        assert all(o is not None and "abandoned" in (o.message or "") for o in stored), stored
        def abandoned() -> list[threading.Thread]:
            return [t for t in threading.enumerate() if t.name == f"sw-handler-{name}" and t.is_alive()]

        assert len(abandoned()) == 3  # still running after every executor returned
        fault_runs.release.set()  # they return now; their values must go nowhere
        wait_for(lambda: not abandoned(), what="the abandoned handler threads to end")
    if protocol == "claimqueue":
        wait_for(lambda: _settled(env), what="the queue's timeout to end the lapsed items")
    else:
        wait_for(lambda: _settled(env), what="the timeout results to apply")

    observed = _finish(f"handler past its budget ({kind})", env, fault_runs.counts(),
                       BUDGET_OUTCOME[protocol]
                       + ("; the thread was abandoned after the 2 s grace and its late return dropped"
                          if kind == "ignores cancellation" else "; the handler stopped when cancelled"),
                       final_states={TIMED_OUT[protocol]})
    assert len(observed.runs) == 3 and not observed.reruns
    for job in observed.jobs_raw.values():
        if protocol == "pipelogiq":
            assert [(h["isSuccess"], h["errorCode"], h["retryable"]) for h in _history(job, "result_received")
                    ] == [(False, "HANDLER_TIMEOUT", True)], job["history"]
        elif protocol == "priostack":
            assert [(c["action"], c["body"].get("retries")) for c in job["calls"]] == [("fail", 0)]
        else:
            assert [h["event"] for h in job["history"]] == ["created", "claim", "lapse", "timeout"]


# -- 4. a lease refused mid-run (long-running path) --------------------------------------------------------------
def _revoke(env: Env, job_id: str) -> None:
    env.admin.revoke(job_id)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_lease_refused_mid_run(worker_env: Any, fault_runs: Any, protocol: str) -> None:
    """Pipelogiq: the server stops honouring a running job's lease (revoked), the renewal is
    refused and the run cancelled; the server's lease recovery runs a new execution. Claim
    queue: no renew endpoint, so a job longer than its lease is stopped before the lease
    lapses and claimed again. Priostack: no lease at all (checked: the run made no lease call)."""
    scenario = "lease refused mid-run (long-running path)"
    # The second attempt (Pipelogiq's recovery execution, the claim queue's re-claim) is short.
    inputs = [{"seconds": 2 if protocol == "priostack" else 30, "retry_seconds": 0.5, "n": i} for i in range(2)]
    sandbox = {"pipelogiq": {"lease_seconds": 10}, "claimqueue": {"lease_seconds": 6}}.get(protocol)
    env = worker_env(protocol, handlers=["rel-fault-long"], handler_module=HANDLERS, sandbox=sandbox)
    env.seed("rel-fault-long", inputs)

    _executions_started(env, 2)
    if protocol == "pipelogiq":
        wait_for(lambda: all(_history(j, "lease_renewed") for j in env.admin.jobs()), what="a first renewal")
        for job in env.admin.jobs():
            _revoke(env, job["job_id"])
    run_until(env, lambda: _settled(env), what="every job final", window=1.5, ticks=12, settle=1.0)

    if protocol == "priostack":
        calls = env.admin.stats()["calls"]
        assert set(calls) == {"activate", "complete"} and calls["complete"] == 2, calls
        observed = observe(env, fault_runs.counts())
        check(observed, final_states={"completed"})
        record_na(scenario, protocol, "no lease: an activated job stays with its worker until complete/fail, "
                  "so there is nothing to refuse (checked: the long run made no lease call and completed once)")
        return
    if protocol == "pipelogiq":
        reasons = sorted({h["reason"] for j in env.admin.jobs() for h in _history(j, "lease_refused")})
        assert reasons and set(reasons) <= {"lease_expired", "stale_execution"}, reasons
        why = ("the renewal was refused (" + "/".join(reasons) + "): the run was cancelled and discarded "
               "without a result, and the server's lease recovery published a new execution, which runs "
               "the handler again; after a lost lease ownership belongs to recovery, so the cancelled "
               "run's partial side effects may be repeated")
        outcome = (f"renewal refused ({'/'.join(reasons)}); handler cancelled, delivery discarded (ack, no "
                   "result); the recovery execution ran it again")
    else:
        why = ("the claim queue has no renew endpoint: a run longer than its lease is stopped before the "
               "lease lapses (a timeout, no result), and the queue hands the item out again as a new attempt, "
               "which runs the handler again")
        outcome = "stopped before the lease lapsed (timeout, no result); re-claimed as attempt 2, which finished"
    observed = _finish(scenario, env, fault_runs.counts(), outcome,
                       final_states={OK[protocol]}, reruns_allowed=2, why_reruns=why)
    assert observed.runs == dict.fromkeys(observed.states, 2), observed.facts()
    for job in observed.jobs_raw.values():
        if protocol == "pipelogiq":
            assert [e["cause"] for e in job["executions"]] == ["activation", "recovery"], job["executions"]
            applied = _history(job, "result_applied")
            assert [h["executionId"] for h in applied] == [job["executions"][1]["executionId"]]
        else:
            assert [h["event"] for h in job["history"]] == ["created", "claim", "lapse", "claim", "result"]
    discarded = [item for item in ledger(env) if item.status is LedgerStatus.DISCARDED]
    assert len(discarded) == (2 if protocol == "pipelogiq" else 0), ledger(env)


# -- 5. redelivery while a long job runs ---------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_redelivery_during_a_long_job(worker_env: Any, fault_runs: Any, protocol: str) -> None:
    """Pipelogiq: the delivery's visibility timeout (2 s) is shorter than the job (6 s): the
    server requeues the message and delivers it again while the job runs; the redelivered
    token must not start a second run. Priostack has no visibility timeout; its one way to
    hand out a running job again is a server restart, done here mid-run. Claim queue: the
    queue's timeout ends the item while it runs; the late result is refused."""
    seconds = {"pipelogiq": 6, "priostack": 5, "claimqueue": 7}[protocol]
    sandbox = {"pipelogiq": {"lease_seconds": 10, "visibility_timeout": 2},
               "claimqueue": {"lease_seconds": 30, "timeout_seconds": 4}}.get(protocol)
    env = worker_env(protocol, handlers=["rel-fault-long"], handler_module=HANDLERS, sandbox=sandbox)
    env.seed("rel-fault-long", [{"seconds": seconds, "n": i} for i in range(2)])

    reports = _executions_started(env, 2)
    if protocol == "pipelogiq":
        wait_for(lambda: all(_history(j, "visibility_requeue") for j in env.admin.jobs()),
                 what="the visibility timeout to requeue both deliveries")
    elif protocol == "priostack":
        wait_for(lambda: sum(fault_runs.counts().values()) == 2, what="both handlers to start")
        restart = requests.post(f"{env.server.url}/_admin/restart", timeout=5)
        restart.raise_for_status()
        assert len(restart.json()["requeued"]) == 2, restart.json()
    reports += run_until(env, lambda: _settled(env), what="every job final", window=1.5, ticks=10, settle=1.0)
    duplicates = sum(r["duplicates"] for r in reports)

    if protocol == "claimqueue":
        observed = _finish("redelivery during a long job", env, fault_runs.counts(),
                           "no redelivery: the lease (30 s) outlived the job, but the queue's timeout (4 s) "
                           "failed the item while it ran; the late result was answered accepted:false and "
                           "dropped (a lapsing lease is the row 'lease refused mid-run')",
                           final_states={"failed"})
        for job in observed.jobs_raw.values():
            assert [(h["event"], h.get("accepted")) for h in job["history"]] == [
                ("created", None), ("claim", None), ("timeout", None), ("result", False)], job["history"]
        assert len(observed.runs) == 2 and not observed.reruns
        return
    assert duplicates >= 2, reports  # every job delivered again while it ran, and recognised
    what = ("the visibility timeout requeued the delivery mid-run and the server delivered it again"
            if protocol == "pipelogiq" else "a server restart mid-run put the active job back and it was "
            "activated again")
    observed = _finish("redelivery during a long job", env, fault_runs.counts(),
                       f"{what}; the ledger recognised it as a duplicate ({duplicates} in all) and "
                       + ("acknowledged it unrun" if protocol == "pipelogiq" else "dropped it unrun")
                       + "; the first run finished and its result applied",
                       final_states={OK[protocol]})
    assert len(observed.runs) == 2 and not observed.reruns
    for job in observed.jobs_raw.values():
        if protocol == "pipelogiq":
            assert len(job["executions"]) == 1 and len(_history(job, "lease_acquired")) == 1
            delivered = _history(job, "delivered")
            first, redelivered = delivered[0]["tokenFingerprint"], delivered[1]["tokenFingerprint"]
            settled = {h["tokenFingerprint"]: h["event"] for h in _history(job, "visibility_requeue", "ack")}
            assert settled[first] == "visibility_requeue" and settled[redelivered] == "ack", job["history"]
            # The redelivery was acknowledged (discarded) before the first run's result came in.
            ack_at = next(h["at"] for h in _history(job, "ack") if h["tokenFingerprint"] == redelivered)
            assert ack_at < _history(job, "result_received")[0]["at"]
        else:
            assert len(job["restarts"]) == 1 and len(job["activations"]) == 2
            assert [c["action"] for c in job["calls"]] == ["complete"]
