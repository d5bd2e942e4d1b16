"""Every state-store test runs twice: on moto, and on DynamoDB Local (AWS's own engine).

Both tables are created from template.yaml's ``StateTable`` by ``support.dynamodb``.
DynamoDB Local is skipped, with the reason printed, only where java or the jar is
missing and ``CI`` is not set; in CI a missing jar fails the run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws
from pydantic import SecretStr

from serverless_worker.protocols.base import Delivery
from serverless_worker.state import StateStore
from support.dynamodb import CreatedTable, create_state_table
from support.dynamodb_local import REGION, DynamoDBLocal, unavailable_reason

BACKENDS = ["moto", pytest.param("dynamodb_local", marks=pytest.mark.dynamodb_local)]


class FakeClock:
    """The store's time source. Starts at the wall clock: DynamoDB Local's TTL sweeper
    compares ``ttl`` with real time, so fake timestamps far in the past would be deleted."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


@pytest.fixture(autouse=True)
def _aws_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dummy credentials and a region, so nothing here can reach a real account."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_DYNAMODB"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "dummy")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "dummy")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)


@pytest.fixture(scope="session")
def dynamodb_local() -> Iterator[DynamoDBLocal]:
    reason = unavailable_reason()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"DynamoDB Local is required in CI: {reason}", pytrace=False)
        pytest.skip(f"DynamoDB Local unavailable: {reason}")
    with DynamoDBLocal().start() as local:
        yield local


@pytest.fixture(scope="session")
def moto_client() -> Any:
    """One client for every moto test (building one costs more than a test): moto 5 intercepts
    any client while a mock is active, and each test's own ``mock_aws()`` starts empty."""
    return boto3.client("dynamodb", region_name=REGION, aws_access_key_id="dummy",
                        aws_secret_access_key="dummy")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def ddb(request: pytest.FixtureRequest, backend: str) -> Iterator[Any]:
    """A low-level DynamoDB client for the backend under test."""
    if backend == "moto":
        with mock_aws():
            yield request.getfixturevalue("moto_client")
    else:
        local: DynamoDBLocal = request.getfixturevalue("dynamodb_local")
        yield local.client()


@pytest.fixture
def table(ddb: Any, backend: str) -> Iterator[CreatedTable]:
    created = create_state_table(ddb)
    yield created
    if backend != "moto":  # moto forgets everything when its mock ends
        ddb.delete_table(TableName=created.name)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(ddb: Any, table: CreatedTable, clock: FakeClock) -> StateStore:
    return StateStore(table.name, client=ddb, clock=clock)


@pytest.fixture
def raw_item(ddb: Any, table: CreatedTable) -> Callable[[str, str], dict[str, Any] | None]:
    """Read an item as DynamoDB holds it, bypassing the store's own expiry checks."""

    def _read(pk: str, sk: str) -> dict[str, Any] | None:
        item = ddb.get_item(TableName=table.name, Key={"pk": {"S": pk}, "sk": {"S": sk}},
                            ConsistentRead=True).get("Item")
        return dict(item) if item else None

    return _read


def _make_delivery(ledger_id: str = "exec-1", *, protocol: str = "pipelogiq", **fields: Any) -> Delivery:
    values: dict[str, Any] = {
        "protocol": protocol, "handler": "payment-processor", "job_id": f"job-{ledger_id}",
        "ledger_id": ledger_id, "attempt": 1, "payload": {"amount": 12.5, "currency": "EUR", "items": [1, 2]},
        "timeout_seconds": 30.0, "token": SecretStr("delivery-token-s3cr3t"), "wire": {"messageId": "m-1"},
    }
    values.update(fields)
    return Delivery(**values)


@pytest.fixture
def make_delivery() -> Callable[..., Delivery]:
    """``make_delivery("exec-2", protocol="priostack", payload=...)``: a delivery with a secret token."""
    return _make_delivery


@pytest.fixture
def delivery() -> Delivery:
    return _make_delivery()
