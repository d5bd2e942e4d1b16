"""Fault-injection matrix A: network and server faults, each x the three protocols, end to
end (the real functions in moto against a sandbox on loopback).

Each scenario seeds a handful of jobs, switches on one family of faults through the
sandbox's fault injector (or the emulated AWS around the functions), ticks the scheduler
until the work settles, then checks the invariants of ``invariants.py`` against the
sandbox's own history and records one row of the scenario x protocol table
(``scripts/fault_matrix_table.py`` renders it). A scenario that cannot happen on a
protocol gets an ``n/a: <why>`` row from ``test_not_applicable``, which checks that the
protocol really lacks the endpoint the fault needs.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
from moto.core.exceptions import JsonRESTError
from moto.stepfunctions.exceptions import StepFunctionsException

from aws.conftest import Env
from aws.e2e_support import HANDLERS_PATH, PROTOCOLS, in_flight, ledger, replace_session_once_running
from reliability.invariants import Observed, check, observe, record_na, record_row
from reliability.paths import PATHS, claim_lease, settings
from reliability.paths import scenario as on_path_row
from serverless_worker.model import LedgerStatus
from serverless_worker.sandbox import create_sandbox
from support.waiting import poll

pytestmark = pytest.mark.aws

HANDLERS_LONG_PATH = HANDLERS_PATH.replace("handlers_e2e.py", "handlers_long.py")
# Every endpoint label the worker calls, per protocol (the sandbox's stats after a clean run).
LABELS = {
    "pipelogiq": ("bootstrap", "heartbeat", "pull", "lease.acquire", "lease.renew", "result", "ack"),
    "priostack": ("activate", "complete", "fail"),
    "claimqueue": ("claim", "result"),
}
PULL = {"pipelogiq": "pull", "priostack": "activate", "claimqueue": "claim"}
RESULT = {"pipelogiq": ("result",), "priostack": ("complete", "fail"), "claimqueue": ("result",)}
# The final states a successful job and a (non-retryable) failed one reach.
OK = {"pipelogiq": "completed", "priostack": "completed", "claimqueue": "finished"}
FAILED = {"pipelogiq": "failed", "priostack": "incident", "claimqueue": "error"}

S_5XX = "5xx on every endpoint"
S_429 = "429 + Retry-After on every endpoint"
S_RESULT_LOST = "result applied, answer lost"
S_PULL_LOST = "pull/activate/claim answer lost"
S_ACK_LOST = "ack applied, answer lost"
S_DUPLICATES = "duplicate deliveries"
S_EXPIRY = "session expiry mid-run"
S_REPLACED = "session replaced mid-run"
S_OVERLAP = "two scheduler ticks overlapping"
S_INVOKE = "fan-out: Lambda Invoke throttled"
S_START = "fan-out: StartExecution failing"

_NO_SESSION = "no worker session: every call carries the {credential}, so there is none to expire or replace"
_NO_ACK = "no separate ack: the {settle} call is the settlement (covered by '" + S_RESULT_LOST + "')"
# (scenario, protocol, why, a path fragment the protocol's server must not have)
NOT_APPLICABLE = [
    (S_ACK_LOST, "priostack", _NO_ACK.format(settle="complete/fail"), "/ack"),
    (S_ACK_LOST, "claimqueue", _NO_ACK.format(settle="result"), "/ack"),
    (S_EXPIRY, "priostack", _NO_SESSION.format(credential="API key"), "bootstrap"),
    (S_EXPIRY, "claimqueue", _NO_SESSION.format(credential="bearer token"), "bootstrap"),
    (S_REPLACED, "priostack", _NO_SESSION.format(credential="API key"), "bootstrap"),
    (S_REPLACED, "claimqueue", _NO_SESSION.format(credential="bearer token"), "bootstrap"),
]


# -- fixtures and drivers -------------------------------------------------------------------------
@pytest.fixture
def long_runs() -> Iterator[Callable[[], Counter[str]]]:
    """Per-job run counts of handlers_long's long-steady (the Step Functions path), loaded
    by path as the steps function loads it."""
    from serverless_worker.registry import load_handlers

    module = load_handlers(HANDLERS_LONG_PATH)
    module.RUNS.clear()
    yield lambda: Counter(str(run["job_id"]) for run in module.runs_of("long-steady"))
    module.RUNS.clear()


def _env(worker_env: Callable[..., Env], protocol: str, *, sandbox: dict[str, Any] | None = None,
         settings: dict[str, Any] | None = None, handler_module: str = HANDLERS_PATH,
         handlers: tuple[str, ...] = ("e2e.slow", "e2e.boom")) -> Env:
    return worker_env(protocol, handlers=list(handlers), handler_module=handler_module, sandbox=sandbox,
                      settings=settings)


def _seed(env: Env, count: int, *, sleep: float = 0.2, failing: bool = True, handler: str = "e2e.slow") -> None:
    """``count`` e2e.slow jobs, plus one e2e.boom job whose failure is final (so the
    protocol's failure call is exercised without a retry re-running the handler)."""
    env.seed(handler, [{"sleep": sleep, "n": i} for i in range(count)])
    if failing:
        if env.protocol == "priostack":
            env.seed("e2e.boom", [{"n": "boom"}], retries=1)  # fail with retries 0: an incident
        else:
            env.seed("e2e.boom", [{"n": "boom"}])  # Pipelogiq maxRetries 0; claim queue: an error record


def _settled(env: Env) -> bool:
    """Every job final on the server and nothing of ours in flight."""
    o = observe(env, {})
    return not o.not_final and o.in_flight == 0 and all(LedgerStatus(s).is_final for s in o.ledger)


def _drive(env: Env, *, ticks: int = 5, window: float = 1.5, settle: float = 1.5,
           until: Callable[[Env], bool] = _settled) -> tuple[list[dict[str, Any]], list[str]]:
    """Tick, let the executors finish, repeat until ``until`` holds. A tick that fails (a
    Lambda error, as the schedule would see it) is kept and the next tick runs, as the next
    scheduled invocation would."""
    reports: list[dict[str, Any]] = []
    failures: list[str] = []
    for _ in range(ticks):
        try:
            reports.append(env.tick(window))
        except AssertionError as err:  # WorkerStack.invoke: the function returned an error
            failures.append(str(err)[:200])
        env.stack.wait_idle()
        if poll(lambda: until(env), settle, interval=0.1):
            return reports, failures
    return reports, failures


def _checked(scenario: str, env: Env, runs: Counter[str], *, final_states: set[str] | None = None,
             reruns_allowed: int = 0, why_reruns: str = "") -> Observed:
    """Observe and check the invariants; a violation is recorded as the scenario's row too."""
    observed = observe(env, runs)
    try:
        check(observed, final_states=final_states or {OK[env.protocol], FAILED[env.protocol]},
              reruns_allowed=reruns_allowed, why_reruns=why_reruns)
    except AssertionError as err:
        record_row(scenario, observed, f"INVARIANT VIOLATED: {str(err).splitlines()[0][:300]}")
        raise
    return observed


def _row(scenario: str, observed: Observed, detail: str, *, why_reruns: str = "") -> None:
    """The table row, written once the scenario's own assertions passed."""
    final = ", ".join(f"{n} {state}" for state, n in sorted(observed.final.items()))
    ran = ", ".join(f"{jobs} job(s) {times}x" for times, jobs in sorted(Counter(observed.runs.values()).items()))
    ledger = ", ".join(f"{n} {status}" for status, n in sorted(observed.ledger.items()))
    record_row(scenario, observed, f"{final}; handler ran: {ran}; ledger: {ledger}. {detail}",
               why_reruns=why_reruns)


def _events(observed: Observed, *names: str) -> int:
    return sum(h["event"] in names for job in observed.jobs_raw.values() for h in job.get("history", []))


def _bootstraps(env: Env) -> int:
    (worker,) = env.admin.overview()["workers"]
    return int(worker["bootstraps"])


def _applied_then_repeated(observed: Observed) -> int:
    """Reporting calls that reached the server after the job's outcome was already applied:
    the retries of a lost answer (Pipelogiq: fenced as duplicate results; Priostack: 404 on
    a job no longer active; claim queue: ``accepted:false``)."""
    if observed.protocol == "pipelogiq":
        return sum(h["event"] == "result_fenced" and h["reason"] == "duplicate_result"
                   for job in observed.jobs_raw.values() for h in job["history"])
    if observed.protocol == "priostack":
        repeated = 0
        for job in observed.jobs_raw.values():
            ended = False
            for call in job["calls"]:
                repeated += ended and call["status"] == 404
                ended = ended or (call["applied"] and (call["action"] == "complete"
                                                       or not (call["body"] or {}).get("retries")))
        return repeated
    return sum(h["event"] == "result" and not h["accepted"]
               for job in observed.jobs_raw.values() for h in job["history"])


# The self-pull path: capacity 2 and pulls of 2, so the scheduler's first pull is full and its
# two executors pull the rest themselves; its handler has the timeout that allows it.
SELF_PULL = {"max_in_flight": 2, "batch_size": 2}
SLOW = {"scheduler": "e2e.slow", "self-pull": "e2e.slow-timed"}


def _path_env(worker_env: Callable[..., Env], protocol: str, path: str, *,
              sandbox: dict[str, Any] | None = None) -> Env:
    extra = SELF_PULL if path == "self-pull" else {}
    return _env(worker_env, protocol, sandbox=sandbox, handlers=(SLOW[path],), settings=settings(path, **extra))


def _faults_once_an_executor_finished(env: Env, monkeypatch: pytest.MonkeyPatch, rules: list[dict[str, Any]]) -> None:
    """Switch ``rules`` on when the first executor stores an outcome: the next pulls are then
    the executors' own (the scheduler, at capacity, pulls nothing meanwhile). Another
    executor storing its outcome meanwhile waits until the rules are on, so its pull cannot
    slip in before them (it would take the job the rules were meant for, unfaulted)."""
    store = env.stack.store()
    real = store.store_outcome
    arming = threading.Lock()
    armed: list[bool] = []

    def store_outcome(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        with arming:
            if not armed:
                env.admin.faults(rules)
                armed.append(True)
        return result

    monkeypatch.setattr(store, "store_outcome", store_outcome)


def _pull_errors(reports: list[dict[str, Any]]) -> list[str]:
    return [e for r in reports for e in r["errors"] if e.startswith("pull")]


# -- 1 and 2. 5xx and 429 on every endpoint ---------------------------------------------------------------
@pytest.mark.parametrize("kind", ["error_5xx", "rate_limit"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_errors_on_every_endpoint(worker_env: Any, recorder: Any, protocol: str, kind: str) -> None:
    """Every label the worker uses answers 5xx (or 429 with Retry-After) twice in a row,
    all in one run: each call is retried and every job still ends once."""
    env = _env(worker_env, protocol)
    _seed(env, 4, sleep=1.3 if protocol == "pipelogiq" else 0.2)  # Pipelogiq: long enough to renew
    extra = {"retry_after": 0.1} if kind == "rate_limit" else {}
    env.admin.faults([{"kind": kind, "endpoint": label, "count": 2, **extra} for label in LABELS[protocol]])

    reports, failures = _drive(env, ticks=5)

    scenario = S_5XX if kind == "error_5xx" else S_429
    observed = _checked(scenario, env, recorder.counts())
    fired = Counter({key.split("@")[1]: n for key, n in observed.faults_fired.items()})
    # A failed heartbeat is not retried within the tick when rate limited (the next beat
    # comes on schedule), so it may spend one of its two faults when one tick does the work.
    assert set(fired) == set(LABELS[protocol]), (fired, reports, failures)
    assert all(n == 2 for label, n in fired.items() if label != "heartbeat"), (fired, reports, failures)
    assert fired.get("heartbeat", 1) in (1, 2), fired
    assert observed.final == Counter({OK[protocol]: 4, FAILED[protocol]: 1}), observed.facts()
    assert set(observed.runs.values()) == {1} and len(observed.runs) == 5, observed.runs
    same_body = _same_body_retries(env, observed)
    pulled = sum(r["pulled"] for r in reports)
    # Pipelogiq: a refused lease.acquire hands the delivery back unstarted (ack requeue:true).
    handed_back = _events(observed, "requeue")
    assert pulled == observed.jobs + handed_back, (pulled, handed_back, reports)
    _row(scenario, observed,
         "Faults per label: " + ", ".join(f"{k} {n}x" for k, n in sorted(fired.items()))
         + f"; calls retried until they went through{same_body}"
         + (f"; {handed_back} deliveries whose lease.acquire was rate limited were handed back unstarted "
            "(ack requeue:true) and redelivered" if handed_back else "")
         + (f"; {len(failures)} tick(s) failed, the next recovered" if failures else ""))


def _same_body_retries(env: Env, observed: Observed) -> str:
    """Where the sandbox records request bodies, check that a retried result carried the
    same bytes; the phrase for the row."""
    if env.protocol == "pipelogiq":
        overview = env.admin.overview()
        per_path: dict[str, set[str]] = {}
        for request in overview["requests"]:
            if request["label"] == "result":
                per_path.setdefault(request["path"], set()).add(request["bodySha256"])
        assert per_path and all(len(bodies) == 1 for bodies in per_path.values()), per_path
        return " (each retried result with the same body hash)"
    if env.protocol == "priostack":
        for job in observed.jobs_raw.values():
            bodies = {repr(c["body"]) for c in job["calls"] if c["action"] == "complete"}
            assert len(bodies) <= 1, job["calls"]
        return " (each retried complete with the same body)"
    return ""


# -- 3. responses dropped after their effect was applied -------------------------------------------------
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_result_answer_lost(worker_env: Any, recorder: Any, protocol: str) -> None:
    """The result (Priostack complete/fail) is applied, its answer cut mid-response: the
    retry finds it already applied and the job is settled once, never re-run."""
    env = _env(worker_env, protocol)
    _seed(env, 3)
    counts = {label: 1 if label == "fail" else 2 for label in RESULT[protocol]}
    env.admin.faults([{"kind": "drop_response", "endpoint": label, "count": n} for label, n in counts.items()])

    _drive(env, ticks=4)

    observed = _checked(S_RESULT_LOST, env, recorder.counts())
    dropped = sum(counts.values())
    repeated = _applied_then_repeated(observed)
    assert sum(observed.faults_fired.values()) == dropped, observed.faults_fired
    assert observed.final == Counter({OK[protocol]: 3, FAILED[protocol]: 1}), observed.facts()
    assert set(observed.runs.values()) == {1} and len(observed.runs) == 4, observed.runs
    assert repeated == dropped, (repeated, observed.facts())  # each lost answer: one retry, found applied
    how = {"pipelogiq": "fenced by the server as duplicate_result", "priostack": "answered 404 (job no longer "
           "active), taken as settled", "claimqueue": "answered accepted:false status finished"}[protocol]
    _row(S_RESULT_LOST, observed, f"{dropped} answers dropped after the result applied; each retry {how}; "
         "nothing re-run")


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("path", PATHS)
def test_pull_answer_lost(worker_env: Any, recorder: Any, monkeypatch: pytest.MonkeyPatch, protocol: str,
                          path: str) -> None:
    """The pull/activate/claim handed work out and the answer was lost: the server handed
    it to nobody. Pipelogiq's visibility timeout and the claim queue's lease lapse bring it
    back; Priostack has no activation timeout, so the jobs stay stranded until a server
    restart (its only mechanism), after which each runs once. On the self-pull path the
    lost answer is an executor's own pull (one job): the executor stops pulling, nothing
    was recorded, and the job comes back the same way."""
    claim_seconds = claim_lease(path, 5)
    sandbox = {"pipelogiq": {"visibility_timeout": 3}, "claimqueue": {"lease_seconds": claim_seconds}}.get(protocol)
    env = _path_env(worker_env, protocol, path, sandbox=sandbox)
    _seed(env, 3, failing=False, handler=SLOW[path])
    rules = [{"kind": "drop_response", "endpoint": PULL[protocol], "count": 1}]
    lost = 3
    if path == "scheduler":
        env.admin.faults(rules)
    else:
        _faults_once_an_executor_finished(env, monkeypatch, rules)
        lost = 1

    reports: list[dict[str, Any]] = []
    if protocol == "priostack":
        reports += _drive(env, ticks=2, window=1.5, settle=0.5)[0]
        stranded = observe(env, recorder.counts())
        assert stranded.final.get("active") == lost and len(stranded.not_final) == lost, stranded.facts()
        held = {item.delivery.job_id for item in ledger(env)}
        assert not held & set(stranded.not_final), stranded.facts()  # nobody holds them
        assert not set(stranded.runs) & set(stranded.not_final), stranded.facts()
        requests.post(f"{env.server.url}/_admin/restart", timeout=5).raise_for_status()
    # Ticks until the lost work is back (the visibility timeout or the lease's lapse, on the
    # server's real time) and settled: the count only bounds the wait.
    reports += _drive(env, ticks=12, window=1.5)[0]

    observed = _checked(on_path_row(S_PULL_LOST, path), env, recorder.counts())
    assert observed.faults_fired == Counter({f"drop_response@{PULL[protocol]}": 1})
    assert observed.final == Counter({OK[protocol]: 3}) and len(observed.runs) == 3, observed.facts()
    assert set(observed.runs.values()) == {1}, observed.runs
    whose = ""
    if path == "self-pull":
        assert not _pull_errors(reports), reports  # the lost answer was an executor's, not the scheduler's
        whose = "an executor's own pull lost its answer and it stopped pulling; "
    if protocol == "pipelogiq":
        assert _events(observed, "visibility_requeue") == 1
        detail = whose + "the lost delivery came back by the visibility timeout (3 s) and ran once"
    elif protocol == "claimqueue":
        assert _events(observed, "lapse") == 1
        detail = whose + f"the lost claim came back by its lease lapse ({claim_seconds:g} s) and ran once"
    else:
        assert sum(len(j["restarts"]) for j in observed.jobs_raw.values()) == lost
        detail = whose + (f"the lost activation stranded {lost} job(s) (Priostack has no activation timeout) "
                          "until a server restart; then each ran once")
    _row(on_path_row(S_PULL_LOST, path), observed, detail)


@pytest.mark.parametrize("protocol", ["pipelogiq"])
def test_ack_answer_lost(worker_env: Any, recorder: Any, protocol: str) -> None:
    """Pipelogiq's ack applied, answer lost: the retried ack finds the token gone and the
    delivery is settled once (no requeue, no re-run)."""
    env = _env(worker_env, protocol)
    _seed(env, 3)
    env.admin.faults([{"kind": "drop_response", "endpoint": "ack", "count": 2}])

    _drive(env, ticks=4)

    observed = _checked(S_ACK_LOST, env, recorder.counts())
    assert observed.faults_fired == Counter({"drop_response@ack": 2})
    assert _events(observed, "ack") == _events(observed, "delivered") == 4
    assert _events(observed, "requeue", "visibility_requeue") == 0
    assert len(observed.runs) == 4
    _row(S_ACK_LOST, observed, "2 ack answers dropped after the ack applied; the retry's 404 (unknown "
         "token) taken as settled; no requeue")


# -- 4. duplicate deliveries -------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("path", PATHS)
def test_duplicate_deliveries(worker_env: Any, recorder: Any, monkeypatch: pytest.MonkeyPatch, protocol: str,
                              path: str) -> None:
    """The server hands out work it already gave us: the ledger recognises it, it is
    acknowledged (Pipelogiq) or dropped unrun, and the handler runs once. On the self-pull
    path the duplicates go to the executors' own pulls: record_running finds the item and
    the copy is discarded unrun."""
    # Priostack duplicates only a job still active at the next activation (after the 1 s
    # empty-poll backoff): its handler outlasts that.
    duplicates = 1 if protocol == "priostack" else 2
    env = _path_env(worker_env, protocol, path)
    if (protocol, path) == ("priostack", "self-pull"):
        # Priostack's duplicate needs an activation that finds the queue empty while a job
        # is still active: one executor's job outlasts (2.2 s, within the handler's 2.5 s)
        # the other's two short ones, so the other runs dry while it is active. Jobs of equal
        # length let both run dry together, and whether a job is then active is a race.
        jobs = 3
        env.seed(SLOW[path], [{"sleep": 2.2, "n": 0}, {"sleep": 0.2, "n": 1}, {"sleep": 0.2, "n": 2}])
    else:
        jobs = 4
        _seed(env, jobs, sleep=1.5 if protocol == "priostack" else 0.2, failing=False, handler=SLOW[path])
    rules = [{"kind": "duplicate_delivery", "endpoint": PULL[protocol], "count": duplicates}]
    if path == "scheduler":
        env.admin.faults(rules)
    else:
        _faults_once_an_executor_finished(env, monkeypatch, rules)

    reports, _ = _drive(env, ticks=4, window=2.5 if protocol == "priostack" else 1.5)

    observed = _checked(on_path_row(S_DUPLICATES, path), env, recorder.counts())
    recognised = sum(r["duplicates"] for r in reports)
    assert observed.duplicates_delivered == duplicates, (observed.facts(), reports)
    if path == "scheduler":
        assert recognised == duplicates, reports
    assert observed.final == Counter({OK[protocol]: jobs}) and len(observed.runs) == jobs, observed.facts()
    assert set(observed.runs.values()) == {1}, observed.runs
    assert sum(observed.ledger.values()) == jobs, observed.ledger  # duplicates get no ledger item
    settled = " and acked (every token settled)" if protocol == "pipelogiq" else ""
    noun = "delivery" if duplicates == 1 else "deliveries"
    by = "the scheduler's" if path == "scheduler" else f"{recognised} at the scheduler's pulls, the rest at executors'"
    _row(on_path_row(S_DUPLICATES, path), observed, f"{duplicates} duplicate {noun} ({by}), each recognised by the "
         f"ledger's conditional record and discarded unrun{settled}")


# -- 5. Pipelogiq sessions ------------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", ["pipelogiq"])
def test_session_expires_mid_run(worker_env: Any, recorder: Any, protocol: str) -> None:
    env = _env(worker_env, protocol)
    _seed(env, 4, sleep=1.3)
    # The session dies under the running executors' lease renewals.
    env.admin.faults([{"kind": "expire_session", "endpoint": "lease.renew", "count": 1}])

    _drive(env, ticks=4, window=2.0)

    observed = _checked(S_EXPIRY, env, recorder.counts())
    assert observed.faults_fired == Counter({"expire_session@lease.renew": 1})
    assert _bootstraps(env) == 2
    assert all(len(j["executions"]) == 1 for j in observed.jobs_raw.values())  # no lease recovery
    _row(S_EXPIRY, observed, "the session expired under a lease renewal; one re-bootstrap (2 in all), "
         "renewals resumed, no lease recovered by the server")


@pytest.mark.parametrize("protocol", ["pipelogiq"])
def test_session_replaced_mid_run(worker_env: Any, recorder: Any, protocol: str) -> None:
    # Handlers held running until the intruder has bootstrapped (e2e_support's
    # replace_session_once_running): each one's next call meets the new token.
    env = _env(worker_env, protocol, handlers=("e2e.gate",))
    _seed(env, 4, failing=False, handler="e2e.gate")

    intruder = replace_session_once_running(env, recorder, 4)  # while the four run
    _drive(env, ticks=4, window=2.0)
    intruder.join(5)

    observed = _checked(S_REPLACED, env, recorder.counts())
    assert _bootstraps(env) == 3  # ours, the intruder's, exactly one recovery
    assert observed.final == Counter({"completed": 4}) and len(observed.runs) == 4, observed.facts()
    _row(S_REPLACED, observed, "a second bootstrap of our instance replaced the session while 4 handlers "
         "ran; one recovery bootstrap (3 in all), every job finished on its first execution")


def test_not_applicable() -> None:
    """The n/a cells: the scenario needs an endpoint the protocol's server does not have."""
    for scenario, protocol, why, fragment in NOT_APPLICABLE:
        paths = [getattr(route, "path", "") for route in create_sandbox(protocol).app().routes]
        protocol_paths = [p for p in paths if not p.startswith("/_admin")]
        assert protocol_paths and not any(fragment in p for p in protocol_paths), (protocol, protocol_paths)
        record_na(scenario, protocol, why)


# -- 6. overlapping scheduler ticks ------------------------------------------------------------------------
def _scheduler_reserved_concurrency() -> Any:
    from support.template import load_template

    return load_template()["Resources"]["SchedulerFunction"]["Properties"].get("ReservedConcurrentExecutions")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_overlapping_ticks(worker_env: Any, recorder: Any, protocol: str) -> None:
    """Two SchedulerFunction invocations at once (moto does not enforce reserved
    concurrency, so they truly overlap): one bootstrap (the lock), one ledger item per
    delivery (the conditional record), no job run twice. Free capacity is computed per
    tick, so two overlapping ticks can each fill it: the global bound is the template's
    reserved concurrency 1 on the scheduler, checked here, plus each tick's own bound."""
    limit = 3
    env = _env(worker_env, protocol, handlers=("e2e.slow",), settings={"max_in_flight": limit})
    _seed(env, 8, sleep=0.4, failing=False)
    peak = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, in_flight(env))
            stop.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = threading.Barrier(2)
    reports: list[Any] = []

    def tick() -> None:
        start.wait(5)
        try:
            reports.append(env.tick(2.0))
        except AssertionError as err:
            reports.append(str(err))

    try:
        ticks = [threading.Thread(target=tick) for _ in range(2)]
        for thread in ticks:
            thread.start()
        for thread in ticks:
            thread.join(30)
        env.stack.wait_idle()
        _drive(env, ticks=4, window=2.0)
    finally:
        stop.set()
        sampler.join(5)

    observed = _checked(S_OVERLAP, env, recorder.counts())
    assert len(reports) == 2 and all(isinstance(r, dict) for r in reports), reports  # neither tick failed
    assert peak <= 2 * limit and recorder.max_active <= 2 * limit, (peak, recorder.max_active)
    assert _scheduler_reserved_concurrency() == 1  # what keeps ticks from overlapping in AWS
    assert observed.final == Counter({OK[protocol]: 8}) and len(observed.runs) == 8, observed.facts()
    assert sum(observed.ledger.values()) == 8, observed.ledger  # one item per delivery, none doubled
    lock = ""
    if protocol == "pipelogiq":
        assert _bootstraps(env) == 1  # the bootstrap lock: one session for both ticks
        lock = "one bootstrap between them (the lock); "
    _row(S_OVERLAP, observed, f"{lock}one ledger item per delivery, no job run twice; in flight peaked "
         f"at {peak} with max_in_flight {limit}: the limit is per tick, kept globally only by the "
         "scheduler's reserved concurrency 1 (moto does not enforce it)")


# -- 7. fan-out failing -------------------------------------------------------------------------------------
class TooManyRequests(JsonRESTError):
    """Lambda's throttling answer (429 TooManyRequestsException)."""

    code = 429

    def __init__(self) -> None:
        super().__init__("TooManyRequestsException", "Rate exceeded")


class ExecutionLimitExceeded(StepFunctionsException):
    """Step Functions' answer when an account has too many running executions."""

    code = "ExecutionLimitExceeded"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_invoke_throttled(worker_env: Any, recorder: Any, monkeypatch: pytest.MonkeyPatch,
                          protocol: str) -> None:
    """The executor's async Invoke is throttled for the first deliveries: each is handed
    back (the claim queue lets its lease lapse) and later runs once."""
    sandbox = {"claimqueue": {"lease_seconds": 5}}.get(protocol)
    env = _env(worker_env, protocol, handlers=("e2e.slow",), sandbox=sandbox)
    # The SDK's own retries would absorb a throttle; one attempt, so each reaches the runtime.
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    _seed(env, 4, failing=False)
    real = env.stack.lambdas.backend_invoke
    executor = env.stack.function_names["ExecutorFunction"]
    throttled: list[str] = []

    def throttle(backend: Any, function_name: str, *args: Any) -> bytes:
        if executor in function_name and len(throttled) < 2:
            throttled.append(function_name)
            raise TooManyRequests()
        return real(backend, function_name, *args)

    monkeypatch.setattr(env.stack.lambdas, "backend_invoke", throttle)
    reports, _ = _drive(env, ticks=5, window=1.5)

    observed = _checked(S_INVOKE, env, recorder.counts())
    failed = sum(r["dispatch_failed"] for r in reports)
    assert len(throttled) == 2 and failed == 2, (throttled, reports)
    assert observed.final == Counter({OK[protocol]: 4}) and len(observed.runs) == 4, observed.facts()
    # A handed-back delivery comes back under the same ledger key, except on the claim
    # queue, where the re-claim is a new delivery (attempts + 1) with an item of its own.
    assert observed.ledger.get("HANDED_BACK", 0) == (2 if protocol == "claimqueue" else 0), observed.ledger
    back = {"pipelogiq": "acked with requeue:true", "priostack": "failed with retries unchanged",
            "claimqueue": "left to lapse (5 s lease)"}[protocol]
    _row(S_INVOKE, observed, f"{len(throttled)} executor invokes throttled (429 TooManyRequestsException); "
         f"those deliveries were handed back ({back}), came back and ran once")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_start_execution_fails(worker_env: Any, long_runs: Any, monkeypatch: pytest.MonkeyPatch,
                               protocol: str) -> None:
    """StartExecution for a long-running handler fails (execution limit reached) for the
    first deliveries: each is handed back and later runs once through the state machine."""
    from moto.stepfunctions.responses import StepFunctionResponse

    sandbox = {"pipelogiq": {"lease_seconds": 10}, "claimqueue": {"lease_seconds": 8}}.get(protocol)
    env = _env(worker_env, protocol, handlers=("long-steady",), handler_module=HANDLERS_LONG_PATH,
               sandbox=sandbox)
    env.seed("long-steady", [{"seconds": 0.2, "tag": f"t{i}"} for i in range(3)])
    real = StepFunctionResponse.start_execution
    refused: list[int] = []

    def limited(self: Any) -> Any:
        if len(refused) < 2:
            refused.append(1)
            raise ExecutionLimitExceeded("Maximum number of running executions reached")
        return real(self)

    monkeypatch.setattr(StepFunctionResponse, "start_execution", limited)

    def done(e: Env) -> bool:
        if e.stack.executions():
            e.stack.wait_for_executions(30)
        return _settled(e)

    reports, _ = _drive(env, ticks=6, window=1.5, until=done)

    observed = _checked(S_START, env, long_runs(), final_states={OK[protocol]})
    failed = sum(r["dispatch_failed"] for r in reports)
    assert len(refused) == 2 and failed == 2, (refused, reports)
    assert observed.final == Counter({OK[protocol]: 3}) and len(observed.runs) == 3, observed.facts()
    executions = Counter(e["status"] for e in env.stack.executions())
    assert executions == Counter({"SUCCEEDED": 3}), executions  # the refused starts left none behind
    _row(S_START, observed, f"{len(refused)} StartExecution calls refused (ExecutionLimitExceeded); those "
         "deliveries were handed back, came back and each ran once in one state-machine execution")


# -- the scenario x protocol table --------------------------------------------------------------------------
def test_table_renders_scenarios_by_protocol(tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """scripts/fault_matrix_table.py over rows written by record_row/record_na: one line per
    scenario, the last row of a cell wins, re-runs carry their reason, pipes are escaped."""
    import importlib.util
    from pathlib import Path

    path = tmp_path / "matrix.jsonl"
    monkeypatch.setenv("SWTEST_FAULT_MATRIX_OUT", str(path))

    def observed(protocol: str, reruns: dict[str, int]) -> Observed:
        return Observed(protocol=protocol, jobs=2, final=Counter({"completed": 2}), results=Counter({1: 2}),
                        runs={"a": 1, **reruns}, reruns=reruns, not_final=[], ledger=Counter(), in_flight=0,
                        duplicates_discarded=0, faults_fired=Counter())

    record_row("s1", observed("pipelogiq", {}), "first try")
    record_row("s1", observed("pipelogiq", {}), "all 2 completed once | retried")
    record_row("s1", observed("priostack", {"k9": 2}), "2 completed", why_reruns="retries - 1 after a fail")
    record_na("s2", "claimqueue", "no ack")
    spec = importlib.util.spec_from_file_location(
        "fault_matrix_table", Path(__file__).resolve().parents[2] / "scripts" / "fault_matrix_table.py")
    assert spec and spec.loader
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)

    assert table.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| scenario | pipelogiq | priostack | claimqueue |"
    assert lines[2] == ("| s1 | all 2 completed once \\| retried | 2 completed Re-runs: k9 ran 2x "
                        "(retries - 1 after a fail). | not run |")
    assert lines[3] == "| s2 | not run | not run | n/a: no ack |" and len(lines) == 4
    assert table.main([str(tmp_path / "missing.jsonl")]) == 1


def test_check_catches_each_violation() -> None:
    """The shared invariants fail, naming the job ids, on each kind of violation."""
    def observed(**changes: Any) -> Observed:
        base: dict[str, Any] = dict(
            protocol="priostack", jobs=2, final=Counter({"completed": 2}), results=Counter({1: 2}),
            runs={"j1": 1, "j2": 1}, reruns={}, not_final=[], ledger=Counter({"ACKNOWLEDGED": 2}), in_flight=0,
            duplicates_discarded=0, faults_fired=Counter(), states={"j1": "completed", "j2": "completed"})
        return Observed(**{**base, **changes})

    check(observed(), final_states={"completed"})  # the clean case passes
    violations = [
        (observed(not_final=["j2"], states={"j1": "completed", "j2": "active"}), "j2"),
        (observed(states={"j1": "completed", "j2": "incident"}), "j2"),
        (observed(problems={"j1": "2 applied complete/fail calls ended it"}), "j1"),
        (observed(runs={"j1": 2, "j2": 1}, reruns={"j1": 2}), "j1"),
        (observed(unknown_runs=["ghost"]), "ghost"),
        (observed(ledger=Counter({"ACKNOWLEDGED": 1, "RUNNING": 1}), in_flight=1), "RUNNING"),
    ]
    for bad, named in violations:
        with pytest.raises(AssertionError, match=named):
            check(bad, final_states={"completed"})
    with pytest.raises(AssertionError, match="without a documented reason"):
        check(observed(runs={"j1": 2, "j2": 1}, reruns={"j1": 2}), final_states={"completed"}, reruns_allowed=1)
    check(observed(runs={"j1": 2, "j2": 1}, reruns={"j1": 2}), final_states={"completed"}, reruns_allowed=1,
          why_reruns="fail with retries - 1 re-runs the job")
