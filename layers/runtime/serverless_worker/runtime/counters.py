"""The worker's counters (processed, failed, handed back, discarded), kept off the per-job path.

The counters are informational: the heartbeat's processed/failed figures and the local
runner's status line. The ledger, not the counters, records every delivery's outcome. An
ADD per settled job would be one DynamoDB write per job for statistics, so deltas are
summed in memory per warm container and written as one ADD at most every
``flush_seconds`` (by the first count or heartbeat after the interval has passed), and on
drain. A container that Lambda freezes or reclaims with deltas not yet written loses them:
at most ``flush_seconds`` of one container's counts. That loss is accepted: the figures
are statistics, and the ledger keeps every job's outcome.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..state.errors import StateStoreError
from ..state.rules import check_counter_deltas

if TYPE_CHECKING:
    from ..state.base import StateStore

__all__ = ["DEFAULT_FLUSH_SECONDS", "CounterBuffer"]

log = logging.getLogger("serverless_worker.counters")

DEFAULT_FLUSH_SECONDS = 30.0


class CounterBuffer:
    """Counter deltas of this container, written to the state store in batches.

    ``flush_seconds`` 0 writes every count at once. ``totals()`` is everything counted by
    this process (written or not); ``read()`` is the stored counters plus what is pending.
    """

    def __init__(self, store: StateStore, protocol: str, instance: str, *,
                 flush_seconds: float = DEFAULT_FLUSH_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._protocol = protocol
        self._instance = instance
        self._flush_seconds = max(0.0, float(flush_seconds))
        self._clock = clock
        self._lock = threading.Lock()
        self._writing = threading.Lock()  # a read never sees deltas both pending and stored
        self._pending: Counter[str] = Counter()
        self._totals: Counter[str] = Counter()
        # A fresh container waits one interval before its first write, so a burst of jobs
        # in a new container costs one write, not one plus one per interval.
        self._last_flush = clock()

    def add(self, **deltas: int) -> None:
        """Count ``deltas`` (``processed=1, failed=1``); write them when the interval is up."""
        check_counter_deltas(deltas)
        with self._lock:
            for name, delta in deltas.items():
                self._pending[name] += delta
                self._totals[name] += delta
        self.flush_if_due()

    def flush_if_due(self) -> bool:
        """Write the pending deltas if ``flush_seconds`` have passed since the last write."""
        with self._lock:
            due = self._clock() - self._last_flush >= self._flush_seconds
        return self.flush() if due else False

    def flush(self) -> bool:
        """Write the pending deltas now (one ADD); ``True`` when something was written.

        A failed write keeps the deltas pending for the next flush and never raises: the
        counters must not fail a settled job or a drain."""
        with self._writing:
            with self._lock:
                self._last_flush = self._clock()
                batch = {name: delta for name, delta in self._pending.items() if delta}
                self._pending.clear()
            if not batch:
                return False
            try:
                self._store.add_counters(self._protocol, self._instance, **batch)
                return True
            except StateStoreError:
                log.warning("counters not written; kept for the next flush", exc_info=True)
                with self._lock:
                    self._pending.update(batch)
                return False

    def pending(self) -> dict[str, int]:
        with self._lock:
            return {name: delta for name, delta in self._pending.items() if delta}

    def totals(self) -> dict[str, int]:
        """Everything this process counted since it started, written or not (no DynamoDB read)."""
        with self._lock:
            return dict(self._totals)

    def read(self) -> dict[str, int]:
        """The stored counters (one read) plus this container's pending deltas."""
        with self._writing:
            stored = Counter(self._store.read_counters(self._protocol, self._instance))
            stored.update(self.pending())
        return dict(stored)
