"""The local state file says which job server its ids came from: pointed at a wholly other
server, a run says so in one line and starts afresh (the old ids mean nothing there), or
stops when the old server's deliveries are still in flight (only that server can settle them)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from serverless_worker.errors import ConfigurationError
from serverless_worker.local.state_file import LocalState
from serverless_worker.model import Delivery, Outcome, OutcomeKind, ReportReceipt

OLD, NEW = "http://127.0.0.1:8081", "http://127.0.0.1:9099"


@pytest.fixture
def state(tmp_path: Path) -> Iterator[LocalState]:
    opened = LocalState.open(tmp_path / "state.sqlite3", final_retention_seconds=600)
    yield opened
    opened.close()


def record(state: LocalState, job: str, *, settle: bool) -> str:
    delivery = Delivery(protocol="priostack", handler="double", job_id=job, ledger_id=f"{job}:r3", payload={})
    key = state.store.record_delivery(delivery, instance="i-1", deadline=time.time() + 60, dispatch_mode="invoke")
    assert key is not None
    if settle:
        assert state.store.start_run(key, "run-1", time.time() + 60) is not None
        state.store.store_outcome(key, "run-1", Outcome(kind=OutcomeKind.SUCCESS))
        assert state.store.mark_acknowledged(key, ReportReceipt(status="completed"))
    return key


def test_the_same_server_keeps_its_items_and_says_nothing(state: LocalState) -> None:
    assert state.claim_server("priostack", OLD) is None
    key = record(state, "a", settle=True)

    assert state.claim_server("priostack", OLD + "/") is None
    assert state.store.get(key) is not None


def test_another_server_is_named_in_one_line_and_its_ids_are_new(state: LocalState) -> None:
    # given a file whose settled deliveries came from one server
    state.claim_server("priostack", OLD)
    keys = [record(state, job, settle=True) for job in ("a", "b")]

    # when it is used with another
    line = state.claim_server("priostack", NEW)

    # then one line says so, naming the old server, and the old ids are gone
    assert line is not None and "\n" not in line
    assert f"priostack server at {OLD}" in line and "2 settled deliveries are forgotten" in line
    assert all(state.store.get(key) is None for key in keys)
    # and the file now belongs to the new server
    assert state.claim_server("priostack", NEW) is None


def test_another_protocol_at_the_same_url_is_another_server(state: LocalState) -> None:
    state.claim_server("priostack", OLD)
    record(state, "a", settle=True)

    line = state.claim_server("claimqueue", OLD)

    assert line is not None and f"priostack server at {OLD}" in line


def test_the_old_servers_deliveries_in_flight_stop_the_run(state: LocalState) -> None:
    # given a file left with a delivery in flight by a run against one server
    state.claim_server("priostack", OLD)
    key = record(state, "a", settle=False)

    # when it is used with another server
    with pytest.raises(ConfigurationError) as refused:
        state.claim_server("priostack", NEW)

    # then the run stops naming the old server and the way out; nothing is forgotten
    message = str(refused.value)
    assert f"1 delivery still in flight from the priostack server at {OLD}" in message
    assert "--state PATH" in message
    assert state.store.get(key) is not None
    assert state.claim_server("priostack", OLD) is None
