"""What one short-path job costs in DynamoDB write units, and the index rule that keeps it low.

The meter (benchmarks/write_units.py) prices each write as DynamoDB does; on DynamoDB Local
the engine's own ``ConsumedCapacity`` is checked against it. The rule behind the figure
(the in-flight index's key stays put while a run pushes its deadline out) is part of the
contract's behaviour, so its consequences are checked on every backend.
"""

from __future__ import annotations

from typing import Any

import pytest
from benchmarks.write_units import WriteUnitMeter

from serverless_worker.model import Delivery, Outcome, OutcomeKind, ReportReceipt
from serverless_worker.state import DynamoStateStore, StateStore, ledger_key_for
from support.dynamodb import CreatedTable

# A Pipelogiq-sized envelope (the largest of the three protocols'), as the server sends it.
_WIRE = {"pipelineId": 3, "stageId": 1003, "executionId": "5d8dc74a-c065-4d5f-aaa7-a5bce099d4ad", "attempt": 1,
         "queue": "app_12_bench_StageNext", "messageId": "38387b73c0c2419690fe33db78271472", "handler": "bench",
         "stageName": "bench", "prevStageOutput": "", "context": [],
         "idempotencyKey": "553de441f603426aa7428911189fa14d", "traceId": "43043a1eecfcbf670f11345dce9d2f02",
         "spanId": "4f8ead425b667799",
         "headers": {"traceparent": "00-43043a1eecfcbf670f11345dce9d2f02-4f8ead425b667799-01",
                     "x-delivery-count": 1}}


def _short_path(store: StateStore, delivery: Delivery, now: float) -> None:
    """The executor's writes for one job: record, claim (its deadline pushed out), outcome, settle."""
    key = store.record_delivery(delivery, instance="bench-612e99a1", deadline=now + 30, dispatch_mode="invoke")
    assert key is not None
    assert store.start_run(key, "12c7e660-1ea4-4db7-aa59-056c1851b05e", now + 930) is not None
    store.store_outcome(key, "12c7e660-1ea4-4db7-aa59-056c1851b05e",
                        Outcome(kind=OutcomeKind.SUCCESS, value={"ok": True}))
    receipt = ReportReceipt(status="accepted", detail={"isSuccess": True, "errorCode": None, "attempts": 1})
    assert store.mark_acknowledged(key, receipt) is True


def test_a_short_path_job_costs_at_most_six_write_units(ddb: Any, table: CreatedTable, clock: Any,
                                                        make_delivery: Any, backend: str) -> None:
    meter = WriteUnitMeter(ddb)
    store = DynamoStateStore(table.name, client=meter, clock=clock)
    delivery = make_delivery("1003:5d8dc74a-c065-4d5f-aaa7-a5bce099d4ad", payload='{"n": 2}', wire=_WIRE)

    _short_path(store, delivery, clock.now)

    assert meter.requests["delivery"] == 4
    assert meter.units["index:delivery"] == 2  # added once, removed once: never moved
    assert meter.units["table:delivery"] == 4  # every write under 1 KB
    if backend == "dynamodb_local":  # the engine's own count (moto's is not DynamoDB's)
        assert meter.engine["delivery"] == 6


Cost = tuple[int, int, int, float]


def _self_pull_path(store: StateStore, delivery: Delivery, now: float, meter: WriteUnitMeter) -> dict[str, Cost]:
    """An executor that pulled the job itself: record_running (record and claim in one),
    outcome, settle (report and acknowledgement in one final write, as settle.py makes it).
    Each write's (requests, table units, index units, engine units)."""
    epoch = "12c7e660-1ea4-4db7-aa59-056c1851b05e/3f2a91c0"
    receipt = ReportReceipt(status="accepted", detail={"isSuccess": True, "errorCode": None, "attempts": 1})
    steps: dict[str, Any] = {
        "record_running": lambda: store.record_running(delivery, instance="bench-612e99a1", epoch=epoch,
                                                       deadline=now + 120),
        "store_outcome": lambda: store.store_outcome(  # raises when refused
            ledger_key_for(delivery), epoch, Outcome(kind=OutcomeKind.SUCCESS, value={"ok": True})) or True,
        "mark_acknowledged": lambda: store.mark_acknowledged(ledger_key_for(delivery), receipt),
    }
    costs: dict[str, Cost] = {}
    for name, write in steps.items():
        before = (sum(meter.requests.values()), meter.units["table:delivery"], meter.units["index:delivery"],
                  meter.engine["delivery"])
        assert write() not in (None, False), name
        costs[name] = (sum(meter.requests.values()) - before[0], meter.units["table:delivery"] - before[1],
                       meter.units["index:delivery"] - before[2], meter.engine["delivery"] - before[3])
    return costs


def test_a_self_pulled_job_costs_three_writes_and_five_write_units(ddb: Any, table: CreatedTable, clock: Any,
                                                                   make_delivery: Any, backend: str) -> None:
    meter = WriteUnitMeter(ddb)
    store = DynamoStateStore(table.name, client=meter, clock=clock)
    delivery = make_delivery("1003:5d8dc74a-c065-4d5f-aaa7-a5bce099d4ad", payload='{"n": 2}', wire=_WIRE)

    costs = _self_pull_path(store, delivery, clock.now, meter)

    # (requests, table units, index units): the record is the claim, so no write of its own
    assert {name: cost[:3] for name, cost in costs.items()} == {
        "record_running": (1, 1, 1),     # the index entry added
        "store_outcome": (1, 1, 0),
        "mark_acknowledged": (1, 1, 1),  # the index entry removed
    }
    assert meter.requests["delivery"] == 3
    assert meter.units["table:delivery"] + meter.units["index:delivery"] == 5
    if backend == "dynamodb_local":  # the engine's own count (moto's is not DynamoDB's)
        assert {name: cost[3] for name, cost in costs.items()} == {
            "record_running": 2, "store_outcome": 1, "mark_acknowledged": 2}


def test_a_run_outliving_its_dispatch_deadline_is_live_until_its_own(store: StateStore, delivery: Delivery,
                                                                     clock: Any) -> None:
    key = store.record_delivery(delivery, instance="blue", deadline=clock.now + 10, dispatch_mode="invoke")
    assert key is not None
    store.start_run(key, "req-1", clock.now + 100)

    clock.advance(50)  # past the dispatch deadline, inside the run's
    assert store.stranded("pipelogiq", "blue", clock.now) == []
    assert store.count_in_flight("pipelogiq", "blue", live_at=clock.now) == 1
    item = store.get(key)
    assert item is not None and item.deadline == pytest.approx(clock.now + 50)

    clock.advance(51)
    assert [i.key for i in store.stranded("pipelogiq", "blue", clock.now)] == [key]
    assert store.count_in_flight("pipelogiq", "blue", live_at=clock.now) == 0
    assert store.count_in_flight("pipelogiq", "blue") == 1


def test_a_deadline_moved_earlier_is_reaped_at_the_earlier_time(store: StateStore, delivery: Delivery,
                                                                clock: Any) -> None:
    key = store.record_delivery(delivery, instance="blue", deadline=clock.now + 100, dispatch_mode="invoke")
    assert key is not None
    store.start_run(key, "req-1", clock.now + 10)
    assert store.renew_deadline(key, "req-1", clock.now + 20) == 1

    clock.advance(21)
    assert [i.key for i in store.stranded("pipelogiq", "blue", clock.now)] == [key]
    assert store.count_in_flight("pipelogiq", "blue", live_at=clock.now) == 0
