"""A full pull for a short handler fans out where executors keep pulling (``self_pull``):
its deliveries go out flagged, and the scheduler starts up to as many pullers, never more
than the free slots; each puller's slot stays reserved (counted with the ledger's in-flight
items) until its ``by``, and one whose invoke fails frees its slot at once. No fan-out for
a long-running handler or one without a declared timeout, after a pull that was not
full, or with the setting off.

A real Priostack sandbox on loopback and a real SQLite store, as in
test_scheduler_batch_record.py; the tick runs on a clock of its own that only its waits
move. The dispatcher notes what it is asked to start and checks capacity at each start;
its "executors" end their delivery at once (handed back in the ledger), so only the
reservations keep the pullers' slots.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from serverless_worker.errors import DispatchError
from serverless_worker.registry import HandlerMode, HandlerRegistry
from serverless_worker.runtime.context import LocalContext
from serverless_worker.runtime.dispatch import Dispatcher
from serverless_worker.runtime.scheduler import Scheduler, TickReport, _Reservations
from serverless_worker.runtime.services import Services
from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin
from serverless_worker.settings import Settings
from serverless_worker.state import SqliteStateStore
from support.clock import TickClock as Clock

INSTANCE = "fanout-test"
LIMIT, BATCH, WINDOW = 10, 4, 30.0


class FanOutDispatcher(Dispatcher):
    """Notes every start; at each one checks that the ledger's in-flight items plus the
    pullers whose ``by`` has not passed stay within capacity. Its executors end their
    delivery at once; its pullers do nothing (they would pull in the executor's tier)."""

    def __init__(self, store: SqliteStateStore, clock: Clock, *, failing_pullers: int = 0) -> None:
        self.store, self.clock = store, clock
        self.invoked: list[tuple[str, dict[str, Any]]] = []  # (ledger key, keyword arguments as given)
        self.pullers: list[tuple[str, float]] = []           # (handler, by) of each started puller
        self.executions: list[str] = []
        self.peak = 0
        self._failing = failing_pullers
        self._lock = threading.Lock()  # pullers start on the scheduler's dispatch pool

    def _check_capacity(self) -> None:
        now = self.clock()
        held = self.store.count_in_flight("priostack", INSTANCE, live_at=now) \
            + sum(1 for _, by in self.pullers if by > now)
        self.peak = max(self.peak, held)
        assert held <= LIMIT, f"{held} in flight with capacity {LIMIT}"

    def invoke_executor(self, ledger_key: str, **kwargs: Any) -> None:
        self.invoked.append((ledger_key, kwargs))
        self._check_capacity()
        assert self.store.mark_handed_back(ledger_key, "the test's executor ended it")

    def invoke_puller(self, handler: str, by: float) -> None:
        with self._lock:
            if self._failing:
                self._failing -= 1
                raise DispatchError("invoke failed: TooManyRequestsException")
            self.pullers.append((handler, by))
            self._check_capacity()

    def start_execution(self, ledger_key: str, handover_epoch: str | None = None) -> None:
        self.executions.append(ledger_key)


class Harness:
    def __init__(self, server: SandboxServer, admin: SandboxAdmin, tmp_path: Path, *,
                 self_pull: bool = True, mode: HandlerMode = "short", timeout: float | None = 5,
                 failing_pullers: int = 0) -> None:
        self.admin = admin
        self.clock = Clock()
        self.store = SqliteStateStore(tmp_path / "state.sqlite3")
        self.dispatcher = FanOutDispatcher(self.store, self.clock, failing_pullers=failing_pullers)
        registry = HandlerRegistry()
        registry.handler("work", timeout=timeout, mode=mode)(lambda job: {"ok": True})
        settings = Settings(protocol="priostack", base_url=server.url, api_key="sandbox-api-key",
                            instance_id=INSTANCE, handlers=["work"], batch_size=BATCH, max_in_flight=LIMIT,
                            self_pull=self_pull)
        services = Services(settings=settings, store=self.store, registry=registry, dispatcher=self.dispatcher,
                            clock=self.clock)
        self.scheduler = Scheduler(services, sleep=self.clock.sleep)

    def seed(self, count: int) -> None:
        self.admin.seed({"jobs": [{"type": "work", "variables": {"n": n}, "retries": 3} for n in range(count)]})

    def tick(self) -> TickReport:
        start, before = self.clock(), len(self.dispatcher.pullers)
        report = self.scheduler.tick(LocalContext("scheduler", timeout_seconds=60), window=WINDOW)
        assert report.errors == [] and report.stopped is None, report
        # each puller's reservation ends within the tick's window
        assert all(start < by <= start + WINDOW for _, by in self.dispatcher.pullers[before:])
        return report

    def close(self) -> None:
        self.scheduler.close()
        self.store.close()


@pytest.fixture
def harness(tmp_path: Path, serve: Callable[..., SandboxServer],
            admin_for: Callable[[SandboxServer], SandboxAdmin]) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def make(**options: Any) -> Harness:
        server = serve("priostack")
        made.append(Harness(server, admin_for(server), tmp_path, **options))
        return made[-1]

    yield make
    for each in made:
        each.close()


def test_a_full_pull_starts_pullers_up_to_the_free_slots_and_their_reservations_hold(harness: Any) -> None:
    h = harness()
    h.seed(22)

    report = h.tick()

    # first full pull: 4 deliveries and 4 pullers (8 of 10 slots); the executors end their
    # deliveries at once, but the 4 reservations stay counted: the next full pull of 4 leaves
    # room for 2 pullers, and every later one for none.
    assert report.pulled == 22 and report.dispatched == 22
    assert report.pullers == len(h.dispatcher.pullers) == 6 and report.pullers_failed == 0
    assert {handler for handler, _ in h.dispatcher.pullers} == {"work"}
    assert h.dispatcher.peak == LIMIT
    # the full pulls' deliveries (5 x 4) are flagged; the last pull's 2 (not full) are not
    flags = [kwargs for _, kwargs in h.dispatcher.invoked]
    assert flags == [{"pull": True}] * 20 + [{}] * 2


def test_reservations_end_at_their_by_and_a_later_tick_starts_pullers_again(harness: Any) -> None:
    h = harness()
    h.seed(8)
    first = h.tick()
    assert first.pullers == 4 + 2  # as in the test above
    by = max(by for _, by in h.dispatcher.pullers)
    h.clock.now = max(h.clock.now, by)  # every reservation of the first tick has run out

    h.seed(8)
    second = h.tick()

    # all slots free again: had the 6 reservations still held, both full pulls would have
    # found 4 free slots at most, and started no puller
    assert second.pullers == 4 + 2
    assert h.dispatcher.peak <= LIMIT


def test_reservations_are_held_until_by_and_freed_one_by_one() -> None:
    reservations = _Reservations()
    reservations.add(100.0, 3)
    reservations.add(105.0, 2)

    assert reservations.held(99.0) == 5
    reservations.release(100.0)  # a puller whose invoke failed
    assert reservations.held(99.0) == 4
    assert reservations.held(100.0) == 2  # those reserved until 100 are over at 100
    assert reservations.held(104.9) == 2 and reservations.held(105.0) == 0


def test_a_failed_puller_invoke_frees_its_slot(harness: Any) -> None:
    h = harness(failing_pullers=1)
    h.seed(22)

    report = h.tick()

    # 3 of the first 4 pullers start, and the failed one's slot is free again: after the
    # second full pull 3 slots are free (3 reserved + 4 delivered), for 3 more pullers
    assert report.pullers_failed == 1
    assert report.pullers == len(h.dispatcher.pullers) == 3 + 3
    assert report.pulled == 22 and report.dispatched == 22 and report.dispatch_failed == 0
    assert h.dispatcher.peak == LIMIT


def test_no_pullers_after_a_pull_that_was_not_full(harness: Any) -> None:
    h = harness()
    h.seed(3)  # less than a batch

    report = h.tick()

    assert report.pulled == 3 and report.pullers == 0 and h.dispatcher.pullers == []
    assert [kwargs for _, kwargs in h.dispatcher.invoked] == [{}] * 3


def test_no_pullers_and_no_flag_with_self_pull_off(harness: Any) -> None:
    h = harness(self_pull=False)
    h.seed(22)

    report = h.tick()

    assert report.pulled == 22 and report.dispatched == 22
    assert report.pullers == report.pullers_failed == 0 and h.dispatcher.pullers == []
    assert [kwargs for _, kwargs in h.dispatcher.invoked] == [{}] * 22  # today's events, exactly


def test_no_pullers_for_a_long_running_handler(harness: Any) -> None:
    h = harness(mode="slices")
    h.seed(8)

    report = h.tick()

    assert report.pulled == 8 and report.dispatched == 8
    assert report.pullers == 0 and h.dispatcher.pullers == [] and h.dispatcher.invoked == []
    assert len(h.dispatcher.executions) == 8  # the state machine, as today


def test_no_pullers_and_no_flag_for_a_handler_without_a_declared_timeout(harness: Any) -> None:
    # it is promised the executor's whole time: no executor pulls after it
    h = harness(timeout=None)
    h.seed(8)

    report = h.tick()

    assert report.pulled == 8 and report.dispatched == 8
    assert report.pullers == 0 and [kwargs for _, kwargs in h.dispatcher.invoked] == [{}] * 8
