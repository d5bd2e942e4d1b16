"""Handlers for tests/aws/test_self_pull.py. Only a handler with a declared timeout keeps
pulling (docs/limits.md), so ``sp.quick`` declares one; ``sp.untimed`` does not.

Every run is counted per job id, with the most running at once; ``RUNS.tap``, when set, is
called with the run's number (1 for the first run since the last reset) while the run is
in progress: a test sets the drain flag or a fault switch at a counted point of the loop,
never at a time.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from serverless_worker import Job, handler

__all__ = ["HANDLERS_PATH", "RUNS", "Runs"]

HANDLERS_PATH = str(Path(__file__).resolve())


class Runs:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.total = 0
        self.active = 0
        self.max_active = 0
        self.tap: Callable[[int], None] | None = None

    def reset(self) -> None:
        with self._lock:
            self.counts.clear()
            self.total = self.active = self.max_active = 0
            self.tap = None

    @contextmanager
    def running(self, job: Job[Any]) -> Iterator[None]:
        with self._lock:
            self.counts[job.job_id or ""] += 1
            self.total += 1
            number = self.total
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            if self.tap is not None:
                self.tap(number)
            yield
        finally:
            with self._lock:
                self.active -= 1


RUNS = Runs()


@handler("sp.quick", timeout=1)
def quick(job: Job[Any]) -> Any:
    with RUNS.running(job):
        return {"n": (job.input or {}).get("n")}


@handler("sp.untimed")
def untimed(job: Job[Any]) -> Any:
    with RUNS.running(job):
        return {"n": (job.input or {}).get("n")}
