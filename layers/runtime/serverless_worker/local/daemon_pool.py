"""A bounded pool of daemon threads for the local worker's executors.

``ThreadPoolExecutor`` joins its threads when the interpreter exits, so one executor
stuck in a call (a handler that never returns and ignores cancellation, a report still
retrying) kept ``serverless-worker local`` alive after its summary until it was killed.
A daemon thread cannot: once the drain's grace is over the run gives up on it, and the
delivery it held stays unsettled in the ledger for the next run (``local/recovery.py``).

Example::

    pool = DaemonPool(4, name="executor")
    pool.submit(lambda: print("ran"))
    pool.shutdown(wait=True)
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

__all__ = ["DaemonPool"]

log = logging.getLogger("serverless_worker.local")


class DaemonPool:
    """Runs submitted calls, in order of arrival, on at most ``workers`` daemon threads,
    started as the work needs them."""

    def __init__(self, workers: int, *, name: str) -> None:
        self._workers = max(1, workers)
        self._name = name
        self._work: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._queued = 0
        self._closed = False

    def submit(self, task: Callable[[], None]) -> None:
        """Queue ``task``; raises RuntimeError once the pool is shut down."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the pool is shut down")
            self._queued += 1
            self._work.put(task)
            if self._queued > self._idle and len(self._threads) < self._workers:
                thread = threading.Thread(target=self._serve, name=f"{self._name}_{len(self._threads)}",
                                          daemon=True)
                self._threads.append(thread)
                thread.start()

    def shutdown(self, wait: bool = True) -> None:
        """Refuse new calls; the queued ones still run. With ``wait``, return once all have."""
        with self._lock:
            if not self._closed:
                self._closed = True
                for _ in self._threads:
                    self._work.put(None)
            threads = list(self._threads)
        if wait:
            for thread in threads:
                thread.join()

    def _serve(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            task = self._work.get()
            with self._lock:
                self._idle -= 1
                if task is not None:
                    self._queued -= 1
            if task is None:
                return
            try:
                task()
            except Exception:  # a task's error must not end the thread that runs the next ones
                log.exception("a task of the %s pool failed", self._name)
