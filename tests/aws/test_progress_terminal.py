"""A claim-queue item that turns terminal while its handler runs (the queue's timeout, or
another worker's result) stops the handler at its next progress report.

The queue answers that report ``accepted:false``: whatever the handler does from then on
is discarded, so the run is cancelled like a lost lease, nothing is reported for it, and
the ledger item is settled as discarded.
"""

from __future__ import annotations

from typing import Any

import pytest
from e2e_support import HANDLERS_PATH, ledger, wait_for

from serverless_worker.model import LedgerStatus

pytestmark = pytest.mark.aws


def test_progress_on_an_item_the_queue_timed_out_cancels_the_handler(worker_env: Any, recorder: Any) -> None:
    # The queue fails an item 2 s after it is created; the lease (30 s) outlives that.
    env = worker_env("claimqueue", handlers=["e2e.progressing"], handler_module=HANDLERS_PATH,
                     sandbox={"timeout_seconds": 2, "lease_seconds": 30})
    env.seed("e2e.progressing", [{"seconds": 30}])

    env.tick(1.0)
    wait_for(lambda: recorder.counts("e2e.progressing"), what="the handler started")
    wait_for(lambda: env.admin.jobs()[0]["status"] == "failed", what="the queue timed the item out")
    env.stack.wait_idle()  # far less than the handler's 30 s: it was stopped

    (job,) = env.admin.jobs()
    job_id = job["id"]
    assert recorder.cancel_reasons == {job_id: "lease_lost"}
    assert recorder.counts("e2e.progressing") == {job_id: 1}
    events = [h["event"] for h in job["history"]]
    assert "result" not in events, "nothing is reported for an item that is no longer ours"
    rejected = [h for h in job["history"] if h["event"] == "progress" and h.get("accepted") is False]
    assert rejected, job["history"]
    (item,) = ledger(env)
    assert item.status == LedgerStatus.DISCARDED
