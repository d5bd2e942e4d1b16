"""``record_running``: an executor that pulled a delivery itself records it straight into
``RUNNING`` under its run's epoch, under exactly ``record_delivery``'s conditions (new,
again after a hand-back, settled before the pull, a duplicate noted, a forgotten job's
outcome kept), and the item then lives as any claimed run: fenced by its epoch, in flight
until its final write, and the reaper's past its deadline. On every backend."""

from __future__ import annotations

import base64
import random
from typing import Any

import pytest

from serverless_worker.model import Delivery, DispatchMode, LedgerStatus, Outcome, OutcomeKind, ReportReceipt
from serverless_worker.runtime.reaper import reap_action
from serverless_worker.state import StaleWriteError, StateStore, ledger_key_for
from serverless_worker.state.errors import DeliveryTooLargeError, UnrecordableDeliveryError
from serverless_worker.state.rules import CASE_RECORD_FORGOTTEN, TRANSITIONS

S = LedgerStatus
OUTCOME = Outcome(kind=OutcomeKind.SUCCESS, value={"old": True})


def _self_pulled(store: StateStore, delivery: Delivery, epoch: str = "req-1/a1", *, in_seconds: float = 300,
                 **flags: Any) -> Any:
    return store.record_running(delivery, instance="blue", epoch=epoch,
                                deadline=store._clock() + in_seconds, **flags)  # type: ignore[attr-defined]


def _scheduled(store: StateStore, delivery: Delivery) -> str:
    key = store.record_delivery(delivery, instance="blue", deadline=store._clock() + 60,  # type: ignore[attr-defined]
                                dispatch_mode="invoke", again_after_hand_back=True)
    assert key is not None
    return key


def test_the_rows_are_record_deliverys_conditions_into_running() -> None:
    recording = {case: t for (write, case), t in TRANSITIONS.items() if write == "record_delivery"}
    running = {case: t for (write, case), t in TRANSITIONS.items() if write == "record_running"}

    assert running.keys() == recording.keys()
    for case, row in running.items():
        if case != CASE_RECORD_FORGOTTEN:  # kept by a write fenced by the run's epoch instead
            assert row.condition == recording[case].condition and row.creates == recording[case].creates
        assert row.to == (S.RUNNING if recording[case].to is S.RECORDED else recording[case].to)


def test_a_new_delivery_is_recorded_running_in_one_write(store: StateStore, delivery: Delivery,
                                                         clock: Any) -> None:
    item = _self_pulled(store, delivery, "req-1/a1", in_seconds=90)

    assert item is not None and item.key == ledger_key_for(delivery)
    assert (item.status, item.epoch, item.runs, item.dispatch_mode) == (S.RUNNING, "req-1/a1", 1,
                                                                        DispatchMode.SELF_PULLED)
    assert item.delivery == delivery and item.outcome is None and item.ttl is None
    assert item.deadline == pytest.approx(clock.now + 90) and item.recorded_at == pytest.approx(clock.now)
    assert store.get(item.key) == item  # returned as stored, as start_run returns its claim
    assert dict(store.ops) == {"write": 1, "read": 1}
    # a retried claim by the same run resumes it (runs counts it), as for a dispatched delivery
    again = store.start_run(item.key, "req-1/a1", clock.now + 90)
    assert again is not None and again.runs == 2
    assert store.start_run(item.key, "req-2/b2", clock.now + 90) is None


@pytest.mark.parametrize("holder", ["scheduler", "executor"])
def test_a_duplicate_is_noted_and_not_recorded(store: StateStore, make_delivery: Any, holder: str) -> None:
    first = make_delivery("exec-1", attempt=1)
    key = _scheduled(store, first) if holder == "scheduler" else _self_pulled(store, first, "req-1/a1").key

    again = _self_pulled(store, make_delivery("exec-1", attempt=2), "req-2/b2", again_after_hand_back=True)

    assert again is None
    item = store.get(key)
    assert item is not None and item.redelivered and item.attempt == 1
    want = (S.RECORDED, None) if holder == "scheduler" else (S.RUNNING, "req-1/a1")
    assert (item.status, item.epoch) == want
    # and the scheduler pulling the same execution finds the executor's item
    assert store.record_delivery(first, instance="blue", deadline=0, dispatch_mode="invoke") is None


