"""Keeping an execution lease alive while a handler runs (its time budget: ``runtime/budget.py``).

Renewal happens in a background thread at about half the lease's remaining time. The
thread starts only when the first renewal is due (an alarm, ``runtime/alarms.py``), so
the many jobs that end before it never start one. A definitive refusal, or reaching the
last confirmed expiry without a successful renewal, cancels the handler cooperatively:
past that point the server may hand the job to someone else, so no further side effects
may start.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..errors import LeaseRefusedError, ProtocolError
from ..model import Delivery, Lease
from .alarms import Alarms, alarms
from .events import EventBuffer
from .protocol_client import ProtocolCaller

__all__ = ["LeaseKeeper"]

log = logging.getLogger("serverless_worker.lease")


class LeaseKeeper:
    """Renews ``delivery``'s lease in a thread until stopped; calls ``on_lost`` once if lost.

    ``client`` renews (the client retries a renewal); ``events`` is told of a lost lease."""

    def __init__(self, client: ProtocolCaller, events: EventBuffer, delivery: Delivery, lease: Lease, *,
                 renew_every: float, on_lost: Callable[[str], None], clock: Callable[[], float] = time.time,
                 alarm_clock: Alarms = alarms) -> None:
        self._client = client
        self._events = events
        self._delivery = delivery
        self._expires_at = lease.expires_at
        self._renew_every = renew_every
        self._on_lost = on_lost
        self._clock = clock
        self._alarms = alarm_clock
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the alarm starting the thread, or stop(): one wins
        self._thread: threading.Thread | None = None
        self.renewals = 0
        self.lost_reason: str | None = None

    @property
    def expires_at(self) -> float | None:
        """The lease's end as last granted (epoch seconds), ``None`` when it has none."""
        return self._expires_at

    def start(self) -> LeaseKeeper:
        self._alarm = self._alarms.after(self._interval(), self._begin)
        return self

    def stop(self) -> None:
        with self._lock:
            self._stop.set()
            thread = self._thread
        self._alarms.cancel(self._alarm)
        if thread is not None:
            thread.join(timeout=5)

    def _begin(self) -> None:
        """On the alarm thread: the first renewal is due and the job still runs."""
        with self._lock:
            if self._stop.is_set():
                return
            self._thread = threading.Thread(target=self._run, name=f"lease-{self._delivery.job_id}", daemon=True)
            self._thread.start()

    def _interval(self) -> float:
        if self._expires_at is None:
            return self._renew_every
        half = (self._expires_at - self._clock()) / 2
        return max(0.2, min(self._renew_every, half))

    def _run(self) -> None:
        while self._renew():
            if self._stop.wait(self._interval()):
                return

    def _renew(self) -> bool:
        """One renewal; ``False`` once the lease is lost and renewing must stop."""
        try:
            lease = self._client.call(lambda p: p.renew(self._delivery))
        except LeaseRefusedError as refusal:
            self._lose(f"renewal refused: {refusal.reason}")
            return False
        except ProtocolError as err:
            if self._expires_at is not None and self._clock() >= self._expires_at - 1.0:
                self._lose(f"lease expired without a confirmed renewal ({type(err).__name__})")
                return False
            log.warning("lease renewal failed, tried again before the lease expires (nothing is lost yet): %s", err)
            return True
        self.renewals += 1
        if lease.expires_at is not None:
            self._expires_at = lease.expires_at
        return True

    def _lose(self, reason: str) -> None:
        self.lost_reason = reason
        from .metrics import metrics

        metrics.add("LeasesLost", 1)
        log.warning("lease lost for job %s: %s; the handler is told to stop and nothing is reported for it (the "
                    "server hands the job out again): only this run's work on it is lost", self._delivery.job_id,
                    reason)
        self._events.add("job.lease_lost", f"job {self._delivery.job_id}: {reason}", level="WARN",
                         job_id=self._delivery.job_id)
        self._on_lost("lease_lost")
