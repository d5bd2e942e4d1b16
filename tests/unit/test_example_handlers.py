"""The example handlers (functions/handlers) do what their docstrings say, run through
serverless_worker.testing as a handler author would test their own."""

from __future__ import annotations

from typing import Any

import pytest
from functions.handlers.examples import DECLINED_CARD, charge, echo, sleepy, slow_report

from serverless_worker import CancelReason, Continue
from serverless_worker.model import OutcomeKind
from serverless_worker.testing import HandlerEnvironment, WireCall

PAYMENT = {"orderId": "o-1", "amount": 12.5, "currency": "EUR"}


@pytest.mark.parametrize("payload", [{"a": [1, 2]}, "plain text", None])
def test_echo_returns_its_input(payload: Any) -> None:
    run = HandlerEnvironment().run(echo, payload)

    assert run.outcome is not None and run.outcome.kind is OutcomeKind.SUCCESS
    assert run.outcome.value == payload


def test_charge_succeeds_and_logs_the_charge() -> None:
    run = HandlerEnvironment().run(charge, PAYMENT)

    assert run.outcome is not None
    assert run.outcome.value == {"paymentStatus": "success", "transactionId": "txn_o-1"}
    assert run.outcome.extras is not None
    assert [line.message for line in run.outcome.extras.logs] == ["charged 12.50 EUR for order o-1"]


def test_a_declined_card_is_a_business_outcome_priostack_completes_with() -> None:
    run = HandlerEnvironment().run(charge, {**PAYMENT, "cardNumber": DECLINED_CARD})

    assert run.outcome is not None and run.outcome.kind is OutcomeKind.BUSINESS_ERROR
    assert run.wire("priostack") == WireCall("priostack", "complete", {"variables": {
        "paymentStatus": "declined", "declineReason": "card_declined",
        "errorCode": "CARD_DECLINED", "errorMessage": "the card was declined"}})
    assert run.wire("pipelogiq").body is not None
    assert run.wire("pipelogiq").body["retryable"] is False  # type: ignore[index]


def test_charge_refuses_a_payment_that_does_not_match_its_model() -> None:
    run = HandlerEnvironment().run(charge, '{"orderId": "o-1", "amount": -1, "currency": "euro"}')

    assert run.started is False
    assert run.outcome is not None and run.outcome.kind is OutcomeKind.BAD_INPUT
    assert "amount" in (run.outcome.message or "") and "currency" in (run.outcome.message or "")


def test_sleepy_reports_progress_and_finishes_on_fake_time() -> None:
    run = HandlerEnvironment().run(sleepy, {"seconds": 4})

    assert run.outcome is not None and run.outcome.value == {"slept": 4}
    assert run.progress == ({"percent": 25}, {"percent": 50}, {"percent": 75}, {"percent": 100})
    assert run.elapsed == 4


def test_sleepy_stops_at_once_when_its_lease_is_lost() -> None:
    env = HandlerEnvironment()
    env.cancel_after(2.5, CancelReason.LEASE_LOST)

    run = env.run(sleepy, {"seconds": 10})

    assert run.elapsed == 2.5
    assert run.progress == ({"percent": 10}, {"percent": 20})
    assert run.outcome is not None and run.outcome.kind is OutcomeKind.LEASE_LOST
    assert run.abandoned is False


def test_slow_report_renders_one_page_per_slice() -> None:
    checkpoint: Any = None
    slices = 0
    while True:
        run = HandlerEnvironment(checkpoint=checkpoint).run(slow_report, {"pages": 3})
        slices += 1
        if run.continuation is None:
            break
        assert isinstance(run.continuation, Continue)
        checkpoint = run.continuation.checkpoint

    assert slices == 3
    assert run.outcome is not None and run.outcome.value == {"pages": 3, "rows": 300}
