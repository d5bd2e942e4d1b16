"""A running tick honours a drain within ``CONTROL_CHECK_SECONDS`` (runtime/control.py), not at
its next heartbeat: once the flag is set it starts no pull, what a pull brings back after
the flag is recorded and handed back unstarted (never dispatched), and the drain itself
waits out that time (``quiet_seconds``) before it trusts an empty in-flight count.

A real Priostack sandbox on loopback and a real SQLite store; the tick runs on a clock of
its own that only its waits move, so "within two seconds" is the tick's time, not the
machine's. The executors this dispatcher "starts" keep running until the test settles them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from serverless_worker.model import LedgerStatus
from serverless_worker.protocols.base import PullRequest
from serverless_worker.registry import HandlerRegistry
from serverless_worker.runtime.context import LocalContext
from serverless_worker.runtime.control import CONTROL_CHECK_SECONDS, pull_quiet_seconds
from serverless_worker.runtime.dispatch import Dispatcher
from serverless_worker.runtime.drain import drain
from serverless_worker.runtime.scheduler import Scheduler, TickReport
from serverless_worker.runtime.services import Services
from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin
from serverless_worker.settings import Settings
from serverless_worker.state import SqliteStateStore
from support.clock import TickClock

INSTANCE = "drain-seen-test"
LIMIT, WINDOW = 4, 30.0


class RunningExecutors(Dispatcher):
    """Notes each executor it is asked to start; they run until the test settles them."""

    def __init__(self) -> None:
        self.invoked: list[str] = []

    def invoke_executor(self, ledger_key: str, **kwargs: Any) -> None:
        self.invoked.append(ledger_key)

    def invoke_puller(self, handler: str, by: float) -> None:
        raise AssertionError("no pullers: self_pull is off here")

    def start_execution(self, ledger_key: str, handover_epoch: str | None = None) -> None:
        raise AssertionError("no long-running handler here")


class Harness:
    def __init__(self, server: SandboxServer, admin: SandboxAdmin, tmp_path: Path) -> None:
        self.admin = admin
        self.clock = TickClock()
        self.store = SqliteStateStore(tmp_path / "state.sqlite3")
        self.dispatcher = RunningExecutors()
        registry = HandlerRegistry()
        registry.handler("work", timeout=5)(lambda job: {"ok": True})
        settings = Settings(protocol="priostack", base_url=server.url, api_key="sandbox-api-key",
                            instance_id=INSTANCE, handlers=["work"], batch_size=LIMIT, max_in_flight=LIMIT)
        self.services = Services(settings=settings, store=self.store, registry=registry,
                                 dispatcher=self.dispatcher, clock=self.clock)
        self.scheduler = Scheduler(self.services, sleep=self.clock.sleep)

    def seed(self, count: int) -> None:
        self.admin.seed({"jobs": [{"type": "work", "variables": {"n": n}, "retries": 3} for n in range(count)]})

    def tick(self) -> TickReport:
        return self.scheduler.tick(LocalContext("scheduler", timeout_seconds=60), window=WINDOW)

    def activations(self) -> int:
        return int(self.admin.stats()["calls"].get("activate", 0))

    def settle_running(self) -> None:
        """Every executor finishes: the slots are free (as for a drain whose count reached 0)."""
        for item in self.store.in_flight("priostack", INSTANCE):
            assert self.store.mark_handed_back(item.key, "the test's executor ended it")

    def fails(self) -> list[list[tuple[str, int]]]:
        """Each job's applied calls: (action, retries sent)."""
        return [[(c["action"], c["body"].get("retries")) for c in job["calls"] if c.get("applied")]
                for job in self.admin.jobs()]

    def close(self) -> None:
        self.scheduler.close()
        self.services.close()
        self.store.close()


@pytest.fixture
def harness(tmp_path: Path, serve: Callable[..., SandboxServer],
            admin_for: Callable[[SandboxServer], SandboxAdmin]) -> Iterator[Harness]:
    server = serve("priostack")
    made = Harness(server, admin_for(server), tmp_path)
    yield made
    made.close()


