"""The counter buffer: a write the state store refuses keeps the counts for the next flush
and never fails the caller. DynamoDB is moto, in-process."""

from __future__ import annotations

from collections.abc import Iterator

import boto3
import pytest
from moto import mock_aws

from serverless_worker.runtime.counters import CounterBuffer
from serverless_worker.state import DynamoStateStore
from support.aws_env import use_fake_aws_credentials
from support.dynamodb import create_state_table

REGION = "eu-west-1"


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    use_fake_aws_credentials(monkeypatch, REGION)
    with mock_aws():
        yield


def test_a_refused_write_keeps_the_counts_for_the_next_flush(aws: None) -> None:
    client = boto3.client("dynamodb", region_name=REGION)
    name = "counters-not-yet-created"
    store = DynamoStateStore(name, client=client)
    counters = CounterBuffer(store, "pipelogiq", "blue", flush_seconds=0)

    counters.add(processed=1, failed=1)  # the table does not exist: the write fails, quietly

    assert counters.pending() == {"processed": 1, "failed": 1}
    create_state_table(client, name)
    assert counters.flush() is True
    assert counters.pending() == {}
    assert store.read_counters("pipelogiq", "blue") == {"processed": 1, "failed": 1}