@pytest.mark.parametrize("handing_back", [False, True], ids=["handed-back", "hand-back-in-progress"])
def test_a_delivery_handed_back_is_recorded_again_when_asked(store: StateStore, make_delivery: Any,
                                                             handing_back: bool) -> None:
    delivery = make_delivery("exec-3")
    key = _scheduled(store, delivery)
    assert store.start_run(key, "handback:x", store._clock() + 60) is not None  # type: ignore[attr-defined]
    if not handing_back:
        assert store.mark_handed_back(key, "budget too small", epoch="handback:x")
        assert _self_pulled(store, delivery) is None  # not asked: a duplicate

    item = _self_pulled(store, delivery, "req-2/b2", again_after_hand_back=True)

    assert item is not None and (item.status, item.epoch, item.runs) == (S.RUNNING, "req-2/b2", 1)
    assert item.error is None and item.ttl is None
    assert store.count_in_flight("pipelogiq", "blue") == 1


@pytest.mark.parametrize("settled_since_the_pull", [False, True])
def test_a_settled_id_is_new_work_only_if_it_settled_before_the_pull(store: StateStore, make_delivery: Any,
                                                                     clock: Any,
                                                                     settled_since_the_pull: bool) -> None:
    old = make_delivery("2251799813685249:r3", protocol="priostack")
    key = _self_pulled(store, old, "req-1/a1").key
    store.store_outcome(key, "req-1/a1", OUTCOME)
    assert store.mark_acknowledged(key, ReportReceipt(status="completed"))
    pull_sent = clock.now - 1 if settled_since_the_pull else clock.advance(0.5)

    new_job = make_delivery("2251799813685249:r3", protocol="priostack", payload={"n": 7})
    item = _self_pulled(store, new_job, "req-2/b2", settled_before=pull_sent)

    if settled_since_the_pull:
        assert item is None
        stored = store.get(key)
        assert stored is not None and stored.status is S.ACKNOWLEDGED
        return
    assert item is not None and (item.status, item.epoch, item.runs) == (S.RUNNING, "req-2/b2", 1)
    assert item.delivery.payload == {"n": 7} and item.outcome is None and item.report is None


def test_a_forgotten_job_comes_back_with_its_outcome_to_report_never_to_rerun(store: StateStore,
                                                                             make_delivery: Any,
                                                                             clock: Any) -> None:
    # given a job whose report the server answered "not found" (it forgot the activation)
    delivery = make_delivery("job-4:r3", protocol="priostack")
    key = _self_pulled(store, delivery, "req-1/a1").key
    store.store_outcome(key, "req-1/a1", OUTCOME)
    assert store.mark_acknowledged(key, ReportReceipt(accepted=False, status="not_found"))

    # when an executor pulls it again
    item = _self_pulled(store, delivery, "req-2/b2", settled_before=clock.now + 1)

    # then it comes back with the stored outcome, for the caller to report
    assert item is not None and item.key == key
    assert (item.status, item.outcome, item.epoch) == (S.OUTCOME_STORED, OUTCOME, "req-2/b2")
    assert store.get(key) == item
    assert store.start_run(key, "req-2/b2", clock.now + 60) is None  # never run again
    with pytest.raises(StaleWriteError):
        store.store_outcome(key, "req-2/b2", Outcome(kind=OutcomeKind.SUCCESS, value={"new": True}))
    assert store.mark_acknowledged(key, ReportReceipt(status="completed"))
    assert store.count_in_flight("priostack", "blue") == 0


