"""run_handler: decoding, the time budget, cancellation, and each outcome mapping."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import BaseModel, Field

from serverless_worker import BusinessError, Continue, Job, Result
from serverless_worker.handler_runner import MAX_MESSAGE_BYTES, CancelSignal, RunResult, run_handler
from serverless_worker.job_control import cancel_job
from serverless_worker.model import Delivery, OutcomeKind
from serverless_worker.registry import HandlerSpec
from support.waiting import HANG_SECONDS

SECRET = "4111-1111-SECRET-VALUE"
BUDGET = 0.2
GRACE = 0.2


class Order(BaseModel):
    order_id: str
    amount: float = Field(gt=0)
    card: str = Field(min_length=30)


def spec_for(fn: Callable[[Job[Any]], Any], **options: Any) -> HandlerSpec:
    return HandlerSpec(name=options.pop("name", "h"), fn=fn, **options)


def delivery(payload: Any = None, **fields: Any) -> Delivery:
    base: dict[str, Any] = {"protocol": "priostack", "handler": "h", "job_id": "job-1", "ledger_id": "led-1",
                            "attempt": 2, "retries_left": 3, "payload": payload}
    return Delivery(**{**base, **fields})


def run(fn: Callable[[Job[Any]], Any], payload: Any = None, *, budget: float = 5.0,
        spec_options: dict[str, Any] | None = None, **kwargs: Any) -> RunResult:
    return run_handler(spec_for(fn, **(spec_options or {})), delivery(payload), budget_seconds=budget,
                       grace_seconds=kwargs.pop("grace_seconds", GRACE), **kwargs)


class Recorder:
    """A handler that records the job it was given and returns ``value``."""

    def __init__(self, value: Any = None) -> None:
        self.value = value
        self.job: Job[Any] | None = None

    def __call__(self, job: Job[Any]) -> Any:
        self.job = job
        return self.value


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Lets an uncooperative handler thread finish when the test ends."""
    event = threading.Event()
    yield event
    event.set()


# -- decoding the payload ------------------------------------------------------------

@pytest.mark.parametrize(("payload", "expected"), [
    ('{"a": 1}', {"a": 1}),          # Pipelogiq stage input arrives as a JSON string
    ("[1, 2]", [1, 2]),
    ("plain text", "plain text"),   # not JSON: kept as the string it is
    ("", ""),
    ({"a": 1}, {"a": 1}),
    (b'{"b": 2}', {"b": 2}),
    (None, None),
])
def test_payload_without_model_is_decoded_when_it_is_json(payload: Any, expected: Any) -> None:
    handler = Recorder()
    result = run(handler, payload)

    assert result.outcome is not None and result.outcome.kind is OutcomeKind.SUCCESS
    assert handler.job is not None
    assert handler.job.input == expected
    assert handler.job.raw_payload == payload


@pytest.mark.parametrize("payload", [
    {"order_id": "o-1", "amount": 5, "card": "x" * 30},
    '{"order_id": "o-1", "amount": 5, "card": "' + "x" * 30 + '"}',
])
def test_payload_is_validated_against_the_input_model(payload: Any) -> None:
    handler = Recorder()
    result = run(handler, payload, spec_options={"input_model": Order})

    assert result.outcome is not None and result.outcome.kind is OutcomeKind.SUCCESS
    assert handler.job is not None
    assert handler.job.input == Order(order_id="o-1", amount=5, card="x" * 30)


@pytest.mark.parametrize("payload", [
    {"amount": -5, "card": SECRET},
    '{"amount": -5, "card": "' + SECRET + '"}',
])
def test_bad_input_names_each_field_without_echoing_values(payload: Any) -> None:
    handler = Recorder()
    result = run(handler, payload, spec_options={"input_model": Order})

    outcome = result.outcome
    assert outcome is not None
    assert outcome.kind is OutcomeKind.BAD_INPUT
    assert outcome.error_code == "VALIDATION_ERROR"
    assert outcome.message is not None
    assert outcome.message.startswith("payload does not match Order: ")
    assert "order_id: Field required" in outcome.message
    assert "amount: Input should be greater than 0" in outcome.message
    assert "card: String should have at least 30 characters" in outcome.message
    assert SECRET not in outcome.message
    assert "-5" not in outcome.message
    assert "errors.pydantic.dev" not in outcome.message
    assert result.started is False
    assert handler.job is None


