"""The scheduler fans out where executors keep pulling (``self_pull``), through moto running
the real scheduler and executor functions against the three sandboxes: with a backlog
larger than a pull's batch, its executor invocations include deliveries flagged ``pull``
and pullers, and never more of both in flight than capacity.

The pullers' invocations are captured, not run: they carry no delivery, so nothing is
lost by not running them, and what an executor does with one is the executor's tier. The
deliveries run in the real executor, each job once.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_support import PROTOCOLS, done, in_flight, instance, ledger, run_until

from serverless_worker.model import LedgerStatus
from serverless_worker.registry import load_handlers
from serverless_worker.runtime.metrics import metrics

pytestmark = pytest.mark.aws

LIMIT, BATCH, JOBS = 8, 3, 24
# Loaded by path only (as the executors load it): importing it would register its handler twice.
FANOUT_HANDLERS = str(Path(__file__).resolve().with_name("handlers_fanout.py"))


class ExecutorEvents:
    """Every event the executor function is invoked with, in order. At each invoke it
    counts what is in flight: the ledger's live items plus the pullers whose ``by`` has not
    passed; a puller's invoke is answered as Lambda accepts an Event, without running it."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.events: list[dict[str, Any]] = []
        self.peak = 0
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

    def _invoke(self, backend: Any, function_name: str, qualifier: str | None, body: str, headers: Any,
                response_headers: dict[str, str]) -> bytes:
        if backend.get_function(function_name, qualifier).function_name == self._executor:
            event = json.loads(body)
            with self._lock:
                self.events.append(event)
                now = time.time()
                live_pullers = sum(1 for puller in self.pullers if puller["by"] > now)
                held = self.env.stack.store().count_in_flight(self.env.protocol, instance(self.env),
                                                              live_at=now) + live_pullers
                self.peak = max(self.peak, held)
            if "ledger_key" not in event:
                response_headers["x-amz-executed-version"] = "$LATEST"
                return b""  # accepted, as an Event invoke is
        return self._real(backend, function_name, qualifier, body, headers, response_headers)


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

    # the full pulls' deliveries are flagged, and pullers started beside them
    assert any(event.get("pull") is True for event in executor.deliveries), executor.events
    assert executor.pullers and all(set(p) == {"handler", "by"} and p["handler"] == "fanout.echo"
                                    for p in executor.pullers), executor.pullers
    started = sum(report["pullers"] for report in reports)
    assert started == len(executor.pullers) and sum(report["pullers_failed"] for report in reports) == 0
    assert metrics.totals["PullersStarted"] - started_before == started
    # never more deliveries and pullers in flight than capacity
    assert executor.peak <= LIMIT, executor.peak
    # each job was delivered once, ran once and settled once
    keys = [event["ledger_key"] for event in executor.deliveries]
    assert len(keys) == len(set(keys)) == JOBS
    assert len(runs) == JOBS and set(runs.values()) == {1}, runs
    items = ledger(env)
    assert len(items) == JOBS and {item.status for item in items} == {LedgerStatus.ACKNOWLEDGED}
    assert in_flight(env) == 0
