"""The runtime's side of a :class:`~serverless_worker.job.Job`: build one wired to the
runtime's clock, progress reporter and waiter, and cancel it.

Kept out of ``job.py`` so that module is exactly what a handler author sees; the handler
runner and ``serverless_worker.testing`` are the callers here.
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any, TypedDict, Unpack

from .job import CancelReason, Clock, Job, ProgressReporter, Waiter

__all__ = ["Clock", "JobFields", "ProgressReporter", "Waiter", "cancel_job", "runtime_job"]


class JobFields(TypedDict, total=False):
    """The keywords of ``Job.__init__``, for the runtime to pass through (defaults live there)."""

    raw_payload: Any
    attempt: int
    retries_left: int | None
    deadline: float | None
    job_id: str
    ledger_id: str | None
    protocol: str
    handler: str
    checkpoint: Any
    callback_token: str | None


def runtime_job[InputT](
    input: InputT,
    *,
    clock: Clock | ModuleType = time,
    reporter: ProgressReporter | None = None,
    waiter: Waiter | None = None,
    **fields: Unpack[JobFields],
) -> Job[InputT]:
    """A Job wired to the runtime's clock and progress reporter (and, for fake time, a waiter).

    Kept out of ``Job.__init__`` so a handler author never sees these knobs.
    """
    job: Job[InputT] = Job(input, **fields)
    job._clock = clock
    job._reporter = reporter
    if waiter is not None:
        job._waiter = waiter
    return job


def cancel_job(job: Job[Any], reason: CancelReason | str) -> None:
    """Ask the handler running ``job`` to stop. The first reason wins; unknown reasons raise
    ValueError. For the runtime (lease lost, budget spent, shutdown), not for handlers."""
    job._cancel(reason)
