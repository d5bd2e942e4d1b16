"""The delivery ledger: every transition, and each one refused for the wrong status or epoch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from serverless_worker.model import Delivery, LedgerStatus, Outcome, OutcomeKind, ReportReceipt
from serverless_worker.state import (
    FINAL_RETENTION_SECONDS,
    DynamoStateStore,
    StaleWriteError,
    StateStore,
    ledger_key_for,
)

S = LedgerStatus
RawItem = Callable[[str, str], dict[str, Any] | None]


def _record(store: StateStore, delivery: Delivery, *, instance: str = "blue", in_seconds: float = 60,
            mode: str = "invoke") -> str:
    key = store.record_delivery(delivery, instance=instance, deadline=store._clock() + in_seconds,
                                dispatch_mode=mode)
    assert key is not None
    return key


def _running(store: StateStore, delivery: Delivery, epoch: str = "run-1") -> str:
    key = _record(store, delivery)
    assert store.start_run(key, epoch, store._clock() + 300) is not None
    return key


def _stored(store: StateStore, delivery: Delivery, epoch: str = "run-1") -> str:
    key = _running(store, delivery, epoch)
    store.store_outcome(key, epoch, Outcome(kind=OutcomeKind.SUCCESS, value={"ok": True}))
    return key


# -- recording -------------------------------------------------------------------


def test_record_delivery_writes_a_recorded_item_that_round_trips(store: StateStore, delivery: Delivery,
                                                                 clock: Any) -> None:
    key = store.record_delivery(delivery, instance="blue", deadline=clock.now + 60, dispatch_mode="invoke")

    assert key == ledger_key_for(delivery) == "delivery#pipelogiq#exec-1"
    item = store.get(key)
    assert item is not None
    assert item.status is S.RECORDED
    assert item.delivery == delivery
    assert item.delivery.token is not None
    assert item.delivery.token.get_secret_value() == "delivery-token-s3cr3t"
    assert item.delivery.payload == {"amount": 12.5, "currency": "EUR", "items": [1, 2]}
    assert (item.instance, item.handler, item.protocol, item.attempt) == ("blue", "payment-processor",
                                                                          "pipelogiq", 1)
    assert item.dispatch_mode == "invoke"
    assert item.deadline == pytest.approx(clock.now + 60)
    assert item.recorded_at == pytest.approx(clock.now)
    assert item.epoch is None and item.outcome is None and item.ttl is None
    assert "delivery-token-s3cr3t" not in repr(item)


def test_a_duplicate_delivery_is_not_recorded_twice(store: StateStore, make_delivery: Any) -> None:
    first = make_delivery("exec-1", attempt=1)
    _running(store, first)

    again = store.record_delivery(make_delivery("exec-1", attempt=2), instance="blue", deadline=0,
                                  dispatch_mode="invoke")

    assert again is None
    item = store.get(ledger_key_for(first))
    assert item is not None and item.status is S.RUNNING and item.attempt == 1


def test_a_settled_item_past_its_ttl_counts_as_gone(store: StateStore, delivery: Delivery, clock: Any,
                                                    raw_item: RawItem) -> None:
    key = _record(store, delivery)
    assert store.mark_handed_back(key, "shutdown")
    assert store.record_delivery(delivery, instance="blue", deadline=clock.now + 60,
                                 dispatch_mode="invoke") is None

    clock.advance(FINAL_RETENTION_SECONDS + 1)  # TTL has not deleted it (it deletes late)
    assert raw_item(key, "delivery") is not None
    again = store.record_delivery(delivery, instance="blue", deadline=clock.now + 60, dispatch_mode="invoke")

    assert again == key
    item = store.get(key)
    assert item is not None and item.status is S.RECORDED and item.ttl is None and item.error is None


def test_an_unknown_dispatch_mode_is_refused(store: StateStore, delivery: Delivery) -> None:
    with pytest.raises(ValueError):
        store.record_delivery(delivery, instance="blue", deadline=0, dispatch_mode="carrier-pigeon")


def test_record_new_records_a_batch_as_record_delivery_would(store: StateStore, make_delivery: Any,
                                                             clock: Any) -> None:
    deliveries = [make_delivery(f"exec-{n}", protocol="priostack", attempt=n) for n in range(1, 4)]

    keys = store.record_new([(d, "invoke") for d in deliveries[:2]] + [(deliveries[2], "state_machine")],
                            instance="blue", deadline=clock.now + 60)

    assert keys == [ledger_key_for(d) for d in deliveries]
    for delivery, key, mode in zip(deliveries, keys, ["invoke", "invoke", "state_machine"], strict=True):
        assert key is not None
        item = store.get(key)
        assert item is not None and item.status is S.RECORDED and item.delivery == delivery
        assert (item.instance, item.attempt, item.dispatch_mode) == ("blue", delivery.attempt, mode)
        assert item.deadline == pytest.approx(clock.now + 60) and item.runs == 0
    assert store.count_in_flight("priostack", "blue") == 3
    assert store.ops["write"] == 3


def test_record_new_leaves_an_existing_item_to_record_delivery(store: StateStore, make_delivery: Any,
                                                               clock: Any) -> None:
    """A delivery the ledger has (running here, or handed back) is neither recorded nor
    touched: ``None`` sends it through ``record_delivery``, which tells a duplicate from
    the redelivery of a handed-back job. A repeat within the batch is no new item either."""
    running = make_delivery("exec-1")
    _running(store, running)
    handed = make_delivery("exec-2")
    assert store.mark_handed_back(_record(store, handed), "shutdown")
    fresh = make_delivery("exec-3")

    keys = store.record_new([(make_delivery("exec-1", attempt=2), "invoke"), (handed, "invoke"),
                             (fresh, "invoke"), (make_delivery("exec-3", attempt=2), "invoke")],
                            instance="blue", deadline=clock.now + 60)

    assert keys == [None, None, ledger_key_for(fresh), None]
    item = store.get(ledger_key_for(running))
    assert item is not None and item.status is S.RUNNING and item.attempt == 1 and item.epoch == "run-1"
    item = store.get(ledger_key_for(handed))
    assert item is not None and item.status is S.HANDED_BACK
    item = store.get(ledger_key_for(fresh))
    assert item is not None and item.status is S.RECORDED and item.attempt == 1
    # What the scheduler does with the handed-back one: record_delivery records it afresh.
    assert store.record_delivery(handed, instance="blue", deadline=clock.now + 60, dispatch_mode="invoke",
                                 again_after_hand_back=True) == ledger_key_for(handed)


# -- dispatch -------------------------------------------------------------------


def test_mark_dispatched_only_from_recorded(store: StateStore, delivery: Delivery) -> None:
    key = _record(store, delivery, mode="state_machine")

    assert store.mark_dispatched(key) is True
    assert store.mark_dispatched(key) is False
    item = store.get(key)
    assert item is not None and item.status is S.DISPATCHED and item.dispatch_mode == "state_machine"


def test_mark_dispatched_loses_to_an_executor_that_already_claimed_it(store: StateStore,
                                                                      delivery: Delivery) -> None:
    key = _running(store, delivery)

    assert store.mark_dispatched(key) is False
    item = store.get(key)
    assert item is not None and item.status is S.RUNNING


def test_dispatch_failed_stays_in_flight_and_is_stranded_at_once(store: StateStore, delivery: Delivery,
                                                                 clock: Any) -> None:
    key = _record(store, delivery, in_seconds=600)

    assert store.mark_dispatch_failed(key, "Invoke throttled") is True

    item = store.get(key)
    assert item is not None and item.status is S.DISPATCH_FAILED and item.error == "Invoke throttled"
    assert store.count_in_flight("pipelogiq", "blue") == 1
    assert store.start_run(key, "late-executor", clock.now + 60) is None  # nobody runs it now
    clock.advance(1)
    assert [i.key for i in store.stranded("pipelogiq", "blue", clock.now)] == [key]
    # Only the reaper's claim to hand it back takes it (so it is not stranded for good).
    claimed = store.start_run(key, "handback:reaper", clock.now + 60)
    assert claimed is not None and claimed.status is S.RUNNING


def test_dispatch_failed_is_refused_once_a_run_claimed_it(store: StateStore, delivery: Delivery) -> None:
    key = _running(store, delivery)

    assert store.mark_dispatch_failed(key, "ambiguous invoke") is False
    item = store.get(key)
    assert item is not None and item.status is S.RUNNING and item.error is None


# -- the run ----------------------------------------------------------------------


@pytest.mark.parametrize("dispatched", [False, True])
def test_start_run_claims_and_returns_the_item(store: StateStore, delivery: Delivery, clock: Any,
                                               dispatched: bool) -> None:
    key = _record(store, delivery)
    if dispatched:
        assert store.mark_dispatched(key)

    item = store.start_run(key, "req-1", clock.now + 900)

    assert item is not None
    assert (item.status, item.epoch, item.runs) == (S.RUNNING, "req-1", 1)
    assert item.deadline == pytest.approx(clock.now + 900)
    assert item.delivery == delivery


def test_start_run_refuses_a_second_epoch(store: StateStore, delivery: Delivery, clock: Any) -> None:
    key = _running(store, delivery, "req-1")

    assert store.start_run(key, "req-2", clock.now + 900) is None
    item = store.get(key)
    assert item is not None and item.epoch == "req-1" and item.runs == 1


def test_start_run_resumes_the_same_epoch_for_a_continuation_slice(store: StateStore, delivery: Delivery,
                                                                   clock: Any) -> None:
    key = _running(store, delivery, "exec-arn-1")
    store.save_checkpoint(key, "exec-arn-1", {"page": 3})
    clock.advance(10)

    item = store.start_run(key, "exec-arn-1", clock.now + 900)

    assert item is not None
    assert (item.status, item.epoch, item.runs, item.checkpoint) == (S.RUNNING, "exec-arn-1", 2, {"page": 3})
    assert item.deadline == pytest.approx(clock.now + 900)


def test_start_run_refuses_an_item_past_running_even_for_its_epoch(store: StateStore, delivery: Delivery,
                                                                   clock: Any) -> None:
    key = _stored(store, delivery, "req-1")

    assert store.start_run(key, "req-1", clock.now + 900) is None
    item = store.get(key)  # what a retried executor reads instead: re-report, never re-run
    assert item is not None and item.status is S.OUTCOME_STORED
    assert item.outcome == Outcome(kind=OutcomeKind.SUCCESS, value={"ok": True})


def test_start_run_of_a_missing_item_is_none(store: StateStore, clock: Any) -> None:
    assert store.start_run("delivery#pipelogiq#nope", "req-1", clock.now + 60) is None
    assert store.get("delivery#pipelogiq#nope") is None


def test_checkpoint_is_epoch_fenced(store: StateStore, delivery: Delivery, clock: Any) -> None:
    key = _running(store, delivery, "exec-1")

    store.save_checkpoint(key, "exec-1", {"cursor": "abc", "done": 10}, deadline=clock.now + 1200)
    with pytest.raises(StaleWriteError) as refused:
        store.save_checkpoint(key, "exec-2", {"cursor": "zzz"})

    assert key in str(refused.value)
    item = store.get(key)
    assert item is not None and item.checkpoint == {"cursor": "abc", "done": 10}
    assert item.deadline == pytest.approx(clock.now + 1200)


def test_renew_deadline_counts_renewals_and_is_epoch_fenced(store: StateStore, delivery: Delivery,
                                                            clock: Any) -> None:
    key = _running(store, delivery, "exec-1")

    assert store.renew_deadline(key, "exec-1", clock.now + 100) == 1
    assert store.renew_deadline(key, "exec-1", clock.now + 200) == 2
    with pytest.raises(StaleWriteError):
        store.renew_deadline(key, "exec-0", clock.now + 999)

    item = store.get(key)
    assert item is not None and item.deadline == pytest.approx(clock.now + 200) and item.renewals == 2


def test_store_outcome_moves_running_to_outcome_stored(store: StateStore, delivery: Delivery) -> None:
    key = _running(store, delivery, "req-1")
    store.save_checkpoint(key, "req-1", {"half": True})
    outcome = Outcome(kind=OutcomeKind.BUSINESS_ERROR, error_code="CARD_DECLINED", message="funds",
                      value={"declineReason": "funds", "ratio": 0.25})

    store.store_outcome(key, "req-1", outcome)

    item = store.get(key)
    assert item is not None
    assert item.status is S.OUTCOME_STORED and item.outcome == outcome
    assert item.checkpoint is None  # dead weight once the outcome is in
    assert item.deadline is not None  # still in flight until settled


def test_store_outcome_with_a_stale_epoch_raises_and_changes_nothing(store: StateStore,
                                                                     delivery: Delivery) -> None:
    key = _running(store, delivery, "req-1")

    with pytest.raises(StaleWriteError):
        store.store_outcome(key, "req-0", Outcome(kind=OutcomeKind.FAILURE, message="late"))

    item = store.get(key)
    assert item is not None and item.status is S.RUNNING and item.outcome is None


def test_store_outcome_needs_a_running_item(store: StateStore, delivery: Delivery) -> None:
    key = _record(store, delivery)

    with pytest.raises(StaleWriteError):
        store.store_outcome(key, "req-1", Outcome(kind=OutcomeKind.SUCCESS))


def test_take_over_fences_the_old_run(store: StateStore, delivery: Delivery, clock: Any) -> None:
    key = _running(store, delivery, "req-1")
    store.renew_deadline(key, "req-1", clock.now + 5)

    assert store.take_over(key, old_epoch="req-1", new_epoch="reaper-1", deadline=clock.now + 30) is True
    assert store.take_over(key, old_epoch="req-1", new_epoch="reaper-2", deadline=clock.now + 30) is False

    with pytest.raises(StaleWriteError):
        store.store_outcome(key, "req-1", Outcome(kind=OutcomeKind.SUCCESS))
    item = store.get(key)
    assert item is not None and (item.epoch, item.runs, item.renewals) == ("reaper-1", 2, 0)


def test_cancel_and_handover_requests_are_fenced(store: StateStore, delivery: Delivery, clock: Any) -> None:
    key = _running(store, delivery, "exec-1")
    store.renew_deadline(key, "exec-1", clock.now + 60)

    assert store.request_cancel(key, "exec-0", "stale loop") is False
    assert store.request_cancel(key, "exec-1", "renewal refused: lease_lost") is True
    assert store.request_handover(key, "exec-0") is False
    assert store.request_handover(key, "exec-1") is True
    item = store.get(key)
    assert item is not None
    assert item.cancel_reason == "renewal refused: lease_lost" and item.handover_requested is True

    assert store.clear_handover(key, "exec-1") is True
    item = store.get(key)
    assert item is not None and item.handover_requested is False and item.renewals == 0


def test_callback_token_is_kept_fenced_and_out_of_reprs(store: StateStore, delivery: Delivery) -> None:
    key = _running(store, delivery, "exec-1")

    store.save_callback_token(key, "exec-1", "AAAA-task-token")
    with pytest.raises(StaleWriteError):
        store.save_callback_token(key, "exec-2", "BBBB-task-token")

    item = store.get(key)
    assert item is not None and item.callback_token == "AAAA-task-token"
    assert "AAAA-task-token" not in repr(item)


# -- settling ---------------------------------------------------------------------------


def test_report_then_acknowledge_settles_the_item(store: StateStore, delivery: Delivery, clock: Any,
                                                  raw_item: RawItem) -> None:
    key = _stored(store, delivery)
    receipt = ReportReceipt(accepted=True, status="completed", detail={"n": 1})

    assert store.mark_reported(key, receipt) is True
    assert store.mark_reported(key, receipt) is False  # a second reporter finds it reported
    assert store.mark_acknowledged(key) is True
    assert store.mark_acknowledged(key) is False

    item = store.get(key)
    assert item is not None and item.status is S.ACKNOWLEDGED and item.is_final
    assert item.report == receipt
    assert item.deadline is None
    assert item.ttl == int(clock.now) + FINAL_RETENTION_SECONDS
    raw = raw_item(key, "delivery")
    assert raw is not None and "scope" not in raw and "deadline" not in raw


def test_report_needs_a_stored_outcome(store: StateStore, delivery: Delivery) -> None:
    key = _running(store, delivery)

    assert store.mark_reported(key, ReportReceipt()) is False
    assert store.mark_acknowledged(key) is False
    item = store.get(key)
    assert item is not None and item.status is S.RUNNING


def test_acknowledge_needs_a_report(store: StateStore, delivery: Delivery) -> None:
    key = _stored(store, delivery)

    assert store.mark_acknowledged(key) is False


@pytest.mark.parametrize("final", ["mark_handed_back", "mark_discarded"])
@pytest.mark.parametrize("stage", ["recorded", "dispatched", "dispatch_failed", "running", "outcome_stored"])
def test_unreported_items_can_be_handed_back_or_discarded(store: StateStore, delivery: Delivery, final: str,
                                                          stage: str) -> None:
    key = _record(store, delivery)
    if stage == "dispatched":
        store.mark_dispatched(key)
    elif stage == "dispatch_failed":
        store.mark_dispatch_failed(key, "boom")
    elif stage == "running":
        store.start_run(key, "req-1", 1e10)
    elif stage == "outcome_stored":
        store.start_run(key, "req-1", 1e10)
        store.store_outcome(key, "req-1", Outcome(kind=OutcomeKind.LEASE_LOST))

    assert getattr(store, final)(key, "worker shutting down") is True

    item = store.get(key)
    expected = S.HANDED_BACK if final == "mark_handed_back" else S.DISCARDED
    assert item is not None and item.status is expected and item.error == "worker shutting down"
    assert store.count_in_flight("pipelogiq", "blue") == 0


@pytest.mark.parametrize("final", ["mark_handed_back", "mark_discarded"])
def test_reported_or_settled_items_cannot_go_back(store: StateStore, delivery: Delivery, final: str) -> None:
    key = _stored(store, delivery)
    store.mark_reported(key, ReportReceipt())

    assert getattr(store, final)(key, "too late") is False
    store.mark_acknowledged(key)
    assert getattr(store, final)(key, "too late") is False
    item = store.get(key)
    assert item is not None and item.status is S.ACKNOWLEDGED and item.error is None


@pytest.mark.parametrize("final", ["mark_handed_back", "mark_discarded"])
def test_hand_back_and_discard_can_be_fenced_by_epoch(store: StateStore, delivery: Delivery,
                                                      final: str) -> None:
    key = _running(store, delivery, "req-1")

    assert getattr(store, final)(key, "lease refused", epoch="req-0") is False
    assert getattr(store, final)(key, "lease refused", epoch="req-1") is True


# -- in flight ---------------------------------------------------------------------------


def test_in_flight_counts_only_unsettled_items_of_the_instance(store: StateStore, make_delivery: Any) -> None:
    keys = [_record(store, make_delivery(f"e-{n}"), in_seconds=60 + n) for n in range(4)]
    _record(store, make_delivery("other-instance"), instance="green")
    _record(store, make_delivery("other-protocol", protocol="priostack"))

    assert store.count_in_flight("pipelogiq", "blue") == 4
    store.start_run(keys[0], "r", 1e10)
    store.store_outcome(keys[0], "r", Outcome(kind=OutcomeKind.SUCCESS))
    store.mark_reported(keys[0], ReportReceipt())
    assert store.count_in_flight("pipelogiq", "blue") == 4  # reported is not yet acknowledged
    store.mark_acknowledged(keys[0])
    store.mark_handed_back(keys[1], "shutdown")
    store.mark_discarded(keys[2], "stale")

    assert store.count_in_flight("pipelogiq", "blue") == 1
    assert [item.key for item in store.in_flight("pipelogiq", "blue")] == [keys[3]]
    assert store.count_in_flight("pipelogiq", "green") == 1
    assert store.count_in_flight("priostack", "blue") == 1
    assert store.count_in_flight("claimqueue", "blue") == 0


def test_stranded_finds_items_past_their_deadline(store: StateStore, make_delivery: Any, clock: Any) -> None:
    never_started = _record(store, make_delivery("a"), in_seconds=10)
    running = _record(store, make_delivery("b"), in_seconds=10)
    store.start_run(running, "req-b", clock.now + 20)
    fresh = _record(store, make_delivery("c"), in_seconds=100)
    settled = _record(store, make_delivery("d"), in_seconds=5)
    store.mark_discarded(settled, "stale")

    assert store.stranded("pipelogiq", "blue", clock.now) == []
    clock.advance(15)
    assert [i.key for i in store.stranded("pipelogiq", "blue", clock.now)] == [never_started]
    clock.advance(10)
    stranded = store.stranded("pipelogiq", "blue", clock.now)

    assert [i.key for i in stranded] == [never_started, running]
    assert [i.status for i in stranded] == [S.RECORDED, S.RUNNING]
    assert stranded[1].delivery.token is not None  # full items, not the index's projection
    assert fresh not in {i.key for i in stranded}


def test_renewing_a_deadline_takes_the_item_out_of_the_stranded_set(store: StateStore, delivery: Delivery,
                                                                   clock: Any) -> None:
    key = _running(store, delivery, "req-1")
    store.renew_deadline(key, "req-1", clock.now + 5)
    clock.advance(6)
    assert [i.key for i in store.stranded("pipelogiq", "blue", clock.now)] == [key]

    store.renew_deadline(key, "req-1", clock.now + 60)

    assert store.stranded("pipelogiq", "blue", clock.now) == []


def test_stranded_reads_more_items_than_one_batch_get_takes(store: StateStore, make_delivery: Any,
                                                            clock: Any) -> None:
    keys = [_record(store, make_delivery(f"bulk-{n:03d}"), in_seconds=1 + n / 1000) for n in range(105)]
    clock.advance(5)
    store.ops.clear()

    stranded = store.stranded("pipelogiq", "blue", clock.now)

    assert [i.key for i in stranded] == keys
    assert store.count_in_flight("pipelogiq", "blue") == 105
    assert store.ops["write"] == 0


# -- request accounting --------------------------------------------------------------------


def test_one_job_costs_six_writes_and_no_reads(store: StateStore, delivery: Delivery, clock: Any) -> None:
    store.ops.clear()

    key = _record(store, delivery)
    store.mark_dispatched(key)
    item = store.start_run(key, "req-1", clock.now + 60)
    store.store_outcome(key, "req-1", Outcome(kind=OutcomeKind.SUCCESS, value=item and item.delivery.payload))
    store.mark_reported(key, ReportReceipt())
    store.mark_acknowledged(key)

    assert dict(store.ops) == {"write": 6}
    store.get(key)
    store.count_in_flight("pipelogiq", "blue")
    assert dict(store.ops) == {"write": 6, "read": 2}


def test_refused_writes_are_counted_too(store: StateStore, delivery: Delivery) -> None:
    key = _running(store, delivery)
    store.ops.clear()

    assert store.mark_dispatched(key) is False
    with pytest.raises(StaleWriteError):
        store.store_outcome(key, "other", Outcome(kind=OutcomeKind.SUCCESS))

    assert dict(store.ops) == {"write": 2}


class _LaggingIndex:
    """The real client, except that index queries can be frozen at an earlier answer:
    DynamoDB's global secondary indexes are eventually consistent, and neither backend lags."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.frozen: dict[str, Any] | None = None
        self.freeze_next = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def query(self, **request: Any) -> dict[str, Any]:
        if self.frozen is not None:
            return self.frozen
        answer: dict[str, Any] = self._client.query(**request)
        if self.freeze_next:
            self.frozen = answer
        return answer


def test_stranded_trusts_the_full_item_over_a_lagging_index(ddb: Any, table: Any, clock: Any,
                                                            make_delivery: Any) -> None:
    lagging = _LaggingIndex(ddb)
    store = DynamoStateStore(table.name, client=lagging, clock=clock)
    renewed = _running(store, make_delivery("renewed"), "req-1")
    settled = _running(store, make_delivery("settled"), "req-2")
    store.renew_deadline(renewed, "req-1", clock.now + 5)
    store.renew_deadline(settled, "req-2", clock.now + 5)
    clock.advance(6)
    lagging.freeze_next = True
    assert {i.key for i in store.stranded("pipelogiq", "blue", clock.now)} == {renewed, settled}

    store.renew_deadline(renewed, "req-1", clock.now + 60)
    store.mark_discarded(settled, "lease refused", epoch="req-2")

    assert store.stranded("pipelogiq", "blue", clock.now) == []  # the index still lists both
    assert store.in_flight("pipelogiq", "blue") == [store.get(renewed)]
