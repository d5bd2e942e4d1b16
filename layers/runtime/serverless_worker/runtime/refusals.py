"""Pacing a job the server keeps refusing: after a hand-back or a refused lease, the next
delivery of the same job waits before it is tried again.

Without it, a server that refuses every lease (a ``401`` on every acquire, a lease answer
the worker cannot read) makes a loop of pull, hand back, pull again at full speed. The
wait is per job (``KeyedBackoff``): jittered, doubling per refusal in a row from
``JOB_REFUSAL_FIRST_SECONDS`` up to ``JOB_REFUSAL_MAX_SECONDS``, forgotten once the job's
handler runs. It is taken in the executor, before the lease, while the delivery is held
(so the job cannot come back meanwhile, and its slot counts in flight), never past half
of the delivery's own lease nor past the invocation's time. The memory is the process's
(the local worker; a warm Lambda container): the session's own back-off
(``runtime/session.py``) holds across containers.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from ..model import Delivery
from .polling import KeyedBackoff

__all__ = ["JOB_REFUSAL_FIRST_SECONDS", "JOB_REFUSAL_MAX_SECONDS", "JobRefusals"]

log = logging.getLogger("serverless_worker.refusals")

JOB_REFUSAL_FIRST_SECONDS = 0.5
JOB_REFUSAL_MAX_SECONDS = 10.0


class JobRefusals:
    """The per-job back-off of one process (``Services.refusals``)."""

    def __init__(self, *, first: float = JOB_REFUSAL_FIRST_SECONDS, cap: float = JOB_REFUSAL_MAX_SECONDS,
                 rng: Callable[[], float] = random.random, clock: Callable[[], float] = time.monotonic) -> None:
        self._backoff = KeyedBackoff(first, cap, rng=rng, clock=clock)

    @staticmethod
    def _key(delivery: Delivery) -> tuple[str, str]:
        return delivery.protocol, delivery.job_id

    def refused(self, delivery: Delivery, why: str) -> float:
        """The job was handed back or its lease refused; returns the wait it earned."""
        wait = self._backoff.note(self._key(delivery))
        log.info("job %s refused (%s); its next delivery waits %.1f s", delivery.job_id, why, wait)
        return wait

    def went_through(self, delivery: Delivery) -> None:
        """The job's handler runs: its next refusal starts from the first wait."""
        self._backoff.clear(self._key(delivery))

    def pause(self, delivery: Delivery, *, remaining: float, now: float) -> float:
        """How long to hold this delivery before taking its lease: what is left of the
        job's back-off, at most half the time to the delivery's own lease end and never
        past ``remaining`` seconds of the invocation."""
        pause = self._backoff.pause(self._key(delivery))
        if pause <= 0:
            return 0.0
        if delivery.lease_expires_at is not None:
            pause = min(pause, (delivery.lease_expires_at - now) / 2)
        return max(0.0, min(pause, remaining))

    def refusals(self, delivery: Delivery) -> int:
        return self._backoff.refusals(self._key(delivery))