def test_a_string_payload_that_is_not_json_is_bad_input_for_a_model() -> None:
    result = run(Recorder(), "card=" + SECRET, spec_options={"input_model": Order})

    assert result.outcome is not None and result.outcome.kind is OutcomeKind.BAD_INPUT
    assert "(payload): Invalid JSON" in (result.outcome.message or "")
    assert SECRET not in (result.outcome.message or "")


def test_an_invalid_envelope_is_bad_input_and_the_handler_is_not_called() -> None:
    handler = Recorder()
    invalid = delivery({"a": 1}, invalid="job key is not a string")
    # a ledger record written before ``invalid`` was a field carried it in ``wire``
    recorded_before = {**delivery({"a": 1}).to_record(), "wire": {"queue": "q", "invalid": "no type"}}
    assert "invalid" not in delivery({"a": 1}).to_record()  # an empty one stays out of the ledger
    cases = ((invalid, "invalid delivery: job key is not a string"),
             (Delivery.from_record(invalid.to_record()), "invalid delivery: job key is not a string"),
             (Delivery.from_record(recorded_before), "invalid delivery: no type"))
    for given, message in cases:
        result = run_handler(spec_for(handler), given, budget_seconds=1)
        assert result.outcome is not None
        assert (result.outcome.kind, result.outcome.message) == (OutcomeKind.BAD_INPUT, message)
        assert result.started is False
    assert Delivery.from_record(recorded_before).wire == {"queue": "q"}
    assert handler.job is None


def test_non_utf8_bytes_are_bad_input() -> None:
    result = run(Recorder(), b"\xff\xfe")
    assert result.outcome is not None and result.outcome.kind is OutcomeKind.BAD_INPUT


@pytest.mark.parametrize("options", [{}, {"input_model": Order}], ids=["no model", "a model"])
def test_a_string_payload_nested_past_the_json_decoder_is_bad_input(options: dict[str, Any]) -> None:
    # A Pipelogiq stage input is a string: JSON nested 100,000 deep is not a crash of the run
    handler = Recorder()
    result = run(handler, "[" * 100_000 + "]" * 100_000, spec_options=options)

    assert result.outcome is not None and result.outcome.kind is OutcomeKind.BAD_INPUT, result.outcome
    message = result.outcome.message or ""
    assert result.outcome.error_code == "VALIDATION_ERROR" and ("too deep" in message or "recursion" in message)
    assert handler.job is None


# -- what the job carries -------------------------------------------------------------

def test_the_job_carries_ids_budget_checkpoint_token_and_progress() -> None:
    seen: list[Any] = []
    handler = Recorder()
    before = time.time()

    run_handler(spec_for(handler, name="payment-processor"), delivery({"a": 1}), budget_seconds=30,
                progress=seen.append, checkpoint={"page": 3}, callback_token="task-token")

    job = handler.job
    assert job is not None
    assert (job.job_id, job.ledger_id, job.protocol, job.handler) == ("job-1", "led-1", "priostack",
                                                                     "payment-processor")
    assert (job.attempt, job.retries_left) == (2, 3)
    assert (job.checkpoint, job.callback_token) == ({"page": 3}, "task-token")
    assert before + 30 <= (job.deadline or 0) <= time.time() + 30
    cancel_job(job, "shutdown")  # the run is over; cancelling now only stops further progress
    assert job.progress({"percent": 1}) is False
    assert seen == []


def test_progress_reaches_the_reporter_during_the_run() -> None:
    seen: list[Any] = []
    run(lambda job: job.progress({"percent": 50}), progress=seen.append)
    assert seen == [{"percent": 50}]


# -- success -----------------------------------------------------------------------

