"""Handlers for the AWS-tier end-to-end tests. They record every run, so a test can
assert that a handler ran exactly once per job and never more than N at once.

The harness loads this file by path (``handler_module=HANDLERS_PATH``); a test gets the
very same module object back from ``load_handlers(HANDLERS_PATH)`` (it is cached under
its private module name), so ``RECORDER`` is shared with the executors' threads.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from serverless_worker import BusinessError, Job, handler

__all__ = ["HANDLERS_PATH", "RECORDER", "ExecutorKilled", "Order", "Recorder"]

HANDLERS_PATH = str(Path(__file__).resolve())


class ExecutorKilled(BaseException):
    """Not an Exception: the runner re-raises it, so the executor invocation dies
    mid-handler with its ledger item left RUNNING, as a killed Lambda would leave it."""


class Recorder:
    """Thread-safe record of handler runs: ``(handler, job_id)`` in start order, and the
    highest number of handlers running at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.runs: list[tuple[str, str]] = []
        self.active = 0
        self.max_active = 0
        self.died: set[str] = set()
        self.release = threading.Event()     # lets e2e.hang return
        self.started = threading.Condition(self._lock)
        self.cancel_reasons: dict[str, str | None] = {}  # e2e.progressing: why each run stopped
        self.self_pulled: set[str] = set()  # job ids an executor pulled itself (filled by the test)

    def reset(self) -> None:
        with self._lock:
            self.runs.clear()
            self.active = self.max_active = 0
            self.died.clear()
            self.release = threading.Event()
            self.cancel_reasons.clear()
            self.self_pulled.clear()

    def enter(self, name: str, job: Job[Any]) -> None:
        with self._lock:
            self.runs.append((name, job.job_id or ""))
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            self.started.notify_all()

    def leave(self) -> None:
        with self._lock:
            self.active -= 1

    def first_run_dies(self, job_id: str) -> bool:
        """True the first time it is asked for ``job_id``."""
        with self._lock:
            if job_id in self.died:
                return False
            self.died.add(job_id)
            return True

    def wait_active(self, count: int, timeout: float = 60.0) -> bool:
        """Block until at least ``count`` handlers run at once; the limit only bounds a hang
        (as tests/support/waiting.py's ``HANG_SECONDS``: this file also runs in a Lambda)."""
        with self._lock:
            return self.started.wait_for(lambda: self.active >= count, timeout)

    def counts(self, handler_name: str | None = None) -> Counter[str]:
        """How many times each job id ran (for one handler, or all)."""
        with self._lock:
            return Counter(job for name, job in self.runs if handler_name in (None, name))


RECORDER = Recorder()


class _recorded:
    def __init__(self, name: str, job: Job[Any]) -> None:
        self.name, self.job = name, job

    def __enter__(self) -> None:
        RECORDER.enter(self.name, self.job)

    def __exit__(self, *exc: object) -> None:
        RECORDER.leave()


@handler("e2e.echo")
def echo(job: Job[Any]) -> Any:
    with _recorded("e2e.echo", job):
        return job.input


# A job held until the drain (``until_draining``) ends this long before its own budget does,
# so a drain that never comes fails the test on its counts, not on a timed-out job.
_DRAIN_HOLD_MARGIN = 5.0


def _sleep_then_hold(job: Job[Any]) -> Any:
    """Sleep ``input["sleep"]`` seconds (cooperatively: a cancel wakes it), then with
    ``input["until_draining"]`` hold on until this worker's drain has begun."""
    seconds = float((job.input or {}).get("sleep", 0.5))
    job.wait(seconds)
    job.raise_if_cancelled()
    if (job.input or {}).get("until_draining"):
        _until_draining(job)
    return {"slept": seconds, "n": (job.input or {}).get("n")}


def _until_draining(job: Job[Any]) -> None:
    """Hold until the worker's control item says draining (the drain's first write, before
    it counts what is in flight), or until the job's budget is nearly spent: the deployed
    drain tests find these jobs running however late a loaded machine brings the drain.
    Read from the state table, as a deployed executor's handler can."""
    from serverless_worker.runtime.entry import services_from_environment

    services = services_from_environment()
    while not services.store.get_control(services.protocol_name, services.instance).get("draining"):
        if job.remaining() <= _DRAIN_HOLD_MARGIN:
            return
        job.wait(0.5)
        job.raise_if_cancelled()


