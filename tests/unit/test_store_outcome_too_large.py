"""One rule stores an outcome too large for the ledger item (``runtime/pipeline.py``): the
executor's ``store_outcome`` and the state machine's ``store_if_owned`` both store a
RESULT_TOO_LARGE failure whose message names the handler, the job, the ledger key and the
sizes, never the result itself. Against the SQLite backend, which enforces the same item
limit as DynamoDB (state/base.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from serverless_worker.model import Delivery, Outcome, OutcomeKind
from serverless_worker.runtime.pipeline import store_if_owned, store_outcome
from serverless_worker.state import SqliteStateStore


@pytest.mark.parametrize("path", ["executor", "steps"])
def test_an_outcome_over_the_item_limit_is_stored_as_one_result_too_large_failure(tmp_path: Path, path: str) -> None:
    # given a claimed delivery and an incompressible result of 600 KB
    store = SqliteStateStore(tmp_path / "s.db")
    delivery = Delivery(protocol="priostack", handler="big", job_id="j1", ledger_id="j1:r0", payload={},
                        wire={"key": "j1"})
    key = store.record_delivery(delivery, instance="i", deadline=time.time() + 60, dispatch_mode="invoke")
    assert key is not None and store.start_run(key, epoch="e", deadline=time.time() + 60) is not None
    huge = Outcome(kind=OutcomeKind.SUCCESS, value={"blob": os.urandom(600 * 1024).hex()})

    # when either path stores it
    if path == "executor":
        returned = store_outcome(store, key, "e", huge, delivery=delivery)
    else:
        assert store_if_owned(store, key, "e", huge, delivery=delivery) is True

    # then the ledger holds the one failure, naming whose outcome and its sizes
    item = store.get(key)
    assert item is not None and item.outcome is not None
    failure = item.outcome
    if path == "executor":
        assert returned == failure  # what is reported is what was stored
    assert failure.kind is OutcomeKind.FAILURE and failure.error_code == "RESULT_TOO_LARGE"
    message = failure.message or ""
    assert message.startswith(f"handler 'big' (job j1), delivery {key}: its success outcome is "), message
    assert "bytes, over the state store's item limit of" in message and len(message) < 1024
    store.close()