def test_a_tick_waiting_for_capacity_stops_pulling_within_the_control_check(harness: Harness) -> None:
    h = harness
    h.seed(5 * LIMIT)
    seen: dict[str, float] = {}
    pulls: list[float] = []
    real_sleep, real_pull = h.clock.sleep, h.services.protocol.pull

    def sleep(seconds: float) -> None:
        real_sleep(seconds)
        if "flag" not in seen and h.clock() - start >= 3.0:
            # A drain begins while the tick waits for capacity, and every executor then
            # finishes: the drain's count reaches 0, and the tick's slots are all free.
            h.store.set_draining("priostack", INSTANCE, True)
            seen["flag"] = h.clock()
            h.settle_running()

    def pull(request: PullRequest) -> Any:
        pulls.append(h.clock())
        return real_pull(request)

    h.clock.sleep = sleep  # type: ignore[method-assign]
    h.scheduler._sleep = h.scheduler._wait_for_capacity = sleep
    h.services.protocol.pull = pull  # type: ignore[method-assign]
    start = h.clock()
    report = h.tick()

    assert report.stopped == "draining", report
    # No pull once the tick's read of the control item is CONTROL_CHECK_SECONDS old: with
    # slots free every round, it would have pulled on until its next heartbeat (15 s).
    assert pulls and max(pulls) < seen["flag"] + CONTROL_CHECK_SECONDS, (pulls, seen)
    assert start + report.duration <= seen["flag"] + CONTROL_CHECK_SECONDS + 1.0, (report.duration, seen)
    assert report.pulled == len(h.dispatcher.invoked) < 5 * LIMIT
    assert sum(job["state"] == "waiting" for job in h.admin.jobs()) >= LIMIT  # the rest never pulled


def test_work_a_pull_brings_back_after_the_flag_is_handed_back_unstarted(harness: Harness) -> None:
    h = harness
    h.seed(LIMIT)
    protocol = h.services.protocol
    real_pull = protocol.pull

    def long_pull(request: PullRequest) -> Any:
        # The pull was sent before the drain began and answered after it (a long poll).
        deliveries = real_pull(request)
        h.store.set_draining("priostack", INSTANCE, True)
        h.clock.sleep(CONTROL_CHECK_SECONDS + 1.0)
        return deliveries

    protocol.pull = long_pull  # type: ignore[method-assign]
    report = h.tick()

    assert report.stopped == "draining", report
    assert report.pulled == LIMIT and report.handed_back == LIMIT and report.dispatched == 0, report
    assert h.dispatcher.invoked == []  # nothing started
    items = h.store.in_flight("priostack", INSTANCE)
    assert items == []
    assert h.fails() == [[("fail", 3)]] * LIMIT  # back on the server, retries unchanged


def test_the_drain_waits_out_the_quiet_time_and_hands_back_what_a_late_tick_recorded(harness: Harness) -> None:
    h = harness
    h.seed(1)
    late: list[str] = []

    def sleep(seconds: float) -> None:
        # A tick that read the control item just before the flag was set records a delivery
        # after the drain's first count found nothing in flight.
        h.clock.sleep(seconds)
        if not late:
            (delivery,) = h.services.protocol.pull(PullRequest(handler="work", max_items=1))
            key = h.store.record_delivery(delivery, instance=INSTANCE, deadline=h.clock() + 60,
                                          dispatch_mode="invoke")
            assert key is not None
            late.append(key)

    quiet = pull_quiet_seconds(h.services.settings, long_poll=False)
    report = drain(h.services, grace_seconds=60, quiet_seconds=quiet, sleep=sleep, shutdown=False)

    assert late and report.handed_back == 1 and report.still_running == 0, report
    assert report.waited_seconds >= quiet
    assert h.store.get(late[0]).status is LedgerStatus.HANDED_BACK  # type: ignore[union-attr]
    assert h.fails() == [[("fail", 3)]]


def test_a_drain_with_no_quiet_time_returns_at_once_on_an_empty_count(harness: Harness) -> None:
    report = drain(harness.services, grace_seconds=60, quiet_seconds=0.0, sleep=harness.clock.sleep,
                   shutdown=False)
    assert report.waited_seconds == 0.0 and report.handed_back == 0, report


def test_the_quiet_time_covers_a_long_poll_where_the_protocol_long_polls(harness: Harness) -> None:
    settings = harness.services.settings
    assert pull_quiet_seconds(settings, long_poll=True) - pull_quiet_seconds(settings, long_poll=False) \
        == settings.wait_seconds_long_poll
    assert pull_quiet_seconds(settings, long_poll=False) > CONTROL_CHECK_SECONDS