class Receipt(BaseModel):
    charged_at: datetime
    amount: float


@pytest.mark.parametrize(("value", "expected"), [
    ({"ok": True}, {"ok": True}),
    ([1, "a", None], [1, "a", None]),
    ("done", "done"),
    (3.5, 3.5),
    (False, False),
    (None, None),
    (Receipt(charged_at=datetime(2025, 1, 1, tzinfo=UTC), amount=2),
     {"charged_at": "2025-01-01T00:00:00Z", "amount": 2.0}),
])
def test_a_returned_value_is_success_with_the_value_normalized(value: Any, expected: Any) -> None:
    result = run(lambda job: value)

    assert result.outcome is not None
    assert result.outcome.kind is OutcomeKind.SUCCESS
    assert result.outcome.value == expected
    assert result.outcome.extras is None
    assert result.started is True
    assert result.continuation is None
    assert result.duration >= 0


def test_job_log_lines_travel_with_the_outcome() -> None:
    def fn(job: Job[Any]) -> str:
        job.log("one")
        return "ok"

    result = run(fn)
    assert result.outcome is not None and result.outcome.extras is not None
    assert [line.message for line in result.outcome.extras.logs] == ["one"]


def test_a_result_carries_its_extras_after_the_job_logs() -> None:
    def fn(job: Job[Any]) -> Result:
        job.log("from job.log")
        return Result({"id": 7}, logs=["from Result"], context={"k": "v"}, delete_context=["old"],
                      append_stages=[{"stageName": "s", "stageHandlerName": "h"}], wait_for_approval=True)

    outcome = run(fn).outcome

    assert outcome is not None and outcome.kind is OutcomeKind.SUCCESS
    assert outcome.value == {"id": 7}
    extras = outcome.extras
    assert extras is not None
    assert [line.message for line in extras.logs] == ["from job.log", "from Result"]
    assert [(c.key, c.value, c.isDeleted) for c in extras.context] == [("k", "v", None), ("old", None, True)]
    assert [s.stageName for s in extras.appended_stages] == ["s"]
    assert extras.wait_for_approval is True


def test_a_result_with_malformed_extras_is_a_failure() -> None:
    outcome = run(lambda job: Result(1, append_stages=[{"stageName": "no handler name"}])).outcome

    assert outcome is not None and outcome.kind is OutcomeKind.FAILURE
    assert outcome.error_code == "INVALID_RESULT"
    assert "stageHandlerName: Field required" in (outcome.message or "")


# -- continuation ------------------------------------------------------------------------

def test_continue_from_a_long_running_handler_is_a_continuation() -> None:
    def fn(job: Job[Any]) -> Continue:
        job.log("slice done")
        return Continue({"page": (job.checkpoint or {"page": 0})["page"] + 1,
                         "at": datetime(2025, 1, 1, tzinfo=UTC)}, delay_seconds=5)

    result = run(fn, checkpoint={"page": 1}, spec_options={"mode": "slices"})

    assert result.outcome is None
    assert result.continuation == Continue({"page": 2, "at": "2025-01-01T00:00:00Z"}, delay_seconds=5)
    assert [line.message for line in result.logs] == ["slice done"]
    assert result.started is True


def test_continue_from_a_short_handler_is_a_failure_that_says_why() -> None:
    result = run(lambda job: Continue({"page": 1}))

    assert result.continuation is None
    outcome = result.outcome
    assert outcome is not None and outcome.kind is OutcomeKind.FAILURE
    assert outcome.error_code == "INVALID_RESULT"
    assert "declared mode='short'" in (outcome.message or "")
    assert 'mode="slices"' in (outcome.message or "")


def test_continue_with_a_checkpoint_that_cannot_be_stored_is_a_failure() -> None:
    outcome = run(lambda job: Continue(object()), spec_options={"mode": "slices"}).outcome

    assert outcome is not None and outcome.kind is OutcomeKind.FAILURE
    assert "checkpoint that is not JSON-serializable: object" in (outcome.message or "")


# -- business errors and failures ---------------------------------------------------------

