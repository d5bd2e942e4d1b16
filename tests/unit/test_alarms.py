"""Unit tier: the alarm thread, and the lease keeper that starts its renewal thread only when
a renewal is due (runtime/alarms.py, runtime/lease.py)."""

from __future__ import annotations

import threading
from typing import Any

from serverless_worker.errors import LeaseRefusedError
from serverless_worker.model import Delivery, Lease
from serverless_worker.runtime.alarms import Alarms
from serverless_worker.runtime.lease import LeaseKeeper
from support.waiting import HANG_SECONDS


def test_alarms_ring_in_time_order_and_a_cancelled_one_never_rings() -> None:
    # given three alarms set out of order, and one of them cancelled
    alarms = Alarms()
    rung: list[str] = []
    last = threading.Event()
    alarms.after(0.10, lambda: rung.append("second"))
    cancelled = alarms.after(0.05, lambda: rung.append("cancelled"))
    alarms.after(0.02, lambda: rung.append("first"))
    alarms.after(0.15, last.set)
    alarms.cancel(cancelled)

    # when the last one has rung
    assert last.wait(HANG_SECONDS)

    # then the others rang before it, in time order, and the cancelled one not at all
    assert rung == ["first", "second"]
    assert alarms.pending() == 0


def test_a_failing_callback_does_not_silence_later_alarms() -> None:
    alarms = Alarms()
    later = threading.Event()

    def broken() -> None:
        raise RuntimeError("boom")

    alarms.after(0.0, broken)
    alarms.after(0.02, later.set)

    assert later.wait(HANG_SECONDS)


class _Protocol:
    def __init__(self, refuse_after: int | None = None) -> None:
        self.renewed = threading.Semaphore(0)
        self.calls = 0
        self.refuse_after = refuse_after

    def renew(self, delivery: Delivery) -> Lease:
        self.calls += 1
        self.renewed.release()
        if self.refuse_after is not None and self.calls > self.refuse_after:
            raise LeaseRefusedError("lease_expired", action="drop")
        return Lease(expires_at=None, renewable=True)


class _Services:
    """What LeaseKeeper uses: the client's ``call`` and the events' ``add``."""

    def __init__(self, protocol: _Protocol) -> None:
        self.protocol = protocol
        self.events = self
        self.noted: list[str] = []

    def call(self, fn: Any) -> Any:
        return fn(self.protocol)

    def add(self, kind: str, message: str, **_: Any) -> None:
        self.noted.append(kind)


def _delivery() -> Delivery:
    return Delivery(ledger_id="1", protocol="claimqueue", handler="h", job_id="j-1", payload={}, wire={})


def _keeper(protocol: _Protocol, alarms: Alarms, renew_every: float, lost: list[str]) -> LeaseKeeper:
    services = _Services(protocol)
    return LeaseKeeper(services, services.events, _delivery(), Lease(expires_at=None, renewable=True),  # type: ignore[arg-type]
                       renew_every=renew_every, on_lost=lost.append, alarm_clock=alarms)


def test_a_job_that_ends_before_its_first_renewal_starts_no_thread_and_renews_nothing() -> None:
    # given a keeper whose first renewal is a minute away
    protocol, alarms, lost = _Protocol(), Alarms(), []
    before = {t.name for t in threading.enumerate()}
    keeper = _keeper(protocol, alarms, 60.0, lost).start()

    # when the job ends first
    keeper.stop()

    # then no renewal thread ever started, nothing was renewed, and the alarm is gone
    assert not any(t.name.startswith("lease-") for t in threading.enumerate() if t.name not in before)
    assert protocol.calls == 0 and alarms.pending() == 0 and lost == []


def test_a_job_that_outlives_its_renewal_interval_renews_until_the_lease_is_refused() -> None:
    # given a keeper renewing every 0.2 s whose third renewal is refused
    protocol, alarms, lost = _Protocol(refuse_after=2), Alarms(), []
    keeper = _keeper(protocol, alarms, 0.2, lost).start()

    # when three renewals have been tried
    for _ in range(3):
        assert protocol.renewed.acquire(timeout=HANG_SECONDS)
    keeper.stop()

    # then two renewed, the third lost the lease once, and renewing stopped there
    assert keeper.renewals == 2
    assert lost == ["lease_lost"] and keeper.lost_reason == "renewal refused: lease_expired"
    assert protocol.calls == 3
