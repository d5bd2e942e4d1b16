"""The table the store runs against is template.yaml's StateTable, in both backends."""

from __future__ import annotations

from typing import Any

import pytest

from serverless_worker.state import StateStore
from serverless_worker.state.keys import DEADLINE, IN_FLIGHT_INDEX, PK, SCOPE, SK, TTL
from support.dynamodb import CreatedTable, create_request
from support.template import resource


def test_the_template_defines_the_table_the_store_expects() -> None:
    table = resource("StateTable")
    props = table["Properties"]

    assert table["Type"] == "AWS::DynamoDB::Table"
    assert table["DeletionPolicy"] == table["UpdateReplacePolicy"] == "Retain"
    assert "TableName" not in props  # CloudFormation names it; functions get TABLE_NAME
    assert props["BillingMode"] == "PAY_PER_REQUEST"
    assert props["KeySchema"] == [{"AttributeName": PK, "KeyType": "HASH"},
                                  {"AttributeName": SK, "KeyType": "RANGE"}]
    types = {d["AttributeName"]: d["AttributeType"] for d in props["AttributeDefinitions"]}
    assert types == {PK: "S", SK: "S", SCOPE: "S", DEADLINE: "N"}
    (index,) = props["GlobalSecondaryIndexes"]
    assert index["IndexName"] == IN_FLIGHT_INDEX
    assert index["KeySchema"] == [{"AttributeName": SCOPE, "KeyType": "HASH"},
                                  {"AttributeName": DEADLINE, "KeyType": "RANGE"}]
    assert index["Projection"] == {"ProjectionType": "KEYS_ONLY"}
    assert props["TimeToLiveSpecification"] == {"AttributeName": TTL, "Enabled": True}
    assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert props["SSESpecification"] == {"SSEEnabled": True}


def test_the_backend_table_was_built_from_the_template(ddb: Any, table: CreatedTable, backend: str) -> None:
    description = ddb.describe_table(TableName=table.name)["Table"]

    assert description["KeySchema"] == resource("StateTable")["Properties"]["KeySchema"]
    assert description["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    (index,) = description["GlobalSecondaryIndexes"]
    assert index["IndexName"] == IN_FLIGHT_INDEX
    assert index["Projection"]["ProjectionType"] == "KEYS_ONLY"
    ttl = ddb.describe_time_to_live(TableName=table.name)["TimeToLiveDescription"]
    assert ttl["AttributeName"] == TTL and ttl["TimeToLiveStatus"] == "ENABLED"
    if backend == "moto":  # DynamoDB Local has neither continuous backups nor an SSE description
        assert table.point_in_time_recovery is True
        backups = ddb.describe_continuous_backups(TableName=table.name)["ContinuousBackupsDescription"]
        assert backups["PointInTimeRecoveryDescription"]["PointInTimeRecoveryStatus"] == "ENABLED"
        assert description["SSEDescription"]["Status"] == "ENABLED"
    else:
        assert table.point_in_time_recovery is False


def test_the_index_is_sparse_and_holds_keys_only(
        ddb: Any, table: CreatedTable, store: StateStore, make_delivery: Any, clock: Any) -> None:
    live = store.record_delivery(make_delivery("live"), instance="blue", deadline=clock.now + 5,
                                 dispatch_mode="invoke")
    done = store.record_delivery(make_delivery("done"), instance="blue", deadline=clock.now + 6,
                                 dispatch_mode="invoke")
    assert live and done and store.mark_discarded(done, "stale")
    store.add_counters("pipelogiq", "blue", processed=1)

    entries = ddb.scan(TableName=table.name, IndexName=IN_FLIGHT_INDEX)["Items"]

    assert [entry[PK]["S"] for entry in entries] == [live]
    assert set(entries[0]) == {PK, SK, SCOPE, DEADLINE}  # keys only: no token, no status churn


def test_an_unmapped_template_property_fails_loudly() -> None:
    props = dict(resource("StateTable")["Properties"], KinesisStreamSpecification={"StreamArn": "arn:x"})

    with pytest.raises(ValueError, match="KinesisStreamSpecification"):
        create_request(props, "t1")


def test_intrinsic_functions_are_not_silently_passed_on() -> None:
    props = dict(resource("StateTable")["Properties"], TableClass={"Ref": "TableClassParameter"})

    with pytest.raises(ValueError, match="Ref"):
        create_request(props, "t1")


def test_the_create_request_maps_encryption_and_skips_post_create_settings() -> None:
    request = create_request(resource("StateTable")["Properties"], "t1")

    assert request["TableName"] == "t1"
    assert request["SSESpecification"] == {"Enabled": True}
    assert "TimeToLiveSpecification" not in request and "PointInTimeRecoverySpecification" not in request
