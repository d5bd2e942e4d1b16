"""One seeded randomized run per protocol: 500 jobs through the moto-backed runtime while the
sandbox mixes every fault at once (5xx, 429, latency and dropped answers on every endpoint,
duplicate deliveries, expired Pipelogiq sessions, and server restarts at random calls), with
handlers that succeed, reject, raise or get bad input. Then the reliability invariants
(tests/reliability/invariants.py).

Replay a failure with its seed: ``SWTEST_FAULT_SEED=N pytest tests/reliability/test_randomized_faults.py``
(every assertion message names the seed). The seed fixes the fault plan and the job mix; the
sandbox draws each fault from its own seeded generator in the order calls arrive. What is
*not* deterministic is thread timing: executors run concurrently, so which call draws which
number (and so which job meets which fault) can differ between two runs of the same seed.
A failure therefore replays as the same mix and rates of faults, not always the same calls.

Priostack has no lock expiry: a job whose activation answer was lost stays active on the
server until it restarts (docs/protocols.md). The run recovers those the way an operator would, with
the sandbox's restart, and asserts that only jobs the worker never recorded were stranded.
The AWS-tier harness runs each Event invocation once; Lambda retries one that raised (an
executor whose report met a second session expiry right after recovering from the first),
so the run does too. Both show in the recorded outcome.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests
from invariants import FINAL_STATES, Observed, check, observe, record_row

from aws.e2e_support import PROTOCOLS, in_flight, ledger
from reliability.paths import PATHS, claim_lease, scenario, settings
from serverless_worker.model import LedgerStatus
from serverless_worker.registry import load_handlers
from support.waiting import wait_for

pytestmark = pytest.mark.aws

# Loaded by path, as the functions load it; not imported here (one module object, one RUNS).
HANDLERS_PATH = str(Path(__file__).with_name("randomized_handlers.py"))
HANDLER = "rand.mixed"
HANDLER_ON = {"scheduler": HANDLER, "self-pull": "rand.mixed-timed"}  # the self-pull path needs a timeout

SEED = int(os.environ.get("SWTEST_FAULT_SEED", "5150"))
JOBS = 500
MAX_TICKS = 40      # with faults on; each is a short poll window plus the executors' finish
# Then, with faults cleared, ticks until nothing is open: a bound only, since how many jobs a
# tick's 2 s window takes depends on the machine (a loaded one left 20 open after 40 ticks).
QUIET_TICKS = 40
WINDOW = 2.0
# The wait for a tick's executors to finish only bounds a hang: on the self-pull path one
# executor keeps pulling while pulls come back full, up to self_pull_max_jobs (100) deliveries
# through the faults, which on a loaded 2-core machine outlasts HANG_SECONDS.
IDLE_SECONDS = 300.0

# Short timeouts so a dropped pull, claim or lease answer comes back within seconds.
SANDBOX: dict[str, dict[str, Any]] = {
    "pipelogiq": {"lease_seconds": 3, "visibility_timeout": 5, "lease_recovery_delay": 0.0,
                  "poll_interval": 0.02, "result_apply_delay": 0.005},
    "priostack": {},
    "claimqueue": {"lease_seconds": 5, "sweep_interval": 0.1},
}
# The self-pull path runs a handler with a declared timeout (2.5 s): on the claim queue its
# lease must hold it on a loaded machine (reliability/paths.py's claim_lease).
PATH_SANDBOX: dict[tuple[str, str], dict[str, Any]] = {
    ("claimqueue", "self-pull"): {"lease_seconds": claim_lease("self-pull", 5)}}

SETTINGS = {"batch_size": 50, "max_in_flight": 100}
PULL_LABEL = {"pipelogiq": "pull", "priostack": "activate", "claimqueue": "claim"}

# What each handler's job must end as on the server, whatever the faults (docs/outcomes.md).
EXPECTED: dict[str, dict[str, str]] = {
    "pipelogiq": {"echo": "completed", "ok": "completed", "bad": "failed", "reject": "failed",
                  "boom": "failed"},
    "priostack": {"echo": "completed", "ok": "completed", "bad": "incident", "reject": "completed",
                  "boom": "incident"},
    "claimqueue": {"echo": "finished", "ok": "finished", "bad": "error", "reject": "error", "boom": "error"},
}
# A failing handler is retried by the server once, by rule: Pipelogiq maxRetries=1 on a
# retryable failure, Priostack retries=2 (the worker fails with retries - 1 = 1, so the job is
# activated again). The claim queue never retries a result (an error result finishes the item).
WHY_RERUNS = {
    "pipelogiq": "a retryable handler failure with maxRetries=1 gets a new execution, and an expired "
                 "lease (a renewal or its answer lost) gets a recovery execution: each runs the handler",
    "priostack": "fail with retries - 1 > 0 puts the job back in the queue, so the server activates it "
                 "again (a retryable handler failure)",
    "claimqueue": "a claim whose lease lapsed (no result in time) is re-queued and claimed again",
}


def fault_plan(protocol: str) -> list[dict[str, Any]]:
    """Every fault at once, each with its own probability, on every endpoint."""
    rules: list[dict[str, Any]] = [
        {"kind": "latency", "endpoint": "*", "probability": 0.05, "latency_ms": 40},
        {"kind": "error_5xx", "endpoint": "*", "probability": 0.04, "status": 503},
        {"kind": "error_5xx", "endpoint": "*", "probability": 0.01, "status": 500},
        {"kind": "rate_limit", "endpoint": "*", "probability": 0.03, "retry_after": 0.2},
        {"kind": "drop_response", "endpoint": "*", "probability": 0.03},
        # Priostack only draws when a pull came up short while a job of its type is out: rarely.
        {"kind": "duplicate_delivery", "endpoint": PULL_LABEL[protocol],
         "probability": 0.5 if protocol == "priostack" else 0.05},
    ]
    if protocol == "pipelogiq":
        rules.append({"kind": "expire_session", "endpoint": "*", "probability": 0.01})
    # The server restarting, as each protocol's restart loses state (Sandbox.restart): just
    # before a call arrives, or after applying it with the answer lost.
    rules += [{"kind": "restart_before", "endpoint": "*", "probability": 0.003},
              {"kind": "restart_after", "endpoint": "*", "probability": 0.003}]
    return rules


def job_mix(seed: int) -> list[tuple[str, dict[str, Any]]]:
    """(kind, input) for each job, in a seeded order: mostly echo, a few of each other kind."""
    kinds = ["reject"] * 20 + ["boom"] * 20 + ["ok"] * 10 + ["bad"] * 10
    kinds += ["echo"] * (JOBS - len(kinds))
    random.Random(seed).shuffle(kinds)
    return [(kind, {"kind": kind, "n": n, "amount": -1 if kind == "bad" else 10.5}) for n, kind in enumerate(kinds)]


@contextmanager
def replayable(protocol: str) -> Iterator[None]:
    """Every assertion message starts with the seed and the command that replays it."""
    try:
        yield
    except AssertionError as err:
        raise AssertionError(f"[seed {SEED}, {protocol}; replay: SWTEST_FAULT_SEED={SEED} pytest "
                             f"tests/reliability/test_randomized_faults.py -k {protocol}] {err}") from err


@pytest.fixture
def runs() -> Any:
    counter = load_handlers(HANDLERS_PATH).RUNS  # the module object the executors load
    counter.reset()
    return counter


def seed_jobs(env: Any, mix: list[tuple[str, dict[str, Any]]], handler: str = HANDLER) -> dict[str, str]:
    """Seed every job in one admin call, in the mix's order; job id -> kind. Failing jobs get
    one server-side retry (Pipelogiq maxRetries=1, Priostack retries=2)."""
    if env.protocol == "pipelogiq":
        created = env.admin.seed({"pipelines": [
            {"name": f"rand-{value['n']}", "stages": [{
                "stageName": handler, "stageHandlerName": handler, "input": json.dumps(value),
                "options": {"maxRetries": 1, "retryInterval": 0} if kind == "boom" else {}}]}
            for kind, value in mix]})["jobIds"]
    elif env.protocol == "priostack":
        created = env.admin.seed({"jobs": [{"type": handler, "variables": value, "retries": 2 if kind == "boom" else 3}
                                           for kind, value in mix]})
    else:
        created = env.admin.seed({"queue": handler, "items": [value for _, value in mix]})
    assert len(created) == len(mix), created
    return {str(jid): kind for jid, (kind, _) in zip(created, mix, strict=True)}


def stranded_by_lost_activation(env: Any, observed: Observed) -> list[str]:
    """Priostack jobs active on the server whose latest activation the worker never recorded:
    its answer was lost. An active job the worker did record (and settled, as nothing is in
    flight) is a real strand, and fails the run. Waiting jobs are simply pulled next tick."""
    last_seen: dict[str, float] = {}
    for item in ledger(env):
        jid = item.delivery.job_id
        last_seen[jid] = max(last_seen.get(jid, 0.0), item.recorded_at, item.updated_at)
    lost: list[str] = []
    for jid in observed.not_final:
        if observed.states[jid] != "active":
            continue
        activations = [a["at"] for a in observed.jobs_raw[jid]["activations"] if not a["duplicate"]]
        assert activations and max(activations) > last_seen.get(jid, 0.0), (
            f"job {jid} is active on the server but the worker recorded and settled its activation "
            f"(stranded by the worker): {observed.jobs_raw[jid]}. {observed.facts()}")
        lost.append(jid)
    dropped = observed.faults_fired[f"drop_response@{PULL_LABEL['priostack']}"]
    assert not lost or dropped, f"{lost} stranded though no activation answer was dropped. {observed.facts()}"
    return lost


def settled(observed: Observed) -> bool:
    return not observed.not_final and observed.in_flight == 0 and all(
        LedgerStatus(status).is_final for status in observed.ledger)


def open_jobs(env: Any) -> Counter[str]:
    """Server-side states of the jobs not final yet (one admin read; cheaper than observe)."""
    final = FINAL_STATES[env.protocol]
    states = Counter(observe_state(env.protocol, job) for job in env.admin.jobs())
    return Counter({state: n for state, n in states.items() if state not in final})


def results_applied(env: Any) -> bool:
    """Pipelogiq answers a result ``202`` and applies it a moment later: true once every
    result a stage received has been applied or fenced (its history says which)."""
    if env.protocol != "pipelogiq":
        return True
    for job in env.admin.jobs():
        events = Counter(h["event"] for h in job["history"])
        if events["result_received"] != events["result_applied"] + events["result_fenced"]:
            return False
    return True


def observe_state(protocol: str, job: dict[str, Any]) -> str:
    if protocol == "pipelogiq":
        return str(job["status"]).lower()
    return str(job["state"] if protocol == "priostack" else job["status"])


# Where an executor invocation that raised leaves its delivery (never RECORDED or
# DISPATCH_FAILED: those are the scheduler's, and the reaper hands them back).
DIED_IN = {LedgerStatus.DISPATCHED, LedgerStatus.RUNNING, LedgerStatus.OUTCOME_STORED, LedgerStatus.REPORTED}


def retry_failed_invocations(env: Any) -> int:
    """Lambda retries an Event invocation that raised (MaximumRetryAttempts 2); the harness
    runs each once and keeps the error. Once every invocation has finished, a delivery still
    in flight belongs to one that died (e.g. its report met a second session expiry right
    after recovering from the first): invoke the executor again with the same event, as
    Lambda would (through the Lambda API, so with a new request id). Returns how many."""
    errors = env.stack.lambdas.background_errors
    if not errors:
        return 0
    assert all(isinstance(e, Exception) for e in errors), errors
    keys = [item.key for item in ledger(env) if item.status in DIED_IN]
    errors.clear()
    for key in keys:
        env.stack.lambda_client.invoke(FunctionName=env.stack.function_names["ExecutorFunction"],
                                       InvocationType="Event", Payload=json.dumps({"ledger_key": key}).encode())
    env.stack.wait_idle(IDLE_SECONDS)
    return len(keys)


def drive(env: Any, runs: Any) -> tuple[Observed, dict[str, int]]:
    """Tick until every job is final and nothing is in flight; faults stay on for up to
    MAX_TICKS, then are cleared for at most QUIET_TICKS (counted in the result)."""
    facts = {"ticks": 0, "quiet_ticks": 0, "restarts": 0, "stranded": 0, "invocations_retried": 0,
             "duplicates": 0}
    for tick in range(MAX_TICKS + QUIET_TICKS):
        if tick == MAX_TICKS:
            env.admin.clear_faults()
        facts["ticks" if tick < MAX_TICKS else "quiet_ticks"] += 1
        started = time.monotonic()
        report = env.tick(WINDOW)
        facts["duplicates"] += report["duplicates"]
        env.stack.wait_idle(IDLE_SECONDS)
        facts["invocations_retried"] += retry_failed_invocations(env)
        still_open = open_jobs(env)
        print(f"tick {tick}: {time.monotonic() - started:.1f}s pulled {report['pulled']} duplicates "
              f"{report['duplicates']} errors {len(report['errors'])}; open {dict(still_open)}"
              + (f"; stopped {report.get('stopped')} unfit {report.get('unfit')} errors {report['errors'][:2]}"
                 if not report["pulled"] else ""))
        if not still_open:
            wait_for(lambda: results_applied(env), what="every result received applied or fenced")
            observed = observe(env, runs.counts())
            if settled(observed):
                break
        elif env.protocol == "priostack" and "active" in still_open and in_flight(env) == 0:
            lost = stranded_by_lost_activation(env, observe(env, runs.counts()))
            if lost:
                requests.post(f"{env.server.url}/_admin/restart", timeout=10).raise_for_status()
                facts["restarts"] += 1
                facts["stranded"] += len(lost)
    return observe(env, runs.counts()), facts


def justified_reruns(env: Any, observed: Observed) -> dict[str, str]:
    """Each re-run job, with the server-side reason it ran again; a handler must never run
    more often than the server handed the job out anew (executions, activations, claims)."""
    reasons: dict[str, str] = {}
    for jid, count in observed.reruns.items():
        job = observed.jobs_raw[jid]
        if env.protocol == "pipelogiq":
            causes = Counter(e["cause"] for e in job["executions"])
            fresh = len(job["executions"])
        elif env.protocol == "priostack":
            causes = Counter("restart" if i else "activation" for i, _ in enumerate(job["restarts"]))
            causes["retry"] = sum(1 for retries in job["retries_history"][1:] if retries > 0)
            fresh = sum(1 for a in job["activations"] if not a["duplicate"])
        else:
            causes = Counter(h["event"] for h in job["history"] if h["event"] in ("lapse", "timeout"))
            fresh = int(job["attempts"])
        assert count <= fresh, (f"job {jid} ran {count} times but the server handed it out afresh only "
                                f"{fresh} times: {job}. {observed.facts()}")
        reasons[jid] = f"{count} runs ({dict(causes)})"
    return reasons


@pytest.mark.timeout(1200)  # a hang bound: 500 jobs through moto take minutes on a loaded machine
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("path", PATHS)
def test_randomized_faults(worker_env: Any, runs: Any, protocol: str, path: str) -> None:
    """On the scheduler path (pinned: the retried invocation's event is the bare ledger key)
    and on the self-pull path, where executors pull their own deliveries through the faults."""
    env = worker_env(protocol, handlers=[HANDLER_ON[path]], handler_module=HANDLERS_PATH,
                     sandbox={**SANDBOX[protocol], **PATH_SANDBOX.get((protocol, path), {})},
                     settings=settings(path, **SETTINGS))
    with replayable(protocol):
        kinds = seed_jobs(env, job_mix(SEED), HANDLER_ON[path])
        env.admin.faults(fault_plan(protocol), seed=SEED)
        observed, facts = drive(env, runs)

        # -- the invariants, on the server's own history and the ledger ------------------
        assert observed.jobs == JOBS, observed.facts()
        reasons = justified_reruns(env, observed)
        boom = sorted(jid for jid, kind in kinds.items() if kind == "boom")
        check(observed, final_states=set(FINAL_STATES[protocol]), reruns_allowed=len(reasons),
              why_reruns=WHY_RERUNS[protocol])
        wrong = {jid: (kinds[jid], state) for jid, state in observed.states.items()
                 if state != EXPECTED[protocol][kinds[jid]]}
        assert not wrong, f"jobs ended in the wrong state (kind, state): {wrong}. {observed.facts()}"
        lapsed = {jid: why for jid, why in reasons.items() if kinds[jid] != "boom"}
        if protocol != "claimqueue":  # the server's retry rule ran every failing job again
            assert all(observed.runs.get(jid, 0) >= 2 for jid in boom), (
                f"failing jobs not run again: {({jid: observed.runs.get(jid) for jid in boom})}. "
                f"{observed.facts()}")
        # Bad input fails the handler's model: reported as such, the handler body never runs.
        never_ran = sorted(jid for jid, kind in kinds.items() if kind != "bad" and not observed.runs.get(jid))
        assert not never_ran, f"jobs final without their handler ever running: {never_ran}. {observed.facts()}"
        bad_ran = sorted(jid for jid, kind in kinds.items() if kind == "bad" and observed.runs.get(jid))
        assert not bad_ran, f"handler ran on input its model refuses: {bad_ran}. {observed.facts()}"
        assert not env.stack.lambdas.background_errors, env.stack.lambdas.background_errors
        kinds_fired = {key.partition("@")[0] for key in observed.faults_fired}
        # (Priostack draws a duplicate only when a pull came up short while a job was out: it
        # may never fire, so it is not required there.)
        wanted = {"latency", "error_5xx", "rate_limit", "drop_response"}
        wanted |= {"duplicate_delivery"} if protocol != "priostack" else set()
        wanted |= {"expire_session"} if protocol == "pipelogiq" else set()
        assert wanted <= kinds_fired, f"fault kinds that never fired: {wanted - kinds_fired}. {observed.facts()}"
        restarts = sum(n for key, n in observed.faults_fired.items() if key.startswith("restart_"))
        assert restarts, f"the server never restarted. {observed.facts()}"

    final = ", ".join(f"{state} {n}" for state, n in sorted(observed.final.items()))
    retried = {"pipelogiq": "failing jobs run again by the server's retry rule (maxRetries=1)",
               "priostack": "failing jobs run again by the server's retry rule (fail with retries - 1)",
               "claimqueue": "no server retry (an error result finishes the item)"}[protocol]
    parts = [f"all {observed.jobs} final ({final})", f"{sum(observed.faults_fired.values())} faults fired "
             f"(among them {restarts} server restarts)", retried,
             f"{facts['duplicates']} duplicate deliveries discarded unrun"]
    if lapsed:
        parts.append(f"{len(lapsed)} other job(s) re-run after a lost lease or claim")
    if facts["stranded"]:
        parts.append(f"{facts['stranded']} stranded by lost activation answers, run after "
                     f"{facts['restarts']} server restart(s)")
    if facts["invocations_retried"]:
        parts.append(f"{facts['invocations_retried']} executor invocation(s) retried as Lambda does")
    parts.append(f"{facts['ticks']} ticks" + (f" + {facts['quiet_ticks']} without faults"
                                                if facts["quiet_ticks"] else ""))
    outcome = "; ".join(parts)
    record_row(scenario(f"randomized (seed {SEED}, {JOBS} jobs)", path), observed, outcome,
               why_reruns=WHY_RERUNS[protocol])
    print(f"\n[seed {SEED}] {protocol}: {outcome}; re-runs {reasons}")
