"""The local runner's TTL emulation: settled ledger items expire after the local retention
and the sweep deletes them from the embedded table; live ones stay. No timing: the store
and the sweeper share a fake clock."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import SecretStr

from serverless_worker.local.aws import EmbeddedAws
from serverless_worker.local.observe import RunObserver
from serverless_worker.local.ttl import TtlSweeper
from serverless_worker.protocols.base import Delivery
from serverless_worker.state import FINAL_RETENTION_SECONDS, DynamoStateStore, LedgerStatus

RETENTION = 600


class Clock:
    def __init__(self) -> None:
        self.now = 1_900_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def aws() -> Iterator[EmbeddedAws]:
    embedded = EmbeddedAws.start(pool_size=4)
    try:
        yield embedded
    finally:
        embedded.close()


def _delivery(ledger_id: str) -> Delivery:
    return Delivery(protocol="priostack", handler="soak.mixed", job_id=f"job-{ledger_id}", ledger_id=ledger_id,
                    attempt=1, payload={"n": 1}, timeout_seconds=30.0, token=SecretStr("t0ken"), wire={})


def _settle(store: DynamoStateStore, ledger_id: str) -> str:
    key = store.record_delivery(_delivery(ledger_id), instance="local", deadline=store._clock() + 60,
                                dispatch_mode="invoke")
    assert key is not None
    assert store.mark_discarded(key, "duplicate")
    return key


def test_sweep_deletes_expired_items_and_keeps_live_ones(aws: EmbeddedAws) -> None:
    clock = Clock()
    store = DynamoStateStore(aws.table_name, client=aws.dynamodb, clock=clock, final_retention_seconds=RETENTION)
    old = _settle(store, "old")
    clock.now += 300
    young = _settle(store, "young")
    running = store.record_delivery(_delivery("running"), instance="local", deadline=clock.now + 3600,
                                    dispatch_mode="invoke")  # in flight: no ttl at all
    assert running is not None
    old_item = store.get(old)
    assert old_item is not None and old_item.ttl == int(clock.now) - 300 + RETENTION

    forgotten: list[str] = []
    sweeper = TtlSweeper(aws.dynamodb, aws.table_name, clock=clock, on_deleted=forgotten.extend)
    assert sweeper.sweep() == 0  # nothing expired yet
    clock.now += RETENTION - 300 + 1  # past the old item's ttl, before the young one's
    assert sweeper.sweep() == 1
    assert forgotten == [old]
    assert store.get(old) is None
    young_item, running_item = store.get(young), store.get(running)
    assert young_item is not None and young_item.status is LedgerStatus.DISCARDED
    assert running_item is not None and running_item.status is LedgerStatus.RECORDED

    clock.now += 300
    assert sweeper.sweep() == 1 and store.get(young) is None
    assert store.get(running) is not None
    assert sweeper.deleted == 2


def test_a_redelivery_recorded_after_the_sweep_is_new(aws: EmbeddedAws) -> None:
    """Duplicate detection lasts the retention: after the sweep the same ledger id records again."""
    clock = Clock()
    store = DynamoStateStore(aws.table_name, client=aws.dynamodb, clock=clock, final_retention_seconds=RETENTION)
    key = _settle(store, "again")
    assert store.record_delivery(_delivery("again"), instance="local", deadline=clock.now + 60,
                                 dispatch_mode="invoke") is None  # a duplicate within the retention
    clock.now += RETENTION + 1
    assert TtlSweeper(aws.dynamodb, aws.table_name, clock=clock).sweep() >= 1
    assert store.record_delivery(_delivery("again"), instance="local", deadline=clock.now + 60,
                                 dispatch_mode="invoke") == key


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
    runner._observer.handler_started("job#1")
    runner._observer.handler_started("job-2")
    runner._forget(["delivery#priostack#job#1", "session#priostack#x"])
    assert list(runner._observer.handler_starts) == ["job-2"]


def test_moto_keeps_no_item_copies_and_no_empty_partitions(aws: EmbeddedAws) -> None:
    """moto tracks every model instance in a class-level list, and a deleted item's partition
    stayed behind as an empty dict: either would grow the embedded table's memory per job."""
    from moto.dynamodb.models import dynamodb_backends
    from moto.dynamodb.models.dynamo_type import Item

    clock = Clock()
    store = DynamoStateStore(aws.table_name, client=aws.dynamodb, clock=clock, final_retention_seconds=RETENTION)
    keys = [_settle(store, f"bounded-{n}") for n in range(5)]
    assert len(Item.instances_tracked) == 0
    clock.now += RETENTION + 1
    assert TtlSweeper(aws.dynamodb, aws.table_name, clock=clock).sweep() >= 5
    table = next(backend.tables[aws.table_name] for regions in dynamodb_backends.values()
                 for backend in regions.values() if aws.table_name in backend.tables)
    partitions = {str(hash_key.value) for hash_key in table.items}
    assert not partitions & set(keys)
