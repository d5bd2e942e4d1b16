"""The embedded moto (``EmbeddedAws``, the long-running path's Step Functions and the
benchmarks' DynamoDB) keeps no copy of every item it ever saw: moto tracks every model
instance in a class-level list, and a deleted item's partition stayed behind as an empty
dict; either would grow memory per job in a long run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pydantic import SecretStr

from serverless_worker.local.aws import EmbeddedAws
from serverless_worker.model import Delivery
from serverless_worker.state import DynamoStateStore
from serverless_worker.state.keys import PK, SK, sort_key_for


@pytest.fixture(scope="module")
def aws() -> Iterator[EmbeddedAws]:
    embedded = EmbeddedAws.start(pool_size=4)
    try:
        yield embedded
    finally:
        embedded.close()


def test_moto_keeps_no_item_copies_and_no_empty_partitions(aws: EmbeddedAws) -> None:
    from moto.dynamodb.models import dynamodb_backends
    from moto.dynamodb.models.dynamo_type import Item

    store = DynamoStateStore(aws.table_name, client=aws.dynamodb)
    keys = []
    for n in range(5):
        delivery = Delivery(protocol="priostack", handler="soak.mixed", job_id=f"job-{n}", ledger_id=f"b-{n}",
                            attempt=1, payload={"n": n}, timeout_seconds=30.0, token=SecretStr("t0ken"), wire={})
        key = store.record_delivery(delivery, instance="local", deadline=2e9, dispatch_mode="invoke")
        assert key is not None and store.mark_discarded(key, "duplicate")
        keys.append(key)
    assert len(Item.instances_tracked) == 0
    for key in keys:
        item_key = {PK: {"S": key}, SK: {"S": sort_key_for(key)}}
        assert "Item" in aws.dynamodb.get_item(TableName=aws.table_name, Key=item_key), key
        aws.dynamodb.delete_item(TableName=aws.table_name, Key=item_key)
    table = next(backend.tables[aws.table_name] for regions in dynamodb_backends.values()
                 for backend in regions.values() if aws.table_name in backend.tables)
    partitions = {str(hash_key.value) for hash_key in table.items}
    assert not partitions & set(keys)
