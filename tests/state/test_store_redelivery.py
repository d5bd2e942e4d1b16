"""A ledger id that comes back: after its item settled (a server that forgot it, reset or
re-created, hands out new work under it), from a pull sent before its item settled (a
duplicate that raced our outcome), while it is in flight (a duplicate), and after an
outcome the server never confirmed (re-reported, never re-run). On every backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from serverless_worker.model import Delivery, LedgerStatus, Outcome, OutcomeKind, ReportReceipt
from serverless_worker.state import StateStore, ledger_key_for

S = LedgerStatus
OUTCOME = Outcome(kind=OutcomeKind.SUCCESS, value={"old": True})


def _record(store: StateStore, delivery: Delivery, **flags: float) -> str | None:
    return store.record_delivery(delivery, instance="blue", deadline=store._clock() + 60,  # type: ignore[attr-defined]
                                 dispatch_mode="invoke", again_after_hand_back=True, **flags)


def _run(store: StateStore, delivery: Delivery) -> str:
    key = _record(store, delivery)
    assert key is not None
    assert store.start_run(key, "run-1", store._clock() + 300) is not None  # type: ignore[attr-defined]
    return key


def _acknowledged(store: StateStore, delivery: Delivery) -> str:
    key = _run(store, delivery)
    store.store_outcome(key, "run-1", OUTCOME)
    assert store.mark_acknowledged(key, ReportReceipt(status="completed"))
    return key


def _handed_back(store: StateStore, delivery: Delivery) -> str:
    key = _run(store, delivery)
    assert store.mark_handed_back(key, "shutdown", epoch="run-1")
    return key


def _discarded(store: StateStore, delivery: Delivery) -> str:
    key = _run(store, delivery)
    assert store.mark_discarded(key, "lease refused", epoch="run-1")
    return key


SETTLE: dict[str, Callable[[StateStore, Delivery], str]] = {
    "acknowledged": _acknowledged, "handed_back": _handed_back, "discarded": _discarded}


@pytest.mark.parametrize("settled", list(SETTLE))
def test_a_settled_id_that_comes_back_is_recorded_as_new_work(store: StateStore, make_delivery: Any,
                                                              clock: Any, settled: str) -> None:
    # given a Priostack job key whose delivery settled (completed, handed back or dropped)
    key = SETTLE[settled](store, make_delivery("2251799813685249:r3", protocol="priostack"))
    writes = store.ops["write"]

    # when a re-created server hands out a new job under the same key, to a pull sent since
    new_job = make_delivery("2251799813685249:r3", protocol="priostack", payload={"n": 7})
    again = _record(store, new_job, settled_before=clock.advance(0.5))

    # then it is a new delivery: recorded afresh in one write, in flight, nothing carried over
    assert again == key == ledger_key_for(new_job)
    assert store.ops["write"] == writes + 1
    item = store.get(key)
    assert item is not None and item.status is S.RECORDED
    assert item.delivery.payload == {"n": 7}
    assert item.outcome is None and item.epoch is None and item.runs == 0 and item.ttl is None
    assert item.report is None and item.error is None
    assert store.count_in_flight("priostack", "blue") == 1
    # and it runs: the executor's claim takes it
    assert store.start_run(key, "run-2", store._clock() + 300) is not None  # type: ignore[attr-defined]


def test_where_settled_ids_are_never_reused_a_settled_id_stays_a_duplicate(store: StateStore,
                                                                            make_delivery: Any) -> None:
    # given a Pipelogiq execution settled (its id is the server's own, never handed out twice)
    delivery = make_delivery("1001:6f1c", protocol="pipelogiq")
    key = _acknowledged(store, delivery)

    # when the broker delivers it again, the scheduler not asking for new work on a settled id
    again = _record(store, delivery)

    # then it is a duplicate and the settled item is untouched
    assert again is None
    item = store.get(key)
    assert item is not None and item.status is S.ACKNOWLEDGED and item.outcome == OUTCOME


@pytest.mark.parametrize("settled", ["acknowledged", "discarded"])
def test_an_id_from_a_pull_sent_before_it_settled_is_a_duplicate(store: StateStore, make_delivery: Any,
                                                                 clock: Any, settled: str) -> None:
    # given a pull sent while the job ran (a restarted Priostack server re-activated it) ...
    asked = clock.now
    clock.advance(0.5)
    # ... and the run's outcome settled before the pull's answer was recorded
    key = SETTLE[settled](store, make_delivery("job-5:r3", protocol="priostack"))

    # when that answer's delivery of the same key is recorded
    again = _record(store, make_delivery("job-5:r3", protocol="priostack"), settled_before=asked)

    # then it is the job just settled, not new work: a duplicate, the item untouched
    assert again is None
    item = store.get(key)
    assert item is not None and item.status.value == settled.upper()


@pytest.mark.parametrize("stage", ["recorded", "running", "outcome_stored"])
def test_an_id_in_flight_is_a_duplicate_even_where_settled_ids_return_as_new(store: StateStore,
                                                                               make_delivery: Any,
                                                                               stage: str) -> None:
    # given a delivery still in flight
    delivery = make_delivery("job-9:r3", protocol="priostack")
    key = _record(store, delivery)
    assert key is not None
    if stage != "recorded":
        assert store.start_run(key, "run-1", store._clock() + 300) is not None  # type: ignore[attr-defined]
    if stage == "outcome_stored":
        store.store_outcome(key, "run-1", OUTCOME)

    # when the same id is handed out again
    again = _record(store, make_delivery("job-9:r3", protocol="priostack", payload={"n": 2}),
                    settled_before=store._clock() + 1)  # type: ignore[attr-defined]

    # then it is a duplicate: the item keeps its run, and notes the redelivery
    assert again is None
    item = store.get(key)
    assert item is not None and item.status.value == stage.upper() and item.redelivered
    assert item.delivery == delivery


def test_an_outcome_the_server_never_confirmed_is_reported_again_not_rerun(store: StateStore,
                                                                            make_delivery: Any) -> None:
    # given a job whose report the server answered "not found" (it forgot the activation)
    delivery = make_delivery("job-4:r3", protocol="priostack")
    key = _run(store, delivery)
    store.store_outcome(key, "run-1", OUTCOME)
    assert store.mark_acknowledged(key, ReportReceipt(accepted=False, status="not_found"))

    # when the server hands the job out again
    again = _record(store, delivery, settled_before=store._clock() + 1)  # type: ignore[attr-defined]

    # then the stored outcome is kept for the executor to report: the handler never runs again
    assert again == key
    item = store.get(key)
    assert item is not None and item.status is S.OUTCOME_STORED and item.outcome == OUTCOME
    assert store.start_run(key, "run-2", store._clock() + 300) is None  # type: ignore[attr-defined]
