"""Executors that keep pulling, deployed: a stack with ``SelfPull=true`` in LocalStack
(conftest.py's ``self_pull_stack``, Priostack) drains a backlog with fewer executor
invocations than jobs, every job settled once and nothing left in flight; and a drain in
the middle of a slow backlog stops the pulling executors cleanly. Invocations are counted
from the ledger: every run's epoch is its invocation's request id (a self-pulled run's
with a suffix of its own), so distinct request ids are executor invocations that ran a job.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from aws.conftest import Env
from aws.e2e_support import in_flight, ledger
from aws.test_short_path import _terminal
from deployed.test_deployed import ticks, wait_for
from reliability.invariants import check, observe
from serverless_worker.model import DispatchMode, LedgerStatus

BACKLOG = 60
SLOW = 12
FIRST_BATCH = 3  # the stack's MaxInFlight: the jobs the first tick hands out


def _request_id(epoch: str | None) -> str:
    return str(epoch or "").split("/", 1)[0]


def _applied(job: dict[str, Any]) -> list[str]:
    return [c["action"] for c in job["calls"] if c.get("applied")]


def _jobs(env: Env, handler: str) -> list[dict[str, Any]]:
    return [j for j in env.admin.jobs() if j["type"] == handler]


def test_a_backlog_drains_with_fewer_executor_invocations_than_jobs(self_pull_stack: Env) -> None:
    env, stack = self_pull_stack, self_pull_stack.stack
    env.seed("e2e.echo-timed", [{"n": i} for i in range(BACKLOG)])
    stack.tick(20)  # a direct tick, so this does not wait for the next minute

    wait_for(lambda: all(_terminal(env.protocol, j) for j in _jobs(env, "e2e.echo-timed")), 600,
             f"the {BACKLOG} jobs settled", interval=3)
    wait_for(lambda: sum(i.status is LedgerStatus.ACKNOWLEDGED for i in ledger(env)) >= BACKLOG, 60,
             f"{BACKLOG} acknowledged ledger items")

    jobs = _jobs(env, "e2e.echo-timed")
    assert len(jobs) == BACKLOG and all(_applied(j) == ["complete"] for j in jobs), jobs  # settled once
    items = [i for i in ledger(env) if i.handler == "e2e.echo-timed"]
    assert len(items) == BACKLOG and all(i.status is LedgerStatus.ACKNOWLEDGED for i in items), items
    invocations = {_request_id(i.epoch) for i in items}
    modes = Counter(str(i.dispatch_mode) for i in items)
    assert modes[str(DispatchMode.SELF_PULLED)] >= 1, modes
    assert 1 <= len(invocations) < BACKLOG, (len(invocations), modes)
    check(observe(env, {}), final_states={"completed"})
    assert in_flight(env) == 0
    print(f"self-pull backlog: {BACKLOG} jobs in {len(invocations)} executor invocations; ledger modes {dict(modes)}")


def test_a_drain_in_the_middle_stops_the_pulling_executors(self_pull_stack: Env) -> None:
    env, stack = self_pull_stack, self_pull_stack.stack
    # The first batch (FIFO) finishes, so its executors pull the next jobs themselves; those
    # are held running until the drain has begun, so it comes in the middle of the backlog
    # however late a loaded machine brings the DrainFunction.
    env.seed("e2e.slow-timed-long", [{"sleep": 6, "n": i, "until_draining": i >= FIRST_BATCH}
                                     for i in range(SLOW)])
    stack.tick(20)

    def pulling() -> bool:
        items = [i for i in ledger(env) if i.handler == "e2e.slow-timed-long"]
        running = [i for i in items if i.status is LedgerStatus.RUNNING]
        return bool(running) and any(str(i.dispatch_mode) == str(DispatchMode.SELF_PULLED) for i in items)

    wait_for(pulling, 300, "an executor running a slow job it pulled itself", interval=1)

    report = stack.invoke("DrainFunction", {"grace_seconds": 90})
    drained_at = time.time()
    activations = env.admin.stats()["calls"].get("activate", 0)

    assert report["still_running"] == 0 and report["shutdown_called"] is True, report
    assert in_flight(env) == 0
    # A scheduled tick after the drain, and the executors' own pulls: none may reach the server.
    seen = ticks(stack)["schedule"]
    wait_for(lambda: ticks(stack)["schedule"] > seen, 180, "a scheduled tick after the drain", interval=3)
    assert env.admin.stats()["calls"].get("activate", 0) == activations
    late = [a for j in _jobs(env, "e2e.slow-timed-long") for a in j["activations"] if a["at"] > drained_at]
    assert not late, late
    done_before = sum(j["state"] == "completed" for j in _jobs(env, "e2e.slow-timed-long"))
    assert 0 < done_before < SLOW, done_before  # the drain came in the middle

    assert stack.invoke("DrainFunction", {"resume": True}) == {"resumed": True}
    stack.tick(20)
    wait_for(lambda: all(j["state"] == "completed" for j in _jobs(env, "e2e.slow-timed-long")), 600,
             "every slow job completed after the resume", interval=3)
    jobs = _jobs(env, "e2e.slow-timed-long")
    assert len(jobs) == SLOW and all(_applied(j).count("complete") == 1 for j in jobs), jobs
    check(observe(env, {}), final_states={"completed"})
    assert in_flight(env) == 0
    print(f"self-pull drain: {report}; {done_before} of {SLOW} done before it")
