"""Run a handler in a unit test the way the runtime runs it, on fake time, without servers.

:class:`HandlerEnvironment` is shaped like Temporal's ``ActivityEnvironment``: set up
the job's identity, hook progress reports, schedule a cancellation, then :meth:`~HandlerEnvironment.run`
a handler on a payload. The run is synchronous and deterministic: time is a
:class:`FakeClock` that moves only when ``job.wait(seconds)`` sleeps or a test calls
``clock.advance()``, so a handler that waits an hour finishes at once. What comes back
is the :class:`~serverless_worker.model.Outcome` the runtime would store, mapped by the
runtime's own code (``handler_runner``), and the call each protocol client would make for
it (:meth:`HandlerRun.wire`), built by the clients' own mapping functions.

Pure library (no sandbox, no moto, no network), so it ships in the layer.

Example::

    from serverless_worker import CancelReason
    from serverless_worker.testing import HandlerEnvironment

    env = HandlerEnvironment(retries_left=3)
    run = env.run(charge, {"orderId": "o-1", "amount": 5, "currency": "EUR"})
    assert run.outcome.kind == "success"
    assert run.wire("priostack").call == "complete"

    env = HandlerEnvironment()
    env.cancel_after(2.5, CancelReason.LEASE_LOST)   # 2.5 s of fake time into the run
    run = env.run(sleepy, {"seconds": 10})
    assert run.outcome.kind == "lease_lost" and run.progress == [{"percent": 10}, {"percent": 20}]

Unlike the runtime, a handler that ignores cancellation is not left running in a thread:
once it has slept through ``grace_seconds`` of ``job.wait`` after the cancellation, its
stack is unwound and the run is ``abandoned``. A handler that spins without ever calling
``job.wait`` or ``job.raise_if_cancelled`` cannot be stopped on fake time.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import inspect
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from .handler_runner import (
    RunResult,
    cancelled_outcome,
    finished_result,
    handler_budget,
    start_or_refuse,
)
from .job import CancelReason, Job
from .job_control import cancel_job, runtime_job
from .model import Delivery, Outcome, OutcomeKind, ResultLog
from .protocols import claimqueue, pipelogiq, priostack
from .registry import SPEC_ATTRIBUTE, HandlerSpec, default_registry
from .results import Continue

__all__ = ["PROTOCOLS", "FakeClock", "HandlerEnvironment", "HandlerRun", "WireCall", "WireProtocol"]

WireProtocol = Literal["pipelogiq", "priostack", "claimqueue"]
PROTOCOLS: tuple[WireProtocol, ...] = ("pipelogiq", "priostack", "claimqueue")

# The Pipelogiq delivery fields a result names; any values do for a test.
_PIPELOGIQ_WIRE = {"pipelineId": 1, "stageId": 1, "executionId": "test-execution"}


class FakeClock:
    """Wall and monotonic time that move together, only when :meth:`advance` is called.

    Callbacks scheduled with :meth:`call_at` fire, in time order, as time passes them.
    """

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = float(start)
        self._alarms: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()  # ties fire in the order they were scheduled
        self._lock = threading.Lock()

    def time(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._now

    def call_at(self, when: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` once time reaches ``when`` (at once if it already has)."""
        with self._lock:
            heapq.heappush(self._alarms, (when, next(self._order), callback))
        if when <= self._now:
            self.advance(0)

    def advance(self, seconds: float, *, until: threading.Event | None = None) -> bool:
        """Move time on by ``seconds``, firing due callbacks; stop early once ``until`` is set.

        Returns whether ``until`` was set (always False without it).
        """
        if seconds < 0:
            raise ValueError("a clock cannot go back")
        end = self._now + seconds
        while True:
            with self._lock:
                due = self._alarms[0][0] <= end if self._alarms else False
                when, _, callback = heapq.heappop(self._alarms) if due else (end, 0, None)
            self._now = max(self._now, when)
            if callback is None:
                return until is not None and until.is_set()
            callback()
            if until is not None and until.is_set():
                return True


@dataclass(frozen=True)
class WireCall:
    """What a protocol client does with an outcome: the call and its JSON body.

    ``call`` is ``result`` (Pipelogiq ``POST /stages/{id}/result``, claim queue
    ``POST /{queue}/items/{id}/result``), ``complete`` or ``fail`` (Priostack), or one of
    the calls that carry no outcome: ``hand_back`` (never started), ``discard`` (lease lost)
    and ``lapse`` (nothing is sent; the lease runs out). ``body`` is None for those.
    """

    protocol: WireProtocol
    call: str
    body: dict[str, Any] | None = None


