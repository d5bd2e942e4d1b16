"""Keys and item sizes at DynamoDB's limits: ids with '#' and Unicode work, ids too long
for a partition key and items past 400 KB fail with errors naming the key."""

from __future__ import annotations

import base64
import random
from typing import Any

import pytest
from botocore.exceptions import ClientError

from serverless_worker.errors import PayloadTooLargeError
from serverless_worker.model import Delivery, LedgerStatus, Outcome, OutcomeKind
from serverless_worker.state import (
    InvalidKeyError,
    ItemTooLargeError,
    StateStore,
    UnrecordableDeliveryError,
    ledger_key,
    ledger_key_for,
    parse_ledger_key,
)
from serverless_worker.state.items import item_size
from support.dynamodb import CreatedTable

PREFIX = "delivery#pipelogiq#"
LIMIT = 2048


ROOM = LIMIT - len(PREFIX)  # bytes left for the ledger id in a partition key


def _incompressible(size: int) -> str:
    """Text that deflate cannot shrink much (the DynamoDB backend stores the delivery deflated)."""
    return base64.b64encode(random.Random(size).randbytes(size))[:size].decode()


@pytest.mark.parametrize("ledger_id", ["job#42#attempt#3", "zadání-č.7", "任务-🚀-1", "a" * ROOM,
                                       "é" * (ROOM // 2)])
def test_awkward_ids_work_end_to_end(store: StateStore, make_delivery: Any, clock: Any,
                                     ledger_id: str) -> None:
    delivery: Delivery = make_delivery(ledger_id)

    key = store.record_delivery(delivery, instance="blue#eu-west-1", deadline=clock.now + 1,
                                dispatch_mode="invoke")

    assert key == PREFIX + ledger_id
    assert parse_ledger_key(key) == ("pipelogiq", ledger_id)
    item = store.start_run(key, "req-1", clock.now + 1)
    assert item is not None and item.delivery.ledger_id == ledger_id
    clock.advance(2)
    assert [i.key for i in store.stranded("pipelogiq", "blue#eu-west-1", clock.now)] == [key]
    assert store.count_in_flight("pipelogiq", "blue") == 0  # "blue" is not a prefix match of "blue#eu-west-1"


@pytest.mark.parametrize("ledger_id", ["a" * (ROOM + 1), "é" * (ROOM // 2 + 1)])
def test_an_id_too_long_for_a_partition_key_is_refused_before_any_request(
        store: StateStore, make_delivery: Any, ddb: Any, table: CreatedTable, ledger_id: str) -> None:
    with pytest.raises(InvalidKeyError) as refused:
        store.record_delivery(make_delivery(ledger_id), instance="blue", deadline=0, dispatch_mode="invoke")

    message = str(refused.value)
    assert "2048 bytes" in message and "ledger id" in message and len(message) < 400
    assert store.ops["write"] == 0
    # The engine would have refused it too: the limit is DynamoDB's, not ours.
    with pytest.raises(ClientError) as engine:
        ddb.put_item(TableName=table.name, Item={"pk": {"S": PREFIX + ledger_id}, "sk": {"S": "delivery"}})
    assert engine.value.response["Error"]["Code"] == "ValidationException"


@pytest.mark.parametrize(("protocol", "ledger_id"), [("", "x"), ("pipe#logiq", "x"), ("pipelogiq", ""),
                                                     ("pipelogiq", "bad\ud800surrogate")])
def test_invalid_key_parts_are_refused(protocol: str, ledger_id: str) -> None:
    with pytest.raises(InvalidKeyError):
        ledger_key(protocol, ledger_id)


@pytest.mark.parametrize("key", ["session#pipelogiq#blue", "delivery#pipelogiq", "delivery##x", "x"])
def test_only_ledger_keys_are_accepted_as_ledger_keys(store: StateStore, key: str) -> None:
    with pytest.raises(InvalidKeyError):
        store.get(key)
    with pytest.raises(InvalidKeyError):
        store.mark_acknowledged(key)
    assert store.ops["read"] == store.ops["write"] == 0


def test_item_size_matches_the_engine_at_the_limit(ddb: Any, table: CreatedTable, backend: str) -> None:
    def item(filler: int) -> dict[str, Any]:
        return {"pk": {"S": "size#é"}, "sk": {"S": "s"}, "n": {"N": "1234.5"}, "d": {"S": "x" * filler}}

    base = item_size(item(0))
    fits, too_big = item(400 * 1024 - base), item(400 * 1024 - base + 1)
    assert item_size(fits) == 400 * 1024

    with pytest.raises(ClientError) as refused:
        ddb.put_item(TableName=table.name, Item=too_big)
    assert refused.value.response["Error"]["Code"] == "ValidationException"
    if backend == "moto":
        # moto cuts off at an approximate 405,000 bytes, stricter than the engine: the store's
        # guard uses the engine's number and translates either refusal the same way.
        with pytest.raises(ClientError):
            ddb.put_item(TableName=table.name, Item=fits)
    else:
        ddb.put_item(TableName=table.name, Item=fits)


def test_a_delivery_too_large_to_record_is_refused_before_writing(store: StateStore,
                                                                  make_delivery: Any) -> None:
    delivery = make_delivery("big-1", payload={"blob": _incompressible(600 * 1024)})

    with pytest.raises(ItemTooLargeError) as refused:
        store.record_delivery(delivery, instance="blue", deadline=0, dispatch_mode="invoke")

    error = refused.value
    assert isinstance(error, PayloadTooLargeError)
    assert error.key == "delivery#pipelogiq#big-1" and error.key in str(error)
    assert error.limit == 400 * 1024 and error.size > error.limit
    assert "delivery-token-s3cr3t" not in str(error)
    assert store.ops["write"] == 0
    assert store.get("delivery#pipelogiq#big-1") is None


def _nested(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"a": value}
    return value


# One poisoned delivery each, and the words its reason carries (runtime/poison.py sends them to the server).
POISONED = {
    "nested past pydantic's serialisation depth": ("deep-1", {"deep": _nested(300)}, "nests too deep"),
    "a lone surrogate in its content": ("surrogate-1", {"text": "bad\ud800"}, "not valid Unicode"),
    "a lone surrogate in its id": ("bad\ud800id", {}, "not valid Unicode"),
    "past the item limit": ("big-1", {"blob": _incompressible(600 * 1024)}, "item limit"),
}


@pytest.mark.parametrize("poison", POISONED)
def test_a_delivery_no_item_can_hold_is_refused_on_its_own_and_the_batch_recorded(
        store: StateStore, make_delivery: Any, clock: Any, poison: str) -> None:
    ledger_id, payload, reason = POISONED[poison]
    bad, good = make_delivery(ledger_id, payload=payload), make_delivery("good-1")

    # record_new records the rest of the batch and leaves the poisoned one to record_delivery
    keys = store.record_new([(good, "invoke"), (bad, "invoke")], instance="blue", deadline=clock.now + 60)
    assert keys == [ledger_key_for(good), None] and store.ops["write"] == 1

    # which refuses it with the reason, before any write
    with pytest.raises(UnrecordableDeliveryError) as refused:
        store.record_delivery(bad, instance="blue", deadline=0, dispatch_mode="invoke")
    assert reason in refused.value.reason and refused.value.job_id == f"job-{ledger_id}"
    assert "delivery-token-s3cr3t" not in str(refused.value) and "bad\ud800" not in str(refused.value)
    assert store.ops["write"] == 1
    assert store.count_in_flight("pipelogiq", "blue") == 1


def test_record_new_leaves_a_delivery_too_large_to_record_delivery(store: StateStore, make_delivery: Any,
                                                                   clock: Any) -> None:
    big = make_delivery("big-1", payload={"blob": _incompressible(600 * 1024)})
    small = make_delivery("small-1")

    keys = store.record_new([(big, "invoke"), (small, "invoke")], instance="blue", deadline=clock.now + 60)

    assert keys == [None, ledger_key_for(small)]
    assert store.get(ledger_key_for(big)) is None
    assert store.ops["write"] == 1


def test_a_document_that_would_overflow_the_item_is_refused_by_the_engine(
        store: StateStore, make_delivery: Any, clock: Any) -> None:
    key = store.record_delivery(make_delivery("big-2", payload={"blob": _incompressible(280_000)}), instance="blue",
                                deadline=clock.now + 60, dispatch_mode="invoke")
    assert key is not None
    store.start_run(key, "req-1", clock.now + 60)
    store.save_checkpoint(key, "req-1", {"page": 1})
    huge = "r" * 200_000  # fits an item alone, not next to the payload
    writes = store.ops["write"]

    with pytest.raises(ItemTooLargeError) as refused:
        store.store_outcome(key, "req-1", Outcome(kind=OutcomeKind.SUCCESS, value=huge))
    with pytest.raises(ItemTooLargeError):
        store.save_checkpoint(key, "req-1", {"page": 2, "state": huge})

    assert refused.value.key == key and store.ops["write"] == writes + 2
    item = store.get(key)  # nothing of either write was applied
    assert item is not None and item.status is LedgerStatus.RUNNING and item.outcome is None
    assert item.checkpoint == {"page": 1}
    # What the runtime does next: store a small failure saying so, which fits.
    store.store_outcome(key, "req-1", Outcome(kind=OutcomeKind.FAILURE, error_code="RESULT_TOO_LARGE"))
    item = store.get(key)
    assert item is not None and item.status is LedgerStatus.OUTCOME_STORED


def test_a_checkpoint_larger_than_an_item_is_refused_before_writing(store: StateStore, delivery: Delivery,
                                                                   clock: Any) -> None:
    key = store.record_delivery(delivery, instance="blue", deadline=clock.now + 60, dispatch_mode="invoke")
    assert key is not None
    store.start_run(key, "req-1", clock.now + 60)
    writes = store.ops["write"]

    with pytest.raises(ItemTooLargeError):
        store.save_checkpoint(key, "req-1", {"state": "c" * (410 * 1024)})

    assert store.ops["write"] == writes
