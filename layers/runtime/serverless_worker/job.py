"""The object a handler receives: its input, identity, time budget and a cancel switch.

Python cannot stop a thread from outside, so cancellation is cooperative: the runtime
sets it (lease lost, budget spent, shutdown) and the handler notices through
``job.cancelled``, ``job.raise_if_cancelled()`` or ``job.wait()``, which wakes early.
Handlers should check it between side effects so that a job whose lease is gone starts
no new ones.

This module is the handler's API and nothing else: a handler sees only the members it
uses (``input``, ids, ``remaining``, ``cancelled``, ``wait``, ``progress``, ``log``...).
The runtime builds its jobs and cancels them through ``job_control.py``; a unit test
builds one by hand with ``Job(payload)`` or, better, runs the handler through
:mod:`serverless_worker.testing`.

>>> job = Job({"n": 1})
>>> job.wait(0.01)
False
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from enum import StrEnum
from types import ModuleType
from typing import Any, Protocol

from pydantic import BaseModel

from .errors import JobCancelledError
from .model import ResultLog
from .textforms import rfc3339, truncate_utf8

__all__ = ["MAX_LOG_LINES", "MAX_LOG_MESSAGE_BYTES", "CancelReason", "Job"]

# The types of a Job's runtime wiring (set by ``job_control.runtime_job``, never by a handler).
ProgressReporter = Callable[[Any], None]
# How ``job.wait`` sleeps: given the cancel event and the seconds, True once cancelled.
# The runtime waits on the event; serverless_worker.testing moves a fake clock instead.
Waiter = Callable[[threading.Event, float], bool]


class Clock(Protocol):
    """What the runtime needs of a clock; the ``time`` module is one."""

    def time(self) -> float: ...

    def monotonic(self) -> float: ...


log = logging.getLogger("serverless_worker.job")

MAX_LOG_LINES = 200             # result log lines kept per run; more are counted, not sent
MAX_LOG_MESSAGE_BYTES = 4096    # each kept line is cut to this size


class CancelReason(StrEnum):
    """Why a run was cancelled; compares equal to its plain string."""

    LEASE_LOST = "lease_lost"   # the server refused a renewal: start no further side effects
    TIMEOUT = "timeout"         # the time budget is spent
    SHUTDOWN = "shutdown"       # the worker is stopping


class Job[InputT]:
    """One delivery as a handler sees it.

    ``input`` is the validated model instance when the handler has an input model
    (``job: Job[Model]`` or ``input=Model``), else the decoded payload. ``deadline`` is
    the epoch second the budget ends (``None``: no budget, as in a Job built by hand). ``checkpoint`` is what the
    previous slice returned through :class:`~serverless_worker.results.Continue`.
    ``callback_token`` is set when the handler runs as a Step Functions
    ``.waitForTaskToken`` task; hand it to the external system that finishes the work.
    """

    def __init__(
        self,
        input: InputT = None,  # type: ignore[assignment]
        *,
        raw_payload: Any = None,
        attempt: int = 1,
        retries_left: int | None = None,
        deadline: float | None = None,
        job_id: str = "local",
        ledger_id: str | None = None,
        protocol: str = "local",
        handler: str = "",
        checkpoint: Any = None,
        callback_token: str | None = None,
    ) -> None:
        self.input = input
        self.raw_payload = raw_payload
        self.attempt = attempt
        self.retries_left = retries_left
        self.deadline = deadline
        self.job_id = job_id
        self.ledger_id = ledger_id if ledger_id is not None else job_id
        self.protocol = protocol
        self.handler = handler
        self.checkpoint = checkpoint
        self.callback_token = callback_token
        self._reporter: ProgressReporter | None = None
        self._clock: Clock | ModuleType = time
        self._waiter: Waiter = _wait_on_event
        self._lock = threading.Lock()
        self._cancelled = threading.Event()
        self._cancel_reason: CancelReason | None = None
        self._logs: list[ResultLog] = []
        self._dropped_logs = 0

    def __repr__(self) -> str:
        # Input and callback token stay out: payloads may be sensitive.
        return (f"Job(handler={self.handler!r}, job_id={self.job_id!r}, protocol={self.protocol!r}, "
                f"attempt={self.attempt})")

    # -- identity --------------------------------------------------------------
    @property
    def log_context(self) -> dict[str, Any]:
        """Correlation keys for structured logs (Powertools ``append_keys`` or ``extra=``)."""
        return {"job_id": self.job_id, "ledger_id": self.ledger_id, "handler": self.handler,
                "protocol": self.protocol, "attempt": self.attempt}

    # -- time ------------------------------------------------------------------
    def remaining(self) -> float:
        """Seconds left in the budget (``inf`` without a deadline, never negative)."""
        if self.deadline is None:
            return math.inf
        return max(0.0, self.deadline - self._clock.time())

    # -- cancellation ----------------------------------------------------------
    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def cancel_reason(self) -> CancelReason | None:
        return self._cancel_reason

    def _cancel(self, reason: CancelReason | str) -> None:
        """See :func:`cancel_job`."""
        with self._lock:
            if self._cancel_reason is None:
                self._cancel_reason = CancelReason(reason)
        self._cancelled.set()

    def raise_if_cancelled(self) -> None:
        """Raise :class:`JobCancelledError` once the run is cancelled; call between side effects."""
        if self._cancelled.is_set():
            raise JobCancelledError(str(self._cancel_reason or CancelReason.SHUTDOWN))

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``, waking early on cancellation. Returns True if cancelled."""
        return self._waiter(self._cancelled, max(0.0, seconds))

    # -- reporting ---------------------------------------------------------------
    def progress(self, value: Any) -> bool:
        """Report progress where the protocol can (claim queue). Best effort: never raises.

        Returns whether the report was handed over. Nothing is sent once cancelled:
        a job that lost its lease starts no further calls.
        """
        if self._reporter is None or self._cancelled.is_set():
            return False
        try:
            self._reporter(value.model_dump(mode="json") if isinstance(value, BaseModel) else value)
        except Exception as err:
            log.warning("progress report failed: %s", type(err).__name__, extra=self.log_context)
            return False
        return True

    def log(self, message: str, level: str = "INFO") -> None:
        """Add a line to the result log (Pipelogiq shows it on the stage) and log it here too."""
        level_name = str(level).upper()
        text = truncate_utf8(str(message), MAX_LOG_MESSAGE_BYTES)
        line = ResultLog(message=text, logLevel=level_name, created=rfc3339(self._clock.time()))
        with self._lock:
            if len(self._logs) < MAX_LOG_LINES:
                self._logs.append(line)
            else:
                self._dropped_logs += 1
        levelno = logging.getLevelNamesMapping().get("WARNING" if level_name == "WARN" else level_name,
                                                     logging.INFO)
        log.log(levelno, "%s", text, extra=self.log_context)

    @property
    def logs(self) -> list[ResultLog]:
        """A copy of the collected result log lines (plus a note when some were dropped)."""
        with self._lock:
            lines = list(self._logs)
            dropped = self._dropped_logs
        if dropped:
            lines.append(ResultLog(message=f"{dropped} more log lines were dropped", logLevel="WARNING",
                                   created=rfc3339(self._clock.time())))
        return lines


def _wait_on_event(event: threading.Event, seconds: float) -> bool:
    return event.wait(seconds)