def test_business_error_is_a_business_outcome_with_its_variables() -> None:
    def fn(job: Job[Any]) -> None:
        raise BusinessError("CARD_DECLINED", "insufficient funds", {"declineReason": "funds"})

    outcome = run(fn).outcome

    assert outcome is not None
    assert (outcome.kind, outcome.error_code, outcome.message, outcome.value) == (
        OutcomeKind.BUSINESS_ERROR, "CARD_DECLINED", "insufficient funds", {"declineReason": "funds"})


def test_business_error_variables_that_are_not_json_are_a_failure() -> None:
    def fn(job: Job[Any]) -> None:
        raise BusinessError("X", "y", {"bad": object()})

    outcome = run(fn).outcome
    assert outcome is not None and outcome.kind is OutcomeKind.FAILURE
    assert outcome.error_code == "INVALID_RESULT" and not outcome.retryable
    assert "BusinessError whose variables are not JSON-serializable: dict" in (outcome.message or "")
    assert (outcome.message or "").startswith("handler 'h' (job job-1) ")


def test_an_exception_is_a_failure_named_after_its_class_and_logged_with_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    def fn(job: Job[Any]) -> None:
        job.log("about to fail")
        raise ValueError("gateway said no")

    with caplog.at_level(logging.ERROR, logger="serverless_worker.handler_runner"):
        outcome = run(fn).outcome

    assert outcome is not None
    assert (outcome.kind, outcome.error_code, outcome.message) == (
        OutcomeKind.FAILURE, "ValueError", "ValueError: gateway said no")
    assert outcome.extras is not None and outcome.extras.logs[0].message == "about to fail"
    [record] = [r for r in caplog.records if r.name == "serverless_worker.handler_runner"]
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None and record.exc_info[0] is ValueError
    assert (record.job_id, record.handler) == ("job-1", "h")  # type: ignore[attr-defined]


def test_a_long_failure_message_is_cut_to_4_kib() -> None:
    def fn(job: Job[Any]) -> None:
        raise RuntimeError("é" * 10_000)

    outcome = run(fn).outcome
    assert outcome is not None and outcome.message is not None
    assert outcome.message.startswith("RuntimeError: éé")
    assert len(outcome.message.encode()) <= MAX_MESSAGE_BYTES


def test_a_validation_error_inside_the_handler_is_the_handlers_bug_not_bad_input() -> None:
    def fn(job: Job[Any]) -> None:
        Order(order_id="o", amount=-1, card=SECRET)

    outcome = run(fn).outcome

    assert outcome is not None
    assert outcome.kind is OutcomeKind.FAILURE
    assert outcome.error_code == "ValidationError"
    assert "a bug in the handler, not bad input" in (outcome.message or "")
    assert "amount: Input should be greater than 0" in (outcome.message or "")
    assert SECRET not in (outcome.message or "")


@pytest.mark.parametrize(("value", "type_name"), [(object(), "object"), ({"x": [object()]}, "dict"),
                                                  ({"x": {1, object()}}, "set at the value['x']"),
                                                  (math.inf, "float")])
def test_a_value_that_is_not_json_is_a_failure(value: Any, type_name: str) -> None:
    outcome = run(lambda job: value).outcome

    assert outcome is not None
    assert outcome.kind is OutcomeKind.FAILURE
    # deterministic: it names the handler, the job and the offending type, and is not retried
    assert outcome.error_code == "INVALID_RESULT" and not outcome.retryable
    assert (outcome.message or "").startswith(
        f"handler 'h' (job job-1) returned a value that is not JSON-serializable: {type_name}")


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_base_exceptions_propagate(exc: type[BaseException]) -> None:
    def fn(job: Job[Any]) -> None:
        raise exc()

    with pytest.raises(exc):
        run(fn)


def test_async_handlers_run_to_an_outcome() -> None:
    async def fn(job: Job[Any]) -> dict[str, Any]:
        return {"doubled": job.input["n"] * 2}

    outcome = run(fn, {"n": 4}).outcome
    assert outcome is not None and outcome.value == {"doubled": 8}


