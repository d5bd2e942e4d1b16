"""One thread that calls a function at a given time, for work that is usually cancelled first.

A job's lease renewal is due after seconds, and most jobs finish long before: starting a
renewal thread for each job cost a thread start and join per job, a tenth of a
millisecond of the local worker's CPU, to renew nothing. Instead each job sets an alarm,
cancelled when it ends; only a job still running when its alarm rings starts a thread.
Callbacks run on the alarm thread, so they must be quick (start a thread, set an event).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Alarm", "Alarms", "alarms"]

log = logging.getLogger("serverless_worker.alarms")


@dataclass(order=True)
class Alarm:
    """A pending call; :meth:`Alarms.cancel` (or ``cancelled = True``) stops it."""

    at: float
    seq: int
    callback: Callable[[], None] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)


class Alarms:
    """A heap of alarms and the daemon thread that rings them (started with the first)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._heap: list[Alarm] = []
        self._seq = itertools.count()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def after(self, seconds: float, callback: Callable[[], None]) -> Alarm:
        """Call ``callback`` on the alarm thread in ``seconds`` unless cancelled first."""
        alarm = Alarm(self._clock() + max(0.0, seconds), next(self._seq), callback)
        with self._changed:
            heapq.heappush(self._heap, alarm)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._ring, name="sw-alarms", daemon=True)
                self._thread.start()
            if self._heap[0] is alarm:
                self._changed.notify()
        return alarm

    @staticmethod
    def cancel(alarm: Alarm) -> None:
        """Stop ``alarm`` from ringing (it leaves the heap when its time comes)."""
        alarm.cancelled = True

    def pending(self) -> int:
        with self._changed:
            return sum(1 for alarm in self._heap if not alarm.cancelled)

    def _next_due(self) -> Alarm:
        with self._changed:
            while True:
                while self._heap and self._heap[0].cancelled:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._changed.wait()
                    continue
                wait = self._heap[0].at - self._clock()
                if wait <= 0:
                    return heapq.heappop(self._heap)
                self._changed.wait(wait)

    def _ring(self) -> None:
        while True:
            alarm = self._next_due()
            if alarm.cancelled:
                continue
            try:
                alarm.callback()
            except Exception:  # one failing callback must not silence every later alarm
                log.exception("alarm callback failed")


alarms = Alarms()
