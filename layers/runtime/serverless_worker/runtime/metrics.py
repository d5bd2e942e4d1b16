"""Counters published as CloudWatch EMF through Powertools Metrics in Lambda, and kept
in memory everywhere (the local runner and tests read them).

Every name the runtime publishes is listed in :data:`METRIC_NAMES`, all of them counts in
the ``POWERTOOLS_METRICS_NAMESPACE`` namespace (``ServerlessWorker`` in template.yaml) with
the one dimension ``service`` (``POWERTOOLS_SERVICE_NAME``, the stack's name). The
dashboard and the alarms in template.yaml may reference only these, and every
``metrics.add`` in the runtime must name one of them: tests/unit/test_dashboard.py checks
both, so the dashboard cannot drift from what is emitted.
"""

from __future__ import annotations

import os
import threading
from collections import defaultdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # Powertools is imported only in Lambda, at the first flush
    from aws_lambda_powertools import Metrics as EmfMetrics

__all__ = ["DIMENSION", "EXECUTOR_ACTIONS", "METRIC_NAMES", "Metrics", "metrics"]

# The one dimension of every metric (Powertools' ``service``).
DIMENSION = "service"
# What one executor invocation did with its delivery: ``Jobs_<action>`` (entry.py). The
# settled ones (settle.Settlement), then the executor's own answers (executor.py).
EXECUTOR_ACTIONS: tuple[str, ...] = (
    "reported", "handed_back", "discarded",
    "acknowledged", "superseded", "missing", "skipped", "unknown",
    "deferred",  # a call retried inside already failed; the ledger item holds it for the reaper
    "late",      # a puller invoked after its reservation ended: no delivery (counted as PullersLate)
)
METRIC_NAMES: frozenset[str] = frozenset({
    # the scheduler, once per tick (entry.scheduler_tick)
    "SuccessfulPolls", "DeliveriesPulled", "DeliveriesDispatched", "DuplicatesDiscarded", "DispatchFailed",
    "StrandedReaped",
    "PullersStarted",    # executors started to pull their own deliveries (setting self_pull)
    "DeliveriesNotAskedFor",  # and executors that pull: deliveries given back untouched (runtime/pulling.py)
    # the executor, once per delivery (entry.execute_delivery)
    *(f"Jobs_{action}" for action in EXECUTOR_ACTIONS),
    "SelfPulled",        # one per delivery an executor pulled itself (runtime/self_pull.py)
    "PullersLate",       # a puller invoked after its reservation ended, so it did not pull
    # as they happen
    "LeasesLost",        # lease.py, steps.py: a running job's renewal was refused or expired
    "HandlerCannotFit",  # fit.py: a handler's timeout can never fit its lease and Lambda limits
    "SettleAbandoned",   # reaper.py: an outcome could not be settled within its retries
})


class Metrics:
    """``add`` accumulates; ``flush`` emits one EMF record per invocation in Lambda."""

    def __init__(self) -> None:
        self.totals: defaultdict[str, float] = defaultdict(float)
        self._pending: defaultdict[str, float] = defaultdict(float)
        self._lock = threading.Lock()
        # One emit at a time: Powertools' Metrics is one shared buffer, so two flushes that
        # interleave (executors on threads, locally and in tests) let the second find it
        # emptied by the first, and Powertools raises on an empty flush.
        self._emit_lock = threading.Lock()
        self._emf: EmfMetrics | None = None

    def add(self, name: str, value: float = 1) -> None:
        if not value:
            return
        with self._lock:
            self.totals[name] += value
            self._pending[name] += value

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, defaultdict(float)
        if not pending or not os.environ.get("AWS_LAMBDA_FUNCTION_NAME"):
            return
        from aws_lambda_powertools import Metrics as EmfMetrics
        from aws_lambda_powertools.metrics import MetricUnit

        with self._emit_lock:
            if self._emf is None:
                self._emf = EmfMetrics()
            for name, value in pending.items():
                self._emf.add_metric(name=name, unit=MetricUnit.Count, value=value)
            self._emf.flush_metrics()


metrics = Metrics()