# -- time budget ---------------------------------------------------------------------

def test_a_cooperative_handler_is_stopped_at_the_budget_and_times_out() -> None:
    seen: dict[str, Any] = {}

    def fn(job: Job[Any]) -> str:
        seen["woke_cancelled"] = job.wait(30)
        seen["reason"] = job.cancel_reason
        job.raise_if_cancelled()
        return "never reported"

    started = time.monotonic()
    result = run(fn, budget=BUDGET)
    elapsed = time.monotonic() - started

    outcome = result.outcome
    assert outcome is not None
    assert outcome.kind is OutcomeKind.TIMEOUT
    assert outcome.error_code == "HANDLER_TIMEOUT"
    assert "ran past its time budget of 0.2s" in (outcome.message or "")
    assert "abandoned" not in (outcome.message or "")
    assert seen == {"woke_cancelled": True, "reason": "timeout"}
    assert BUDGET <= elapsed < 10  # stopped by the budget, not by the handler's 30 s wait
    assert result.started is True
    assert result.abandoned is False


def test_an_uncooperative_handler_is_abandoned_after_the_grace(release: threading.Event) -> None:
    after: list[str] = []

    def fn(job: Job[Any]) -> None:
        release.wait(HANG_SECONDS)  # ignores job.cancelled, until the test ends
        after.append("finished late")

    started = time.monotonic()
    result = run(fn, budget=BUDGET, grace_seconds=0.1)
    elapsed = time.monotonic() - started

    outcome = result.outcome
    assert result.abandoned is True
    assert outcome is not None
    assert outcome.kind is OutcomeKind.TIMEOUT
    assert "did not stop within 0.1s and its thread was abandoned" in (outcome.message or "")
    assert BUDGET + 0.1 <= elapsed < 15  # abandoned after the grace, not when the handler returns
    assert after == []


def test_the_handlers_own_timeout_caps_the_budget() -> None:
    started = time.monotonic()
    outcome = run(lambda job: job.wait(30), budget=30, spec_options={"timeout": BUDGET}).outcome

    assert outcome is not None and outcome.kind is OutcomeKind.TIMEOUT
    assert time.monotonic() - started < 15  # the handler's 0.2 s timeout, not the 30 s budget


@pytest.mark.parametrize("budget", [0, -1, math.nan])
def test_no_budget_means_the_handler_is_not_started(budget: float) -> None:
    handler = Recorder()
    result = run(handler, budget=budget)

    assert result.outcome is not None and result.outcome.kind is OutcomeKind.NOT_STARTED
    assert result.started is False
    assert handler.job is None


def test_an_unlimited_budget_runs_to_completion() -> None:
    outcome = run(lambda job: job.remaining() == math.inf, budget=math.inf).outcome
    assert outcome is not None and (outcome.kind, outcome.value) == (OutcomeKind.SUCCESS, True)


def test_a_handler_that_finishes_in_time_is_not_affected_by_the_budget() -> None:
    outcome = run(lambda job: job.wait(0.01), budget=BUDGET).outcome
    assert outcome is not None and (outcome.kind, outcome.value) == (OutcomeKind.SUCCESS, False)


# -- external cancellation -------------------------------------------------------------

@pytest.mark.parametrize(("reason", "kind", "code"), [
    ("lease_lost", OutcomeKind.LEASE_LOST, "LEASE_LOST"),
    ("shutdown", OutcomeKind.NOT_STARTED, "SHUTDOWN"),
])
def test_external_cancellation_stops_the_handler_with_its_reason(reason: str, kind: OutcomeKind,
                                                                 code: str) -> None:
    signal = CancelSignal()
    seen: list[Any] = []

    def fn(job: Job[Any]) -> None:
        threading.Timer(0.05, signal.cancel, args=(reason,)).start()
        seen.append(job.wait(30))
        seen.append(job.cancel_reason)
        job.raise_if_cancelled()

    started = time.monotonic()
    result = run(fn, budget=30, cancel_event=signal)

    outcome = result.outcome
    assert outcome is not None
    assert (outcome.kind, outcome.error_code) == (kind, code)
    assert seen == [True, reason]
    assert result.started is True
    assert time.monotonic() - started < 15  # the cancel, not the 30 s wait