@handler("e2e.slow")
def slow(job: Job[Any]) -> Any:
    """Sleeps ``input["sleep"]`` seconds (cooperatively: a cancel wakes it); with
    ``until_draining``, then holds until the drain."""
    with _recorded("e2e.slow", job):
        return _sleep_then_hold(job)


class Order(BaseModel):
    orderId: str = Field(min_length=1)
    amount: float = Field(gt=0)


@handler("e2e.validated", input=Order)
def validated(job: Job[Order]) -> Any:
    with _recorded("e2e.validated", job):
        return {"orderId": job.input.orderId, "charged": job.input.amount}


@handler("e2e.reject")
def reject(job: Job[Any]) -> Any:
    with _recorded("e2e.reject", job):
        raise BusinessError("OUT_OF_STOCK", "nothing left to ship", {"sku": (job.input or {}).get("sku")})


@handler("e2e.boom")
def boom(job: Job[Any]) -> Any:
    with _recorded("e2e.boom", job):
        raise ValueError("boom: the handler failed")


@handler("e2e.die")
def die(job: Job[Any]) -> Any:
    """The first run of each job kills its executor mid-handler; later runs succeed."""
    with _recorded("e2e.die", job):
        if RECORDER.first_run_dies(job.job_id or ""):
            raise ExecutorKilled(f"executor killed while running job {job.job_id}")
        return {"survived": True}


# The same handlers with a declared timeout: an executor pulls its next job itself only for a
# handler with one (docs/limits.md), so the tests of executors that keep pulling run these.
# Short enough to fit the 5 s unrenewable claim-queue leases of the fault suites.
TIMED = 2.5


@handler("e2e.echo-timed", timeout=TIMED)
def echo_timed(job: Job[Any]) -> Any:
    with _recorded("e2e.echo-timed", job):
        return job.input


@handler("e2e.slow-timed", timeout=TIMED)
def slow_timed(job: Job[Any]) -> Any:
    """e2e.slow with a timeout."""
    with _recorded("e2e.slow-timed", job):
        seconds = float((job.input or {}).get("sleep", 0.5))
        job.wait(seconds)
        job.raise_if_cancelled()
        return {"slept": seconds, "n": (job.input or {}).get("n")}


@handler("e2e.die-self-pulled", timeout=TIMED)
def die_self_pulled(job: Job[Any]) -> Any:
    """The first run of a job an executor pulled itself (``RECORDER.self_pulled``) kills that
    executor mid-handler; every other run succeeds."""
    with _recorded("e2e.die-self-pulled", job):
        if job.job_id in RECORDER.self_pulled and RECORDER.first_run_dies(job.job_id or ""):
            raise ExecutorKilled(f"executor killed while running self-pulled job {job.job_id}")
        return {"survived": True}


@handler("e2e.slow-timed-long", timeout=30)
def slow_timed_long(job: Job[Any]) -> Any:
    """e2e.slow (and its ``until_draining``) with room for a long sleep (the deployed tier's
    slow backlog): within a 60 s executor less its report margin, and leaving a self-pulling
    executor time for a second job."""
    with _recorded("e2e.slow-timed-long", job):
        return _sleep_then_hold(job)


def _until_released(name: str, job: Job[Any]) -> Any:
    with _recorded(name, job):
        release = RECORDER.release
        while not release.wait(0.05):
            job.raise_if_cancelled()
        return {"released": True}


@handler("e2e.progressing")
def progressing(job: Job[Any]) -> Any:
    """Reports progress every 0.1 s for up to ``input["seconds"]`` (30) or until cancelled."""
    with _recorded("e2e.progressing", job):
        steps = int(float((job.input or {}).get("seconds", 30)) * 10)
        for step in range(steps):
            if job.wait(0.1):
                break
            job.progress({"step": step})
        RECORDER.cancel_reasons[job.job_id or ""] = job.cancel_reason
        job.raise_if_cancelled()
        return {"steps": steps}


@handler("e2e.hang")
def hang(job: Job[Any]) -> Any:
    """Runs until the test sets ``RECORDER.release`` or the run is cancelled (a zombie)."""
    return _until_released("e2e.hang", job)


@handler("e2e.gate")
def gate(job: Job[Any]) -> Any:
    """Holds its job running until the test sets ``RECORDER.release`` (work in flight)."""
    return _until_released("e2e.gate", job)