def test_it_counts_in_flight_until_its_final_write(store: StateStore, make_delivery: Any, clock: Any) -> None:
    item = _self_pulled(store, make_delivery("exec-5"), in_seconds=90)
    _scheduled(store, make_delivery("exec-6"))

    assert store.count_in_flight("pipelogiq", "blue") == 2
    assert store.count_in_flight("pipelogiq", "blue", live_at=clock.now + 59) == 2
    assert store.count_in_flight("pipelogiq", "blue", live_at=clock.now + 61) == 1  # its own deadline counts
    assert [i.key for i in store.in_flight("pipelogiq", "blue")] == [ledger_key_for(make_delivery("exec-6")),
                                                                     item.key]
    store.store_outcome(item.key, "req-1/a1", OUTCOME)
    assert store.count_in_flight("pipelogiq", "blue") == 2  # stored is not yet settled
    assert store.mark_acknowledged(item.key, ReportReceipt(status="completed"))
    assert store.count_in_flight("pipelogiq", "blue") == 1


def test_its_outcome_is_fenced_by_its_epoch_and_settles_as_any_run(store: StateStore, delivery: Delivery,
                                                                   clock: Any) -> None:
    key = _self_pulled(store, delivery, "req-1/a1").key

    with pytest.raises(StaleWriteError):
        store.store_outcome(key, "req-1/zz", OUTCOME)
    stored = store.get(key)
    assert stored is not None and stored.status is S.RUNNING and stored.outcome is None
    store.store_outcome(key, "req-1/a1", OUTCOME)
    receipt = ReportReceipt(accepted=True, status="completed")
    assert store.mark_reported(key, receipt)
    assert store.mark_acknowledged(key)

    item = store.get(key)
    assert item is not None and item.status is S.ACKNOWLEDGED and item.outcome == OUTCOME
    assert item.report == receipt and item.deadline is None and item.dispatch_mode is DispatchMode.SELF_PULLED


def test_past_its_deadline_the_reaper_takes_it_over(store: StateStore, delivery: Delivery, clock: Any) -> None:
    key = _self_pulled(store, delivery, "req-1/a1", in_seconds=40).key
    assert store.stranded("pipelogiq", "blue", clock.now + 39) == []

    clock.advance(41)
    (stranded,) = store.stranded("pipelogiq", "blue", clock.now)
    assert stranded.key == key and reap_action(stranded) == "time_out"
    assert store.count_in_flight("pipelogiq", "blue", live_at=clock.now) == 0  # no slot held meanwhile
    assert store.take_over(key, old_epoch="req-1/a1", new_epoch="reaper:1", deadline=clock.now + 30)
    store.store_outcome(key, "reaper:1", Outcome(kind=OutcomeKind.TIMEOUT, error_code="EXECUTOR_LOST"))

    with pytest.raises(StaleWriteError):  # the late run's outcome is never stored
        store.store_outcome(key, "req-1/a1", OUTCOME)
    item = store.get(key)
    assert item is not None and item.outcome is not None and item.outcome.error_code == "EXECUTOR_LOST"


def test_a_delivery_no_item_can_hold_raises_and_writes_nothing(store: StateStore, make_delivery: Any) -> None:
    deep: dict[str, Any] = {}
    for _ in range(300):
        deep = {"a": deep}
    big = base64.b64encode(random.Random(7).randbytes(600 * 1024)).decode()  # deflate cannot shrink it enough

    with pytest.raises(UnrecordableDeliveryError) as nested:
        _self_pulled(store, make_delivery("deep-1", payload={"deep": deep}))
    with pytest.raises(UnrecordableDeliveryError):
        _self_pulled(store, make_delivery("bad\ud800id"))
    with pytest.raises(DeliveryTooLargeError):
        _self_pulled(store, make_delivery("big-1", payload={"blob": big}))

    assert "nests too deep" in nested.value.reason
    assert store.ops["write"] == 0
    assert store.get("delivery#pipelogiq#deep-1") is None and store.get("delivery#pipelogiq#big-1") is None
    assert store.count_in_flight("pipelogiq", "blue") == 0


def test_a_self_pulled_job_costs_three_writes_and_no_reads(store: StateStore, delivery: Delivery) -> None:
    # record and claim, outcome, report and acknowledgement together (settle.py's final write)
    item = _self_pulled(store, delivery, "req-1/a1")
    store.store_outcome(item.key, "req-1/a1", OUTCOME)
    assert store.mark_acknowledged(item.key, ReportReceipt(status="completed"))

    assert dict(store.ops) == {"write": 3}