def test_a_plain_event_reads_as_lease_lost(release: threading.Event) -> None:
    event = threading.Event()

    def fn(job: Job[Any]) -> None:
        event.set()
        release.wait(HANG_SECONDS)

    outcome = run(fn, budget=30, cancel_event=event, grace_seconds=0.05).outcome

    assert outcome is not None and outcome.kind is OutcomeKind.LEASE_LOST
    assert "abandoned" in (outcome.message or "")


def test_a_cancel_signal_set_before_the_start_means_not_started() -> None:
    signal = CancelSignal()
    signal.cancel("shutdown")
    handler = Recorder()

    result = run(handler, cancel_event=signal)

    assert result.outcome is not None and result.outcome.kind is OutcomeKind.NOT_STARTED
    assert result.started is False
    assert handler.job is None


def test_a_handler_raising_job_cancelled_itself_maps_to_that_reason() -> None:
    def fn(job: Job[Any]) -> None:
        cancel_job(job, "shutdown")
        job.raise_if_cancelled()

    outcome = run(fn).outcome
    assert outcome is not None and outcome.kind is OutcomeKind.NOT_STARTED


# -- the watcher's own failures --------------------------------------------------------

class FailingClock:
    """Real time until ``fail_with`` is set; then ``monotonic()`` raises it."""

    def __init__(self) -> None:
        self.fail_with: BaseException | None = None

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        if self.fail_with is not None:
            raise self.fail_with
        return time.monotonic()


@pytest.mark.parametrize("error", [RuntimeError("clock broke"), KeyboardInterrupt()])
def test_a_failing_watcher_is_not_swallowed_and_the_handler_is_told_to_stop(error: BaseException) -> None:
    clock = FailingClock()
    stopped = threading.Event()
    seen: list[Any] = []

    def fn(job: Job[Any]) -> None:
        clock.fail_with = error
        seen.append(job.wait(HANG_SECONDS))  # woken by the runner, however late on a loaded machine
        seen.append(job.cancel_reason)
        stopped.set()

    with pytest.raises(type(error)):
        run(fn, budget=30, cancel_event=CancelSignal(), clock=clock)

    assert stopped.wait(HANG_SECONDS)
    assert seen == [True, "shutdown"]


@pytest.mark.parametrize(("value", "where"), [
    ({"tags": {"a", "b"}}, "set at the value['tags']"),
    ([1, [frozenset({2})]], "frozenset at the value[1][0]"),
    ({"user@example.com": {3}}, "set at the value[...]"),   # a key that is content is not quoted
])
def test_a_set_is_refused_naming_where_it_is_never_silently_a_list(value: Any, where: str) -> None:
    outcome = run(lambda job: value).outcome

    assert outcome is not None
    assert outcome.error_code == "INVALID_RESULT" and not outcome.retryable
    assert f"not JSON-serializable: {where}: a set has no order" in (outcome.message or "")
    assert "user@example.com" not in (outcome.message or "")


def test_datetimes_decimals_and_uuids_are_sent_as_documented_strings() -> None:
    import datetime as dt
    import uuid
    from decimal import Decimal

    when = dt.datetime(2026, 12, 5, 23, 48, 32, tzinfo=dt.UTC)
    ident = uuid.UUID(int=7)
    outcome = run(lambda job: {"at": when, "day": when.date(), "price": Decimal("9.99"), "id": ident,
                               "pair": (1, 2)}).outcome

    # docs/outcomes.md, "What a handler may return": ISO 8601, exact decimal strings, lists
    assert outcome is not None and outcome.kind is OutcomeKind.SUCCESS
    assert outcome.value == {"at": "2026-12-05T23:48:32Z", "day": "2026-12-05", "price": "9.99",
                             "id": str(ident), "pair": [1, 2]}
