"""Fault-injection matrix C: the job server restarts, at three chosen points, x the three
protocols, end to end (the real functions in moto against a sandbox on loopback).

What a restart loses is each protocol's own (``Sandbox.restart``): Priostack puts every
active job back to waiting, and a complete or fail for that activation answers 404 until
the job is activated again; Pipelogiq's API process forgets the delivery tokens it held
(ack answers 404, the messages come back after the visibility timeout) while sessions,
leases and results live in its database; the claim queue keeps items and leases (it
closes work sockets, which HTTP workers have none of).

The points: during a pull (the pull is applied, the server restarts, the answer is lost),
while a handler runs (the admin restart, once the handlers are seen running), and between
storing an outcome and reporting it (the server restarts just before the report
arrives). After each, the invariants of ``invariants.py`` on the server's own history,
and one row of the scenario x protocol table.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import requests

from aws.e2e_support import HANDLERS_PATH, PROTOCOLS, ledger
from reliability.invariants import check, observe, record_row
from reliability.test_fault_matrix import OK, PULL, RESULT, _drive, _row

pytestmark = pytest.mark.aws

S_RESTART_PULL = "server restart during pull"
S_RESTART_RUN = "server restart while a handler runs"
S_RESTART_REPORT = "server restart between storing and reporting"

# Short recoveries: Pipelogiq's visibility timeout and the claim queue's lease bring a lost
# delivery back within seconds.
SANDBOX: dict[str, dict[str, Any]] = {
    "pipelogiq": {"visibility_timeout": 3},
    "priostack": {},
    "claimqueue": {"lease_seconds": 4},
}
JOBS = 3


def _restarts(env: Any) -> list[dict[str, Any]]:
    answer = requests.get(f"{env.server.url}/_admin/restarts", timeout=5)
    answer.raise_for_status()
    return list(answer.json()["restarts"])


def _checked(scenario: str, env: Any, runs: Counter[str]) -> Any:
    observed = observe(env, runs)
    try:
        check(observed, final_states={OK[env.protocol]})
    except AssertionError as err:
        record_row(scenario, observed, f"INVARIANT VIOLATED: {str(err).splitlines()[0][:300]}")
        raise
    # The same outcomes as without the restart: every job done, its handler run once.
    assert observed.final == Counter({OK[env.protocol]: JOBS}), observed.facts()
    assert len(observed.runs) == JOBS and set(observed.runs.values()) == {1}, observed.runs
    return observed


def _redelivered(observed: Any) -> int:
    """Deliveries beyond each job's first (Pipelogiq: the forgotten tokens' messages coming back)."""
    if observed.protocol == "pipelogiq":
        return sum(max(0, sum(h["event"] == "delivered" for h in job["history"]) - 1)
                   for job in observed.jobs_raw.values())
    if observed.protocol == "priostack":
        return sum(max(0, len(job["activations"]) - 1) for job in observed.jobs_raw.values())
    return sum(max(0, int(job["attempts"]) - 1) for job in observed.jobs_raw.values())


def _lost(env: Any) -> str:
    restart = _restarts(env)[0]
    return ", ".join(f"{name} {len(value) if isinstance(value, list) else value}"
                     for name, value in restart.items() if name not in ("at", "cause")) or "nothing"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_restart_during_pull(worker_env: Any, recorder: Any, protocol: str) -> None:
    env = worker_env(protocol, handlers=["e2e.echo"], handler_module=HANDLERS_PATH, sandbox=SANDBOX[protocol])
    env.seed("e2e.echo", [{"n": n} for n in range(JOBS)])
    env.admin.faults([{"kind": "restart_after", "endpoint": PULL[protocol], "count": 1}])

    _drive(env, ticks=6, window=1.5)

    observed = _checked(S_RESTART_PULL, env, recorder.counts())
    assert [r["cause"] for r in _restarts(env)] == [f"restart_after@{PULL[protocol]}"]
    how = {"pipelogiq": "the delivery's token was forgotten with the answer; the message came back "
                        "after the visibility timeout and ran once",
           "priostack": "the activated jobs went back to waiting with the answer lost; the next "
                        "activation took them and each ran once",
           "claimqueue": "the claim's lease persisted with the answer lost; it lapsed and the item "
                         "was claimed again and ran once"}[protocol]
    _row(S_RESTART_PULL, observed, f"lost: {_lost(env)}; {how}; {_redelivered(observed)} redeliveries")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_restart_while_handlers_run(worker_env: Any, recorder: Any, protocol: str) -> None:
    env = worker_env(protocol, handlers=["e2e.gate"], handler_module=HANDLERS_PATH, sandbox=SANDBOX[protocol])
    env.seed("e2e.gate", [{"n": n} for n in range(JOBS)])

    env.tick(1.5)
    assert recorder.wait_active(JOBS), "the handlers never all started"
    requests.post(f"{env.server.url}/_admin/restart", timeout=5).raise_for_status()
    recorder.release.set()
    _drive(env, ticks=6, window=1.5)

    observed = _checked(S_RESTART_RUN, env, recorder.counts())
    (restart,) = _restarts(env)
    if protocol == "priostack":
        assert len(restart["requeued"]) == JOBS and _redelivered(observed) == JOBS, (restart, observed.facts())
    elif protocol == "pipelogiq":
        assert restart["forgotten_tokens"] == JOBS, restart
        # Each ack answered 404, so the outcome was verified by reading the pipeline back.
        reads = [item.report.detail.get("reconciled") for item in ledger(env) if item.report is not None]
        assert len(reads) == JOBS and all(r and "pipeline_status" in r for r in reads), reads
    how = {"pipelogiq": "leases and results live in the database: each result was accepted (202); "
                        "the ack answered 404 (token forgotten, taken as settled) and the message, back after "
                        "the visibility timeout, is discarded as a duplicate when delivered again",
           "priostack": "the running jobs went back to waiting: each complete either found its job "
                        "re-activated (applied) or answered 404, and the job's next activation "
                        "re-reported the stored outcome without running the handler again",
           "claimqueue": "items and leases persist: each result was accepted"}[protocol]
    _row(S_RESTART_RUN, observed, f"lost: {_lost(env)}; {how}; {_redelivered(observed)} redeliveries")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_restart_between_storing_and_reporting(worker_env: Any, recorder: Any, protocol: str) -> None:
    env = worker_env(protocol, handlers=["e2e.echo"], handler_module=HANDLERS_PATH, sandbox=SANDBOX[protocol])
    env.seed("e2e.echo", [{"n": n} for n in range(JOBS)])
    env.admin.faults([{"kind": "restart_before", "endpoint": RESULT[protocol][0], "count": 1}])

    _drive(env, ticks=6, window=1.5)

    observed = _checked(S_RESTART_REPORT, env, recorder.counts())
    assert [r["cause"] for r in _restarts(env)] == [f"restart_before@{RESULT[protocol][0]}"]
    how = {"pipelogiq": "the result was accepted after the restart; the acks of forgotten tokens "
                        "answered 404 (taken as settled), their messages back after the visibility "
                        "timeout are discarded as duplicates when delivered again",
           "priostack": "the complete for the forgotten activation answered 404 (read back through "
                        "the process instance); the job's next activation re-reported the stored "
                        "outcome, not re-run",
           "claimqueue": "nothing is lost: the result was accepted"}[protocol]
    _row(S_RESTART_REPORT, observed, f"lost: {_lost(env)}; {how}; {_redelivered(observed)} redeliveries")
