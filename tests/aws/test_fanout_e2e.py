"""The scheduler fans out where executors keep pulling (``self_pull``), end to end: moto
running the real scheduler and executor functions (the executor's pulling loop included,
``runtime/self_pull.py``) against the three sandboxes. With a backlog larger than a pull's
batch, the executor invocations include deliveries flagged ``pull`` and pullers; the
server never has more jobs out to the worker than capacity; every job runs and settles
once, in fewer executor invocations than jobs.

How many slots the scheduler's reservations hold, and when, is counted exactly in
tests/unit/test_scheduler_fanout.py; here the server's own job histories are the measure.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from e2e_support import PROTOCOLS, done, jobs_by_id, ledger, run_until, unsettled_peak

from reliability.invariants import check, observe
from serverless_worker.model import DispatchMode
from serverless_worker.registry import load_handlers
from serverless_worker.runtime.metrics import metrics

pytestmark = pytest.mark.aws

LIMIT, BATCH, JOBS = 8, 3, 24
# Loaded by path only (as the executors load it): importing it would register its handler twice.
FANOUT_HANDLERS = str(Path(__file__).resolve().with_name("handlers_fanout.py"))
SUCCEEDED = {"pipelogiq": "completed", "priostack": "completed", "claimqueue": "finished"}


class ExecutorEvents:
    """Every event the executor function is invoked with, in order (then run as usual)."""

    def __init__(self, env: Any) -> None:
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._executor = env.stack.function_names["ExecutorFunction"]
        self._real = env.stack.lambdas.backend_invoke
        env.stack.lambdas.backend_invoke = self._invoke

    @property
    def pullers(self) -> list[dict[str, Any]]:
        return [event["pull"] for event in self.events if "ledger_key" not in event]

    @property
    def deliveries(self) -> list[dict[str, Any]]:
        return [event for event in self.events if "ledger_key" in event]

    def _invoke(self, backend: Any, function_name: str, *args: Any) -> bytes:
        if backend.get_function(function_name, args[0]).function_name == self._executor:
            with self._lock:
                self.events.append(json.loads(args[1]))
        return self._real(backend, function_name, *args)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_backlog_fans_out_to_pullers_within_capacity(worker_env: Any, protocol: str) -> None:
    env = worker_env(protocol, handlers=["fanout.echo"], handler_module=FANOUT_HANDLERS,
                     settings={"self_pull": True, "max_in_flight": LIMIT, "batch_size": BATCH})
    runs = load_handlers(FANOUT_HANDLERS).RUNS
    runs.clear()
    env.seed("fanout.echo", [{"n": n} for n in range(JOBS)])
    executor = ExecutorEvents(env)
    started_before = metrics.totals["PullersStarted"]

    reports = run_until(env, lambda: sum(done(protocol, job) for job in env.admin.jobs()) == JOBS,
                        what="every job done", window=3.0, ticks=8)

    # the first pull came back full: its deliveries went out flagged, and pullers beside them
    assert any(event.get("pull") is True for event in executor.deliveries), executor.events
    assert executor.pullers and all(set(p) == {"handler", "by"} and p["handler"] == "fanout.echo"
                                    for p in executor.pullers), executor.pullers
    started = sum(report["pullers"] for report in reports)
    assert started == len(executor.pullers) and sum(report["pullers_failed"] for report in reports) == 0
    assert metrics.totals["PullersStarted"] - started_before == started
    # the server never had more jobs out to the worker than capacity, pullers' included
    assert unsettled_peak(protocol, jobs_by_id(env).values()) <= LIMIT
    # each job ran once and settled once, most of them pulled by executors themselves
    check(observe(env, runs), final_states={SUCCEEDED[protocol]})
    assert len(runs) == JOBS and set(runs.values()) == {1}, runs
    keys = [event["ledger_key"] for event in executor.deliveries]
    assert len(keys) == len(set(keys))
    assert any(item.dispatch_mode == DispatchMode.SELF_PULLED for item in ledger(env))
    assert len(executor.events) < JOBS, len(executor.events)
