"""Handlers for the reliability suite, loaded by path (``SW_HANDLER_MODULE``) by the AWS tier.

Names start with ``rel-`` so they never collide with the example handlers in the shared
default registry.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

from pydantic import BaseModel, Field

from serverless_worker import Continue, Job, handler

__all__ = ["CALLS", "Opaque", "Order", "Report", "echo", "huge", "huge_item", "not_json", "slow_report", "strict"]

# Handler calls per name, so a test can prove a handler never ran.
CALLS: dict[str, int] = {}
# Over Pipelogiq's 262,144-byte result cap, but well inside a DynamoDB item.
HUGE_RESULT_BYTES = 300_000
# Over DynamoDB's 400 KB item limit: the outcome cannot even be stored as it is.
HUGE_ITEM_BYTES = 500_000


def _count(name: str) -> None:
    CALLS[name] = CALLS.get(name, 0) + 1


class Order(BaseModel):
    orderId: str = Field(min_length=1)
    amount: float = Field(gt=0)


@handler("rel-echo")
def echo(job: Job[Any]) -> Any:
    _count("rel-echo")
    return job.input


@handler("rel-strict", input=Order)
def strict(job: Job[Order]) -> dict[str, Any]:
    _count("rel-strict")
    return {"orderId": job.input.orderId, "charged": job.input.amount}


@handler("rel-huge")
def huge(job: Job[Any]) -> str:
    _count("rel-huge")
    return "x" * HUGE_RESULT_BYTES


@handler("rel-huge-item")
def huge_item(job: Job[Any]) -> str:
    _count("rel-huge-item")
    return "y" * HUGE_ITEM_BYTES


class Opaque:
    """Not JSON: a handler returning one returns an invalid result, however often it runs."""


@handler("rel-not-json")
def not_json(job: Job[Any]) -> dict[str, Any]:
    _count("rel-not-json")
    return {"value": Opaque()}


class Report(BaseModel):
    pages: int = Field(default=2, ge=1, le=50)


@handler("rel-slow-report", input=Report, mode="slices")
def slow_report(job: Job[Report]) -> Any:
    """One page per slice, so the job runs through the state machine's loop."""
    _count("rel-slow-report")
    state = job.checkpoint or {"page": 0}
    state = {"page": state["page"] + 1}
    if state["page"] < job.input.pages:
        return Continue(state)
    return {"pages": state["page"]}


# -- fault matrix B (test_fault_matrix_runs.py) ---------------------------------------------
class FaultRuns:
    """Handler runs per job id (a re-run shows as a count above one), and the event that lets
    ``rel-fault-deaf`` return: each test gets a fresh one from :meth:`reset`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: Counter[str] = Counter()
        self.release = threading.Event()

    def enter(self, job: Job[Any]) -> None:
        with self._lock:
            self._runs[job.job_id or ""] += 1

    def counts(self) -> Counter[str]:
        with self._lock:
            return Counter(self._runs)

    def reset(self) -> None:
        """Forget the runs; release any handler still ignoring its cancellation."""
        with self._lock:
            self.release.set()
            self.release = threading.Event()
            self._runs.clear()


FAULT_RUNS = FaultRuns()
__all__ += ["FAULT_RUNS", "FaultRuns", "fault_deaf", "fault_long", "fault_overrun"]


@handler("rel-fault-overrun", timeout=1)
def fault_overrun(job: Job[Any]) -> dict[str, Any]:
    """Would work 30 s against a 1 s budget; stops cooperatively when cancelled."""
    FAULT_RUNS.enter(job)
    job.wait(30)
    job.raise_if_cancelled()
    return {"overran": False}


@handler("rel-fault-deaf", timeout=1)
def fault_deaf(job: Job[Any]) -> dict[str, Any]:
    """Overruns its 1 s budget and ignores cancellation (no ``job.wait``, no checks) until the
    test releases it, 20 s at most: the runner has to abandon its thread."""
    FAULT_RUNS.enter(job)
    FAULT_RUNS.release.wait(20)
    return {"late": True}


@handler("rel-fault-long", mode="slices")
def fault_long(job: Job[Any]) -> dict[str, Any]:
    """Works ``seconds`` (``retry_seconds`` from the second attempt on) on the state machine
    path in small cooperative steps, so a lost lease or the budget stops it at once."""
    FAULT_RUNS.enter(job)
    seconds = float(job.input.get("seconds", 1))
    if job.attempt > 1 and "retry_seconds" in job.input:
        seconds = float(job.input["retry_seconds"])
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        job.wait(min(0.1, left))
        job.raise_if_cancelled()
    return {"worked": seconds, "attempt": job.attempt}
