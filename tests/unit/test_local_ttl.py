"""The local runner's retention: settled ledger items expire after the local retention and
the state file's sweep (SqliteStateStore's stand-in for DynamoDB's TTL) deletes them, telling
the runner which went; live ones stay. No timing: the store runs on a fake clock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from serverless_worker.errors import ConfigurationError
from serverless_worker.local.observe import RunObserver
from serverless_worker.local.state_file import LocalState
from serverless_worker.model import Delivery, LedgerStatus
from serverless_worker.state import FINAL_RETENTION_SECONDS, DynamoStateStore, SqliteStateStore
from support.clock import TickClock

RETENTION = 600
START = 1_900_000_000.0  # the fake clock's first reading


def _store(path: Path, clock: TickClock, swept: list[str] | None = None) -> SqliteStateStore:
    # A sweep interval longer than any test: only the explicit sweep() calls delete.
    return SqliteStateStore(path, clock=clock, final_retention_seconds=RETENTION, sweep_interval=1e9,
                            on_swept=swept.extend if swept is not None else None)


def _delivery(ledger_id: str) -> Delivery:
    return Delivery(protocol="priostack", handler="soak.mixed", job_id=f"job-{ledger_id}", ledger_id=ledger_id,
                    attempt=1, payload={"n": 1}, timeout_seconds=30.0, token=SecretStr("t0ken"), wire={})


def _settle(store: SqliteStateStore, clock: TickClock, ledger_id: str) -> str:
    key = store.record_delivery(_delivery(ledger_id), instance="local", deadline=clock.now + 60,
                                dispatch_mode="invoke")
    assert key is not None
    assert store.mark_discarded(key, "duplicate")
    return key


def test_sweep_deletes_expired_items_and_keeps_live_ones(tmp_path: Path) -> None:
    clock = TickClock(START)
    swept: list[str] = []
    store = _store(tmp_path / "state.sqlite3", clock, swept)
    old = _settle(store, clock, "old")
    clock.now += 300
    young = _settle(store, clock, "young")
    running = store.record_delivery(_delivery("running"), instance="local", deadline=clock.now + 3600,
                                    dispatch_mode="invoke")  # in flight: no ttl at all
    assert running is not None
    old_item = store.get(old)
    assert old_item is not None and old_item.ttl == int(clock.now) - 300 + RETENTION

    assert store.sweep() == 0  # nothing expired yet
    clock.now += RETENTION - 300 + 1  # past the old item's ttl, before the young one's
    assert store.sweep() == 1
    assert swept == [old]
    assert store.get(old) is None
    young_item, running_item = store.get(young), store.get(running)
    assert young_item is not None and young_item.status is LedgerStatus.DISCARDED
    assert running_item is not None and running_item.status is LedgerStatus.RECORDED

    clock.now += 300
    assert store.sweep() == 1 and store.get(young) is None
    assert store.get(running) is not None
    assert swept == [old, young]


def test_a_redelivery_recorded_after_the_sweep_is_new(tmp_path: Path) -> None:
    """Duplicate detection lasts the retention: after the sweep the same ledger id records again."""
    clock = TickClock(START)
    store = _store(tmp_path / "state.sqlite3", clock)
    key = _settle(store, clock, "again")
    assert store.record_delivery(_delivery("again"), instance="local", deadline=clock.now + 60,
                                 dispatch_mode="invoke") is None  # a duplicate within the retention
    clock.now += RETENTION + 1
    assert store.sweep() >= 1
    assert store.record_delivery(_delivery("again"), instance="local", deadline=clock.now + 60,
                                 dispatch_mode="invoke") == key


def test_the_file_keeps_settled_items_across_runs_until_their_retention(tmp_path: Path) -> None:
    """A restart on the same file still knows a delivery settled a minute ago (a duplicate)."""
    clock = TickClock(START)
    path = tmp_path / "state.sqlite3"
    first = _store(path, clock)
    _settle(first, clock, "kept")
    first.close()
    clock.now += 60
    second = _store(path, clock)
    assert second.record_delivery(_delivery("kept"), instance="local", deadline=clock.now + 60,
                                  dispatch_mode="invoke") is None


def test_the_summary_reads_this_runs_share_of_a_kept_file(tmp_path: Path) -> None:
    clock = TickClock(START)
    store = _store(tmp_path / "state.sqlite3", clock)
    earlier = _settle(store, clock, "earlier")
    left = store.record_delivery(_delivery("left"), instance="local", deadline=clock.now + 60,
                                 dispatch_mode="invoke")  # in flight, left by the earlier run
    clock.now += 60
    started = clock.now
    mine = _settle(store, clock, "mine")
    keys = {doc["pk"] for doc in store.ledger_documents(updated_since=started)}
    assert keys == {left, mine}
    assert {doc["pk"] for doc in store.ledger_documents()} == {earlier, left, mine}


def test_the_stack_keeps_seven_days() -> None:
    assert FINAL_RETENTION_SECONDS == 7 * 86400
    assert DynamoStateStore("t", client=object())._final_retention == FINAL_RETENTION_SECONDS


def test_observer_forgets_swept_deliveries() -> None:
    observer = RunObserver()
    observer.handler_started("a")
    observer.handler_started("b")
    observer.forget(["a", "missing"])
    assert list(observer.handler_starts) == ["b"]


def test_runner_maps_swept_keys_to_ledger_ids() -> None:
    from serverless_worker.local.worker import LocalRunner

    runner: Any = LocalRunner.__new__(LocalRunner)
    runner._observer = RunObserver()
    runner._swept = 0
    runner._observer.handler_started("job#1")
    runner._observer.handler_started("job-2")
    runner._forget(["delivery#priostack#job#1", "session#priostack#x"])
    assert list(runner._observer.handler_starts) == ["job-2"]
    assert runner._swept == 1


def test_a_state_file_is_held_by_one_process(tmp_path: Path) -> None:
    """A second run on the same file would take the first one's deliveries for a dead run's."""
    path = tmp_path / "nested" / "state.sqlite3"
    held = LocalState.open(path, final_retention_seconds=RETENTION)
    try:
        assert path.exists() and path.stat().st_mode & 0o077 == 0  # owner-only: it holds delivery tokens
        with pytest.raises(ConfigurationError, match="in use by another serverless-worker local"):
            LocalState.open(path, final_retention_seconds=RETENTION)
    finally:
        held.close()
    LocalState.open(path, final_retention_seconds=RETENTION).close()  # released: free again


def test_an_unset_state_path_is_a_temporary_file_removed_at_the_end() -> None:
    state = LocalState.open(None, final_retention_seconds=RETENTION)
    assert state.temporary and state.path.exists()
    state.close()
    assert not state.path.parent.exists()
