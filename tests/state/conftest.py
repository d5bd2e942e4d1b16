"""Every state-store test runs on each backend of the one contract (state/base.py):
DynamoDB on moto and on DynamoDB Local (AWS's own engine), and SQLite on a file in tmp_path.

Both DynamoDB tables are created from template.yaml's ``StateTable`` by ``support.dynamodb``.
Tests that read DynamoDB itself (``ddb``, ``table``) are skipped on SQLite: they check the
table or the DynamoDB backend's own client handling, not the contract.
DynamoDB Local is skipped, with the reason printed, only where java or the jar is
missing and ``CI`` is not set; in CI a missing jar fails the run.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws
from pydantic import SecretStr

from serverless_worker.model import Delivery
from serverless_worker.state import DynamoStateStore, SqliteStateStore, StateStore
from serverless_worker.state.items import to_item
from support.clock import TickClock
from support.dynamodb import CreatedTable, create_state_table
from support.dynamodb_local import REGION, DynamoDBLocal, unavailable_reason

BACKENDS = ["moto", pytest.param("dynamodb_local", marks=pytest.mark.dynamodb_local), "sqlite"]


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
    if backend == "sqlite":
        pytest.skip("reads DynamoDB itself: not part of the contract the SQLite backend shares")
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
def clock() -> TickClock:
    """The store's time source, moved by ``clock.advance``. It starts at the wall clock:
    DynamoDB Local's TTL sweeper compares ``ttl`` with real time, so fake timestamps far in
    the past would be deleted."""
    return TickClock()


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    return tmp_path / "state.db"


@pytest.fixture
def store(request: pytest.FixtureRequest, backend: str, clock: TickClock) -> Iterator[StateStore]:
    """The backend under test, behind the contract."""
    if backend == "sqlite":
        sqlite_store = SqliteStateStore(request.getfixturevalue("sqlite_path"), clock=clock)
        yield sqlite_store
        sqlite_store.close()
        return
    table: CreatedTable = request.getfixturevalue("table")
    yield DynamoStateStore(table.name, client=request.getfixturevalue("ddb"), clock=clock)


@pytest.fixture
def raw_item(request: pytest.FixtureRequest, backend: str) -> Callable[[str, str], dict[str, Any] | None]:
    """Read an item as the backend holds it (DynamoDB's wire form), bypassing the store's expiry checks."""
    if backend == "sqlite":
        path = request.getfixturevalue("sqlite_path")

        def _read_row(pk: str, sk: str) -> dict[str, Any] | None:
            with sqlite3.connect(path) as db:
                row = db.execute("SELECT doc FROM items WHERE pk = ?", (pk,)).fetchone()
            doc = json.loads(row[0]) if row else None
            return to_item(doc) if doc is not None and doc.get("sk") == sk else None

        return _read_row
    ddb, table = request.getfixturevalue("ddb"), request.getfixturevalue("table")

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