@dataclass(frozen=True)
class HandlerRun:
    """What one :meth:`HandlerEnvironment.run` came to.

    Exactly one of ``outcome`` and ``continuation`` is set, as in the runtime: a
    ``mode="slices"`` handler that returned :class:`Continue` has no outcome yet.
    ``progress`` holds the values the handler reported, ``cancelled`` the reason the
    environment cancelled it with (None when it was not), ``elapsed`` the fake seconds the
    run took.
    """

    outcome: Outcome | None
    continuation: Continue | None
    started: bool
    abandoned: bool
    logs: tuple[ResultLog, ...]
    progress: tuple[Any, ...]
    cancelled: CancelReason | None
    elapsed: float
    delivery: Delivery = field(repr=False)

    def wire(self, protocol: WireProtocol) -> WireCall:
        """The call ``protocol``'s client makes for this outcome (docs/outcomes.md)."""
        if self.outcome is None:
            raise ValueError("a continued slice has no outcome yet: run the next slice with "
                             "HandlerEnvironment(checkpoint=run.continuation.checkpoint)")
        return wire_call(protocol, self.delivery, self.outcome)

    @property
    def wires(self) -> dict[WireProtocol, WireCall]:
        """:meth:`wire` for every protocol."""
        return {protocol: self.wire(protocol) for protocol in PROTOCOLS}


def wire_call(protocol: WireProtocol, delivery: Delivery, outcome: Outcome) -> WireCall:
    """Map ``outcome`` with the protocol client's own pure mapping function."""
    if outcome.kind is OutcomeKind.NOT_STARTED:  # runtime/settle.py hands it back on every protocol
        return WireCall(protocol, "hand_back")
    if outcome.kind is OutcomeKind.LEASE_LOST:  # ... and discards it
        return WireCall(protocol, "discard")
    if protocol == "pipelogiq":
        return WireCall(protocol, "result", pipelogiq._result_request(delivery, outcome).wire())
    if protocol == "priostack":
        call, body = priostack.settle_request(delivery, outcome)
        return WireCall(protocol, call, body)
    if protocol == "claimqueue":
        if outcome.kind is OutcomeKind.TIMEOUT:  # ClaimQueueClient.report sends nothing
            return WireCall(protocol, "lapse")
        return WireCall(protocol, "result", claimqueue.result_record(outcome))
    raise ValueError(f"unknown protocol {protocol!r}; use one of {', '.join(PROTOCOLS)}")


class _Abandoned(BaseException):
    """Unwinds a handler that kept sleeping through its grace after a cancellation.

    A BaseException so that the handler's own ``except Exception`` does not swallow it.
    """


