"""Draining the worker end to end: the DrainFunction stops pulling, lets running jobs
finish, hands back what never started, shuts the worker down, and leaves nothing in
flight, neither in the ledger nor on the server, until ``{"resume": true}``.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from typing import Any

import pytest
from e2e_support import (
    HANDLERS_PATH,
    PROTOCOLS,
    done,
    in_flight,
    jobs_by_id,
    ledger,
    results,
    run_until,
    wait_for,
)

from serverless_worker.model import LedgerStatus

pytestmark = pytest.mark.aws


def _on_server(protocol: str, env: Any) -> Counter[str]:
    """Where the server has the jobs: its own state names, counted."""
    jobs = env.admin.jobs()
    if protocol == "pipelogiq":
        return Counter(job["status"] for job in jobs)
    return Counter(job["state" if protocol == "priostack" else "status"] for job in jobs)


def _pipelogiq_worker(env: Any) -> dict[str, Any]:
    overview = env.admin.overview()
    (worker,) = overview["workers"]
    return {**worker, "inFlight": overview["inFlight"], "queued": sum(overview["queues"].values())}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_drain_leaves_nothing_in_flight(worker_env: Any, recorder: Any, monkeypatch: pytest.MonkeyPatch,
                                        protocol: str) -> None:
    # Claim queue: a hand-back lets the lease lapse, so keep it short (and above the
    # handler's time plus the 2 s the budget keeps in reserve).
    sandbox = {"lease_seconds": 5} if protocol == "claimqueue" else None
    env = worker_env(protocol, handlers=["e2e.gate"], handler_module=HANDLERS_PATH, sandbox=sandbox)
    env.seed("e2e.gate", [{"n": i} for i in range(4)])
    dispatcher = env.stack.services().dispatcher
    real_invoke = dispatcher.invoke_executor
    calls = itertools.count()
    queued: list[str] = []

    def every_other(key: str) -> None:
        # Half the executors have not started yet when the drain comes (invocations queued
        # behind the reserved concurrency, say): those must be handed back, not waited for.
        if next(calls) % 2:
            queued.append(key)
        else:
            real_invoke(key)

    monkeypatch.setattr(dispatcher, "invoke_executor", every_other)
    first = env.tick(2.0)
    assert first["dispatched"] == 4 and len(queued) == 2, first
    assert recorder.wait_active(2)                       # two jobs are running

    answer: dict[str, Any] = {}
    drain = threading.Thread(target=lambda: answer.update(
        env.stack.invoke("DrainFunction", {"grace_seconds": 10})), daemon=True)
    drain.start()
    # The drain hands back what never started at once, and waits for what runs.
    wait_for(lambda: Counter(i.status for i in ledger(env))[LedgerStatus.HANDED_BACK] == 2,
             what="the unstarted deliveries to be handed back")
    assert drain.is_alive() and recorder.active == 2
    recorder.release.set()                                  # the running jobs finish
    drain.join(60)  # a Pipelogiq drain waits out a long poll's time (runtime/control.py), up to its grace
    drained = answer

    assert drained["handed_back"] == 2 and drained["finished_in_flight"] == 2, drained
    assert drained["still_running"] == 0 and drained["shutdown_called"] is True, drained
    env.stack.wait_idle()
    assert sum(recorder.counts().values()) == 2              # the queued two never ran
    assert Counter(item.status for item in ledger(env)) == {LedgerStatus.ACKNOWLEDGED: 2,
                                                            LedgerStatus.HANDED_BACK: 2}
    assert in_flight(env) == 0
    # Nothing in flight on the server either: the running two are done, the other two back.
    if protocol == "pipelogiq":
        worker = _pipelogiq_worker(env)
        assert worker["state"] == "stopped" and worker["shutdownReason"] == "drained", worker
        assert {"worker.draining", "worker.drained"} <= {e["eventType"] for e in worker["events"]}
        assert worker["inFlight"] == 0 and worker["queued"] == 2, worker  # requeued, not acked away
        assert _on_server(protocol, env) == {"Completed": 2, "Pending": 2}
    elif protocol == "priostack":
        assert _on_server(protocol, env) == {"completed": 2, "waiting": 2}
        handed = [job for job in env.admin.jobs() if job["state"] == "waiting"]
        assert all([(c["action"], c["body"]["retries"]) for c in results(protocol, job)] == [("fail", 3)]
                   for job in handed)                       # retries unchanged: no attempt used
    else:
        # No release call exists: the queued two are back once their leases lapse.
        wait_for(lambda: _on_server(protocol, env) == {"finished": 2, "pending": 2}, what="the leases to lapse")

    monkeypatch.setattr(dispatcher, "invoke_executor", real_invoke)
    paused = env.tick(1.2)
    assert paused["stopped"] == "draining" and paused["pulls"] == paused["pulled"] == 0, paused
    if protocol == "pipelogiq":
        assert _pipelogiq_worker(env)["state"] == "draining"  # alive, heartbeating, not pulling

    assert env.stack.invoke("DrainFunction", {"resume": True}) == {"resumed": True}
    run_until(env, lambda: all(done(protocol, j) for j in env.admin.jobs()),
              what="all jobs done after resume", window=1.5, ticks=4)

    jobs = jobs_by_id(env)
    assert recorder.counts() == Counter({job_id: 1 for job_id in jobs})
    final = Counter(item.status for item in ledger(env))
    if protocol == "claimqueue":  # the re-claims are new deliveries with items of their own
        assert final == {LedgerStatus.ACKNOWLEDGED: 4, LedgerStatus.HANDED_BACK: 2}
    else:
        assert final == {LedgerStatus.ACKNOWLEDGED: 4}
    assert in_flight(env) == 0
