"""``runtime/reaper.reap_action`` as a table: what the reaper does with each kind of
stranded ledger item (docs/ledger.md), decided from the item alone."""

from __future__ import annotations

import pytest

from serverless_worker.model import Delivery, DispatchMode, LedgerStatus, Outcome, OutcomeKind
from serverless_worker.runtime.reaper import reap_action
from serverless_worker.runtime.settle import HANDBACK_PREFIX, SETTLE_ATTEMPTS_MAX
from serverless_worker.state.items import LedgerItem

STORED = Outcome(kind=OutcomeKind.SUCCESS, value=1)


def _item(status: LedgerStatus, *, epoch: str | None = None, failures: int = 0,
          outcome: Outcome | None = None) -> LedgerItem:
    delivery = Delivery(protocol="claimqueue", handler="resize", job_id="j1", ledger_id="j1:1", pulled_at=0.0)
    return LedgerItem(key="delivery#j1:1", status=status, delivery=delivery, instance="i",
                      dispatch_mode=DispatchMode.INVOKE, attempt=1, recorded_at=0.0, updated_at=0.0,
                      epoch=epoch, settle_failures=failures, outcome=outcome)


@pytest.mark.parametrize(("item", "action"), [
    pytest.param(_item(LedgerStatus.RECORDED), "hand_back", id="recorded-never-started"),
    pytest.param(_item(LedgerStatus.DISPATCHED), "hand_back", id="dispatched-never-claimed"),
    pytest.param(_item(LedgerStatus.DISPATCH_FAILED), "hand_back", id="dispatch-failed"),
    pytest.param(_item(LedgerStatus.RUNNING, epoch=f"{HANDBACK_PREFIX}x"), "hand_back_again",
                 id="a-hand-back-whose-call-failed"),
    pytest.param(_item(LedgerStatus.RUNNING, epoch="run:x"), "time_out", id="running-executor-lost"),
    pytest.param(_item(LedgerStatus.RUNNING), "time_out", id="running-without-epoch"),
    pytest.param(_item(LedgerStatus.OUTCOME_STORED, outcome=STORED), "resettle", id="outcome-stored-not-reported"),
    pytest.param(_item(LedgerStatus.OUTCOME_STORED), None, id="outcome-stored-but-missing"),
    pytest.param(_item(LedgerStatus.REPORTED), "acknowledge", id="reported-not-acknowledged"),
    pytest.param(_item(LedgerStatus.REPORTED, failures=SETTLE_ATTEMPTS_MAX - 1), "acknowledge",
                 id="one-failure-short-of-abandoning"),
    pytest.param(_item(LedgerStatus.REPORTED, failures=SETTLE_ATTEMPTS_MAX), "abandon",
                 id="reported-after-too-many-failures"),
    pytest.param(_item(LedgerStatus.RUNNING, failures=SETTLE_ATTEMPTS_MAX + 3), "abandon",
                 id="abandoning-comes-before-any-status"),
    pytest.param(_item(LedgerStatus.ACKNOWLEDGED), None, id="acknowledged-is-final"),
    pytest.param(_item(LedgerStatus.HANDED_BACK), None, id="handed-back-is-final"),
    pytest.param(_item(LedgerStatus.DISCARDED), None, id="discarded-is-final"),
])
def test_reap_action(item: LedgerItem, action: str | None) -> None:
    assert reap_action(item) == action