class HandlerEnvironment:
    """The runtime around one handler run, on fake time.

    ``budget_seconds`` is what the runtime grants (capped by the handler's ``timeout``);
    ``grace_seconds`` how long a cancelled handler may take to stop. ``on_progress`` sees
    each ``job.progress`` value as it is reported (call :meth:`cancel` from it to cancel
    at that point, as with Temporal's heartbeat hook). The identity fields become the
    job's and the delivery's.
    """

    def __init__(
        self,
        *,
        budget_seconds: float = 900.0,
        grace_seconds: float = 2.0,
        clock: FakeClock | None = None,
        on_progress: Callable[[Any], None] | None = None,
        job_id: str = "test-job",
        attempt: int = 1,
        retries_left: int | None = 3,
        protocol: str = "test",
        checkpoint: Any = None,
        callback_token: str | None = None,
    ) -> None:
        self.clock = clock if clock is not None else FakeClock()
        self.budget_seconds = budget_seconds
        self.grace_seconds = grace_seconds
        self.on_progress = on_progress
        self.job_id, self.attempt, self.retries_left, self.protocol = job_id, attempt, retries_left, protocol
        self.checkpoint, self.callback_token = checkpoint, callback_token
        self._cancel_reason: CancelReason | None = None
        self._scheduled: list[tuple[float, CancelReason]] = []
        self._job: Job[Any] | None = None

    # -- cancellation ----------------------------------------------------------------
    def cancel(self, reason: CancelReason | str = CancelReason.SHUTDOWN) -> None:
        """Cancel now: before :meth:`run` the handler never starts; during it (from a
        handler's closure or ``on_progress``) the runtime's cancellation happens there."""
        if self._cancel_reason is None:
            self._cancel_reason = CancelReason(reason)
        if self._job is not None:
            cancel_job(self._job, self._cancel_reason)

    def cancel_after(self, seconds: float, reason: CancelReason | str = CancelReason.LEASE_LOST) -> None:
        """Cancel ``seconds`` of fake time after the run starts."""
        self._scheduled.append((seconds, CancelReason(reason)))

    # -- running -------------------------------------------------------------------------
    def run(self, target: HandlerSpec | Callable[..., Any] | str, payload: Any = None) -> HandlerRun:
        """Run the handler (a decorated function, its spec or its registered name) on ``payload``
        (a dict, a model dump, or a JSON string as Pipelogiq sends it)."""
        try:
            return self._run(_spec_of(target), payload)
        finally:  # a cancellation belongs to one run; the next starts clean
            self._job, self._cancel_reason = None, None

    def _run(self, spec: HandlerSpec, payload: Any) -> HandlerRun:
        delivery = Delivery(protocol=self.protocol, handler=spec.name, job_id=self.job_id,
                            ledger_id=f"{self.job_id}:{self.attempt}", attempt=self.attempt,
                            retries_left=self.retries_left, payload=payload, wire=dict(_PIPELOGIQ_WIRE))
        started_at = self.clock.monotonic()
        progress: list[Any] = []

        def done(outcome: Outcome | None, *, started: bool, continuation: Continue | None = None,
                 logs: tuple[ResultLog, ...] = (), abandoned: bool = False) -> HandlerRun:
            return HandlerRun(outcome, continuation, started, abandoned, logs, tuple(progress),
                              self._cancel_reason, self.clock.monotonic() - started_at, delivery)

        budget = handler_budget(spec, self.budget_seconds)
        value, refusal = start_or_refuse(spec, delivery, budget, self._cancel_reason)
        if refusal is not None:
            return done(refusal, started=False)

        def report(update: Any) -> None:
            progress.append(update)
            if self.on_progress is not None:
                self.on_progress(update)

        grace_used = 0.0

        def wait(event: threading.Event, seconds: float) -> bool:
            nonlocal grace_used
            if event.is_set():  # cancelled: a cooperative handler stops; one that sleeps on uses grace
                grace_used += seconds
                if self._cancel_reason is not None and grace_used > self.grace_seconds:
                    raise _Abandoned
                return True
            return self.clock.advance(seconds, until=event)

        job = runtime_job(value, raw_payload=payload, attempt=self.attempt, retries_left=self.retries_left,
                          deadline=self.clock.time() + budget, job_id=self.job_id,
                          ledger_id=delivery.ledger_id, protocol=self.protocol, handler=spec.name,
                          checkpoint=self.checkpoint, callback_token=self.callback_token,
                          clock=self.clock, reporter=report, waiter=wait)
        self._job = job
        for after, reason in [(budget, CancelReason.TIMEOUT), *self._scheduled]:
            self.clock.call_at(started_at + after, functools.partial(self._cancel_running, job, reason))
        returned, error, abandoned = _call(spec, job)
        self._job = None
        if self._cancel_reason is not None:  # the runtime's cancellation decides, whatever came after
            outcome = cancelled_outcome(spec, job, self._cancel_reason, budget, self.grace_seconds,
                                        stopped=not abandoned)
            return done(outcome, started=True, logs=tuple(job.logs), abandoned=abandoned)
        result: RunResult = finished_result(spec, job, returned, error, _run_result, self.clock.time())
        return done(result.outcome, started=result.started, continuation=result.continuation,
                    logs=result.logs)

    def _cancel_running(self, job: Job[Any], reason: CancelReason) -> None:
        """A scheduled cancellation; it does nothing once its run is over."""
        if self._job is job and not job.cancelled:
            self.cancel(reason)


def _run_result(outcome: Outcome | None, *, started: bool, continuation: Continue | None = None,
                logs: tuple[ResultLog, ...] = (), abandoned: bool = False) -> RunResult:
    return RunResult(outcome, continuation, started, 0.0, logs, abandoned)


def _call(spec: HandlerSpec, job: Job[Any]) -> tuple[Any, BaseException | None, bool]:
    """(returned value, raised exception, abandoned), as the runtime's handler thread sees it."""
    try:
        value = spec.fn(job)
        if inspect.isawaitable(value):
            value = asyncio.run(_await(value))
    except _Abandoned:
        return None, None, True
    except asyncio.CancelledError as err:
        return None, err, False
    except Exception as err:
        return None, err, False
    return value, None, False


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _spec_of(target: HandlerSpec | Callable[..., Any] | str) -> HandlerSpec:
    if isinstance(target, HandlerSpec):
        return target
    if isinstance(target, str):
        return default_registry.get(target)
    spec = getattr(target, SPEC_ATTRIBUTE, None)
    if not isinstance(spec, HandlerSpec):
        raise TypeError(f"{target!r} is not a handler: decorate it with @handler(...) or pass its HandlerSpec")
    return spec
