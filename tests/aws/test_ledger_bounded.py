"""Every ledger status has a path to a final state within a bounded time, whatever the
server answers: the reaper settles it when the server works, and gives up loudly after
``SETTLE_ATTEMPTS_MAX`` failed tries (a back-off apart) when the server answers only
errors. Time is a controlled clock on the services (the reaper's ``now`` and the retry
deadlines it writes), so nothing here waits for real.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from e2e_support import HANDLERS_PATH, PROTOCOLS, ledger

from serverless_worker.model import LedgerStatus, Outcome, OutcomeKind, ReportReceipt
from serverless_worker.protocols.base import PullRequest
from serverless_worker.runtime.metrics import metrics
from serverless_worker.runtime.reaper import reap
from serverless_worker.runtime.settle import SETTLE_ATTEMPTS_MAX, SETTLE_RETRY_MAX_SECONDS, handback_epoch
from support.clock import TickClock

pytestmark = pytest.mark.aws

HANDLER = "e2e.echo"


def _pulled(env: Any, services: Any) -> Any:
    env.seed(HANDLER, [{"n": 1}])
    services.ensure_session()
    (delivery,) = services.call(lambda p: p.pull(PullRequest(handler=HANDLER, max_items=1, wait_seconds=1)))
    return delivery


def _in_status(services: Any, delivery: Any, status: str) -> str:
    """A ledger item of ``delivery`` brought to ``status`` the way the runtime would."""
    store = services.store
    now = services.clock()
    if status == "RUNNING:self":  # pulled by an executor that keeps pulling: recorded and claimed at once
        item = store.record_running(delivery, instance=services.instance, epoch="req-1/a1", deadline=now + 60)
        assert item is not None
        return item.key
    key = store.record_delivery(delivery, instance=services.instance, deadline=now + 60, dispatch_mode="invoke")
    assert key is not None
    if status == "DISPATCHED":
        assert store.mark_dispatched(key)
    elif status == "DISPATCH_FAILED":
        assert store.mark_dispatch_failed(key, "invoke throttled")
    elif status == "RUNNING:handback":
        assert store.start_run(key, epoch=handback_epoch(), deadline=now + 60) is not None
    elif status in ("RUNNING", "OUTCOME_STORED", "REPORTED"):
        assert store.start_run(key, epoch="req-1", deadline=now + 60) is not None
        if status != "RUNNING":
            store.store_outcome(key, "req-1", Outcome(kind=OutcomeKind.SUCCESS, result={"ok": True}))
        if status == "REPORTED":
            assert store.mark_reported(key, ReportReceipt(status="completed"))
    return key


STATUSES = ["RECORDED", "DISPATCHED", "DISPATCH_FAILED", "RUNNING", "RUNNING:self", "RUNNING:handback",
            "OUTCOME_STORED", "REPORTED"]


def _fired(env: Any) -> int:
    return len(env.admin._call("GET", "faults")["fired"])


def _reap_until_final(services: Any, clock: TickClock, key: str, *, limit: int) -> tuple[int, float]:
    """Advance the clock past the item's deadline and reap, until it is final; returns the
    reaps it took and the (controlled) time that passed."""
    start = clock.now
    for reaps in range(1, limit + 1):
        item = services.store.get(key)
        assert item is not None
        if item.is_final:
            return reaps - 1, clock.now - start
        assert item.deadline is not None, item  # in flight always means a known deadline
        clock.now = max(clock.now, item.deadline) + 1
        reap(services)
    item = services.store.get(key)
    assert item is not None and item.is_final, f"still {item.status if item else None} after {limit} reaps"
    return limit, clock.now - start


@pytest.mark.parametrize("status", STATUSES)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_status_ends_final_when_the_server_answers_only_errors(
        worker_env: Callable[..., Any], protocol: str, status: str) -> None:
    env = worker_env(protocol, handlers=[HANDLER], handler_module=HANDLERS_PATH)
    services = env.stack.services()
    clock = TickClock(services.clock())
    services.clock = clock
    delivery = _pulled(env, services)
    key = _in_status(services, delivery, status)
    env.admin.faults([{"kind": "error_5xx", "endpoint": "*", "status": 503}])
    abandoned_before = metrics.totals["SettleAbandoned"]

    reaps, elapsed = _reap_until_final(services, clock, key, limit=SETTLE_ATTEMPTS_MAX + 3)

    item = services.store.get(key)
    assert item is not None
    fired = _fired(env)
    if not fired:
        # The protocol settles this status without a call (claim-queue hand-back: the lease
        # lapses; Priostack and claim queue have no acknowledgement): final at once.
        assert reaps == 1 and item.is_final, (reaps, item)
    else:
        # Reported: the server has the outcome, only the acknowledgement failed. Otherwise
        # the item is dropped, and marked so that the job's return is recorded again.
        want = LedgerStatus.ACKNOWLEDGED if status == "REPORTED" else LedgerStatus.DISCARDED
        assert item.status is want, item
        assert reaps == SETTLE_ATTEMPTS_MAX + 1, reaps
        assert metrics.totals["SettleAbandoned"] == abandoned_before + 1
        assert item.settle_failures == SETTLE_ATTEMPTS_MAX, item
    # Bounded: at most every back-off at its maximum, plus the first deadline.
    assert elapsed <= 60 + 1 + (SETTLE_ATTEMPTS_MAX + 1) * (SETTLE_RETRY_MAX_SECONDS + 1), elapsed
    assert [i.key for i in ledger(env) if not i.is_final] == []


@pytest.mark.parametrize("status", STATUSES)
def test_every_status_ends_final_at_the_first_reap_when_the_server_answers(
        worker_env: Callable[..., Any], status: str) -> None:
    """The same items against a server that works: one reap settles each, with the
    outcome the status calls for (never a second run of the handler: none runs here)."""
    env = worker_env("priostack", handlers=[HANDLER], handler_module=HANDLERS_PATH)
    services = env.stack.services()
    clock = TickClock(services.clock())
    services.clock = clock
    key = _in_status(services, _pulled(env, services), status)

    reaps, _ = _reap_until_final(services, clock, key, limit=3)

    item = services.store.get(key)
    assert item is not None and reaps == 1, (reaps, item)
    (job,) = env.admin.jobs()
    if status in ("RECORDED", "DISPATCHED", "DISPATCH_FAILED", "RUNNING:handback"):
        assert item.status is LedgerStatus.HANDED_BACK and job["state"] == "waiting", (item, job)
        assert job["retries"] == 3  # handed back without using an attempt
    elif status in ("RUNNING", "RUNNING:self"):
        # The executor vanished mid-handler: settled as a timeout (a failure using one attempt).
        assert item.status is LedgerStatus.ACKNOWLEDGED and job["retries"] == 2, (item, job)
        assert item.outcome is not None and item.outcome.error_code == "EXECUTOR_LOST", item
        assert item.epoch is not None and item.epoch.startswith("reaper:"), item
    elif status == "OUTCOME_STORED":
        assert item.status is LedgerStatus.ACKNOWLEDGED and job["state"] == "completed", (item, job)
    else:  # REPORTED: Priostack has nothing to acknowledge; the job is still active server-side
        assert item.status is LedgerStatus.ACKNOWLEDGED, item
