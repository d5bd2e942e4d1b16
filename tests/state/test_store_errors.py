"""Construction from the environment, and DynamoDB failures turned into the project's errors."""

from __future__ import annotations

import socket
from typing import Any

import boto3
import pytest
from botocore.config import Config

from serverless_worker.errors import ConfigurationError, ServerlessWorkerError
from serverless_worker.state import DynamoStateStore, StateStoreError


def test_from_env_reads_table_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TABLE_NAME", "stack-StateTable-ABC123")

    store = DynamoStateStore.from_env()

    assert store.table_name == "stack-StateTable-ABC123"
    assert store.ops["read"] == store.ops["write"] == 0


def test_from_env_without_table_name_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TABLE_NAME", raising=False)

    with pytest.raises(ConfigurationError, match="TABLE_NAME"):
        DynamoStateStore.from_env()


def test_a_missing_table_is_a_state_store_error(ddb: Any, clock: Any) -> None:
    store = DynamoStateStore("no-such-table", client=ddb, clock=clock)

    with pytest.raises(StateStoreError) as failed:
        store.get("delivery#pipelogiq#x")

    assert isinstance(failed.value, ServerlessWorkerError)
    assert "get_item" in str(failed.value) and "ResourceNotFoundException" in str(failed.value)


def test_an_unreachable_endpoint_is_a_state_store_error() -> None:
    with socket.socket() as sock:  # a loopback port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = boto3.client("dynamodb", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                          config=Config(connect_timeout=0.5, read_timeout=0.5, retries={"max_attempts": 1}))
    store = DynamoStateStore("t", client=client)

    with pytest.raises(StateStoreError, match="EndpointConnectionError"):
        store.count_in_flight("pipelogiq", "blue")
