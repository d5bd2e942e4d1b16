"""Counters published as CloudWatch EMF through Powertools Metrics in Lambda, and kept
in memory everywhere (the local runner and tests read them)."""

from __future__ import annotations

import os
import threading
from collections import defaultdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # Powertools is imported only in Lambda, at the first flush
    from aws_lambda_powertools import Metrics as EmfMetrics

__all__ = ["Metrics", "metrics"]


class Metrics:
    """``add`` accumulates; ``flush`` emits one EMF record per invocation in Lambda."""

    def __init__(self) -> None:
        self.totals: defaultdict[str, float] = defaultdict(float)
        self._pending: defaultdict[str, float] = defaultdict(float)
        self._lock = threading.Lock()
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

        if self._emf is None:
            self._emf = EmfMetrics()
        emf = self._emf
        for name, value in pending.items():
            emf.add_metric(name=name, unit=MetricUnit.Count, value=value)
        emf.flush_metrics()


metrics = Metrics()
