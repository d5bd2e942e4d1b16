"""The one handler of the randomized fault run (test_randomized_faults.py), loaded by path.

One handler name for every kind of job: the scheduler long-polls each handler name in turn,
and an empty queue costs a whole second per round, so separate handlers for the few
failing jobs would starve the many echo jobs once their own queues ran dry. The input says
what the run does: succeed, reject (BusinessError), raise, or fail the model (bad input,
so the body never runs). ``RUNS`` counts runs per job id for the invariants.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from serverless_worker import BusinessError, Job, handler

__all__ = ["HANDLER", "HANDLERS_PATH", "RUNS", "TIMED_HANDLER", "Mixed", "Runs", "mixed", "mixed_timed"]

HANDLER = "rand.mixed"
# The same with a declared timeout, for the self-pull path (an executor pulls its next job
# itself only for such a handler); short enough for the claim queue's 5 s unrenewable lease.
TIMED_HANDLER = "rand.mixed-timed"
HANDLERS_PATH = str(Path(__file__).resolve())


class Runs:
    """Thread-safe handler runs per job id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: Counter[str] = Counter()

    def add(self, job_id: str) -> None:
        with self._lock:
            self._runs[job_id] += 1

    def reset(self) -> None:
        with self._lock:
            self._runs.clear()

    def counts(self) -> Counter[str]:
        with self._lock:
            return Counter(self._runs)


RUNS = Runs()


class Mixed(BaseModel):
    kind: Literal["echo", "ok", "reject", "boom", "bad"]
    n: int
    amount: float = Field(gt=0)  # "bad" jobs send -1: the model refuses them


@handler(HANDLER, input=Mixed)
def mixed(job: Job[Mixed]) -> dict[str, object]:
    return _run(job)


@handler(TIMED_HANDLER, input=Mixed, timeout=2.5)
def mixed_timed(job: Job[Mixed]) -> dict[str, object]:
    return _run(job)


def _run(job: Job[Mixed]) -> dict[str, object]:
    RUNS.add(job.job_id or "")
    kind = job.input.kind
    if kind == "reject":
        raise BusinessError("OUT_OF_STOCK", "nothing left to ship", {"n": job.input.n})
    if kind == "boom":
        raise ValueError("boom: the handler failed")
    return {"kind": kind, "n": job.input.n}
