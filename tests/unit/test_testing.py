"""serverless_worker.testing: a handler run on fake time, with the runtime's outcome and each
protocol's wire call for it."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from serverless_worker import BusinessError, CancelReason, Continue, Job, handler
from serverless_worker.model import OutcomeKind
from serverless_worker.registry import HandlerRegistry, default_registry
from serverless_worker.testing import FakeClock, HandlerEnvironment, WireCall


@pytest.fixture(autouse=True)
def registry() -> Iterator[HandlerRegistry]:
    with default_registry.isolated() as reg:
        yield reg


class Order(BaseModel):
    order_id: str
    amount: float


def napper(name: str = "napper") -> Any:
    """A handler that sleeps ``seconds`` in 1 s steps, reporting progress, and stops when cancelled."""

    @handler(name)
    def nap(job: Job[dict[str, Any]]) -> dict[str, Any]:
        slept = 0
        while slept < job.input["seconds"]:
            if job.wait(1):
                job.raise_if_cancelled()
            slept += 1
            job.progress({"slept": slept})
        return {"slept": slept, "remaining": job.remaining()}

    return nap


# -- outcomes and wire calls -------------------------------------------------------------

def test_a_success_is_mapped_as_each_protocol_reports_it() -> None:
    @handler("charge")
    def charge(job: Job[Order]) -> dict[str, Any]:
        job.log("charged")
        return {"id": job.input.order_id}

    run = HandlerEnvironment().run(charge, {"order_id": "o-1", "amount": 5})

    assert run.outcome is not None and run.outcome.kind is OutcomeKind.SUCCESS
    assert run.outcome.value == {"id": "o-1"}
    pipelogiq = run.wire("pipelogiq")
    assert (pipelogiq.call, pipelogiq.body["isSuccess"], pipelogiq.body["result"]) == (  # type: ignore[index]
        "result", True, '{"id":"o-1"}')
    assert [line["message"] for line in pipelogiq.body["logs"]] == ["charged"]  # type: ignore[index]
    assert run.wire("priostack") == WireCall("priostack", "complete", {"variables": {"id": "o-1"}})
    assert run.wire("claimqueue") == WireCall("claimqueue", "result", {"id": "o-1"})


def test_a_business_error_is_mapped_with_its_variables() -> None:
    @handler("decline")
    def decline(job: Job[Any]) -> None:
        raise BusinessError("CARD_DECLINED", "no", {"reason": "funds"})

    wires = HandlerEnvironment().run(decline, {}).wires

    assert wires["pipelogiq"].body is not None
    assert (wires["pipelogiq"].body["errorCode"], wires["pipelogiq"].body["retryable"]) == (
        "BUSINESS_REJECTED", False)
    assert wires["priostack"] == WireCall("priostack", "complete", {"variables": {
        "reason": "funds", "errorCode": "CARD_DECLINED", "errorMessage": "no"}})
    assert wires["claimqueue"] == WireCall("claimqueue", "result", {
        "reason": "funds", "error": "no", "errorCode": "CARD_DECLINED"})


def test_bad_input_never_starts_the_handler() -> None:
    calls: list[Any] = []

    @handler("strict")
    def strict(job: Job[Order]) -> None:
        calls.append(job)

    run = HandlerEnvironment().run(strict, '{"order_id": 1}')

    assert calls == []
    assert run.started is False
    assert run.outcome is not None and run.outcome.kind is OutcomeKind.BAD_INPUT
    assert run.wire("priostack").body == {"retries": 0,
                                          "errorMessage": f"VALIDATION_ERROR: {run.outcome.message}"}


def test_a_failure_uses_one_retry_on_priostack() -> None:
    @handler("boom")
    def boom(job: Job[Any]) -> None:
        raise RuntimeError("disk full")

    run = HandlerEnvironment(retries_left=3).run(boom)

    assert run.outcome is not None and run.outcome.error_code == "RuntimeError"
    expected = {"retries": 2, "errorMessage": "RuntimeError: disk full"}  # the type once
    assert run.wire("priostack") == WireCall("priostack", "fail", expected)
    assert run.wire("claimqueue").body == {"error": "RuntimeError: disk full", "errorCode": "RuntimeError"}


def test_a_continued_slice_has_a_continuation_and_no_wire_call() -> None:
    @handler("pages", mode="slices")
    def pages(job: Job[Any]) -> Any:
        page = (job.checkpoint or 0) + 1
        return Continue(page) if page < 2 else {"pages": page}

    first = HandlerEnvironment().run(pages)
    assert first.outcome is None and first.continuation == Continue(1)
    with pytest.raises(ValueError, match="continued slice"):
        first.wire("pipelogiq")

    assert first.continuation is not None
    last = HandlerEnvironment(checkpoint=first.continuation.checkpoint).run(pages)
    assert last.outcome is not None and last.outcome.value == {"pages": 2}


def test_the_job_carries_the_environments_identity() -> None:
    seen: list[Job[Any]] = []

    @handler("who")
    def who(job: Job[Any]) -> None:
        seen.append(job)

    HandlerEnvironment(job_id="j-7", attempt=3, retries_left=1, protocol="priostack",
                       callback_token="tok").run(who, {"a": 1})

    [job] = seen
    assert (job.job_id, job.attempt, job.retries_left, job.protocol, job.handler, job.callback_token,
            job.input) == ("j-7", 3, 1, "priostack", "who", "tok", {"a": 1})


# -- fake time -----------------------------------------------------------------------------

def test_waiting_moves_fake_time_not_real_time() -> None:
    nap = napper()
    started = time.monotonic()

    run = HandlerEnvironment(budget_seconds=900).run(nap, {"seconds": 600})

    assert time.monotonic() - started < 5
    assert run.elapsed == 600
    assert run.outcome is not None and run.outcome.value == {"slept": 600, "remaining": 300}
    assert len(run.progress) == 600


def test_the_budget_is_capped_by_the_handlers_timeout_and_ends_in_a_timeout() -> None:
    @handler("capped", timeout=5)
    def capped(job: Job[Any]) -> None:
        while not job.wait(1):
            pass
        job.raise_if_cancelled()

    run = HandlerEnvironment(budget_seconds=900).run(capped)

    assert run.elapsed == 5
    assert run.cancelled is CancelReason.TIMEOUT
    assert run.outcome is not None and run.outcome.kind is OutcomeKind.TIMEOUT
    assert run.wire("pipelogiq").body is not None
    assert run.wire("pipelogiq").body["errorCode"] == "HANDLER_TIMEOUT"  # type: ignore[index]
    assert run.wire("claimqueue") == WireCall("claimqueue", "lapse")


def test_the_clock_can_be_advanced_by_the_test_inside_the_handler() -> None:
    clock = FakeClock(start=1000.0)
    seen: list[float] = []

    @handler("ticks")
    def ticks(job: Job[Any]) -> None:
        seen.append(job.remaining())
        clock.advance(30)
        seen.append(job.remaining())

    HandlerEnvironment(clock=clock, budget_seconds=100).run(ticks)

    assert seen == [100, 70]
    assert clock.time() == 1030


def test_fake_clock_fires_callbacks_in_time_order_and_never_goes_back() -> None:
    clock = FakeClock(start=0)
    fired: list[tuple[str, float]] = []
    clock.call_at(5, lambda: fired.append(("b", clock.time())))
    clock.call_at(2, lambda: fired.append(("a", clock.time())))
    clock.call_at(5, lambda: fired.append(("c", clock.time())))

    clock.advance(4)
    assert fired == [("a", 2)]
    clock.advance(10)
    assert fired == [("a", 2), ("b", 5), ("c", 5)]
    assert clock.monotonic() == 14
    with pytest.raises(ValueError):
        clock.advance(-1)


# -- cancellation ----------------------------------------------------------------------------

@pytest.mark.parametrize(("reason", "kind", "call"), [
    (CancelReason.LEASE_LOST, OutcomeKind.LEASE_LOST, "discard"),
    (CancelReason.SHUTDOWN, OutcomeKind.NOT_STARTED, "hand_back"),
    (CancelReason.TIMEOUT, OutcomeKind.TIMEOUT, "fail"),
])
def test_cancel_after_fake_seconds_stops_the_handler_there(reason: CancelReason, kind: OutcomeKind,
                                                           call: str) -> None:
    env = HandlerEnvironment()
    env.cancel_after(2.5, reason)

    run = env.run(napper(), {"seconds": 10})

    assert run.elapsed == 2.5
    assert run.progress == ({"slept": 1}, {"slept": 2})
    assert run.cancelled is reason
    assert run.outcome is not None and run.outcome.kind is kind
    assert run.abandoned is False
    assert run.wire("priostack").call == call


def test_cancel_from_the_progress_hook_cancels_at_that_point() -> None:
    env = HandlerEnvironment()
    env.on_progress = lambda update: env.cancel(CancelReason.LEASE_LOST) if update["slept"] == 3 else None

    run = env.run(napper(), {"seconds": 10})

    assert run.progress == ({"slept": 1}, {"slept": 2}, {"slept": 3})
    assert run.outcome is not None and run.outcome.kind is OutcomeKind.LEASE_LOST
    assert run.wire("pipelogiq") == WireCall("pipelogiq", "discard")


def test_a_handler_that_swallows_the_cancellation_still_gets_the_cancel_outcome() -> None:
    @handler("stubborn")
    def stubborn(job: Job[Any]) -> str:
        job.wait(100)
        return "finished anyway"

    env = HandlerEnvironment()
    env.cancel_after(1, CancelReason.LEASE_LOST)
    run = env.run(stubborn)

    assert run.outcome is not None and run.outcome.kind is OutcomeKind.LEASE_LOST


def test_a_handler_that_sleeps_through_the_grace_is_abandoned() -> None:
    @handler("deaf")
    def deaf(job: Job[Any]) -> None:
        while True:
            job.wait(1)  # ignores what wait says

    env = HandlerEnvironment(grace_seconds=3)
    env.cancel_after(1, CancelReason.SHUTDOWN)
    run = env.run(deaf)

    assert run.abandoned is True
    assert run.outcome is not None and run.outcome.kind is OutcomeKind.NOT_STARTED
    assert "did not stop within 3s" in (run.outcome.message or "")


def test_cancel_before_the_run_means_not_started_and_the_next_run_starts_clean() -> None:
    nap = napper()
    env = HandlerEnvironment()
    env.cancel(CancelReason.SHUTDOWN)

    first = env.run(nap, {"seconds": 1})
    second = env.run(nap, {"seconds": 1})

    assert first.started is False
    assert first.outcome is not None and first.outcome.error_code == "SHUTDOWN"
    assert first.wire("claimqueue") == WireCall("claimqueue", "hand_back")
    assert second.outcome is not None and second.outcome.kind is OutcomeKind.SUCCESS


# -- targets ---------------------------------------------------------------------------------

def test_a_handler_is_found_by_spec_or_by_registered_name() -> None:
    nap = napper("by-name")

    by_name = HandlerEnvironment().run("by-name", {"seconds": 1})
    by_spec = HandlerEnvironment().run(default_registry.get("by-name"), {"seconds": 1})

    assert by_name.outcome == by_spec.outcome == HandlerEnvironment().run(nap, {"seconds": 1}).outcome


def test_an_undecorated_function_is_refused() -> None:
    def plain(job: Job[Any]) -> None:
        return None

    with pytest.raises(TypeError, match=r"decorate it with @handler"):
        HandlerEnvironment().run(plain)


def test_the_module_imports_no_sandbox_no_moto_and_no_local_runner() -> None:
    code = ("import sys, serverless_worker.testing; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('moto', 'uvicorn', 'starlette') "
            "or m.startswith(('serverless_worker.sandbox', 'serverless_worker.local', 'serverless_worker.cli'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout

    assert loaded.strip() == "[]"
