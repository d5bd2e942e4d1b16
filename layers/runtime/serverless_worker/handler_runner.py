"""Run one handler within a time budget and turn whatever happened into an Outcome.

The handler runs in a daemon thread (reused between runs: ``handler_threads.py``) while
the calling thread watches the budget and an external cancel signal (lease lost,
shutdown). Python cannot kill a thread, so stopping is cooperative: the runner sets
``job.cancelled``, gives the handler ``grace_seconds`` to notice, then returns the
outcome regardless. A handler that ignores cancellation is abandoned: the outcome is decided once, here, and nothing the
thread does afterwards can change it. Locally the daemon thread cannot block exit. In
Lambda a frozen sandbox is thawed for the next invocation and the thread would resume
there, so ``RunResult.abandoned`` tells the runtime to end the sandbox (exit the
process) once the outcome is stored and reported.

Only ``BaseException`` (KeyboardInterrupt, SystemExit) and a failure of the watcher
itself (its clock, its cancel signal) escape :func:`run_handler`, the handler cancelled
first; every failure in the handler or in mapping its result becomes an Outcome.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from pydantic import ValidationError

from .errors import BadInputError, BusinessError, JobCancelledError
from .handler_threads import handler_threads
from .job import CancelReason, Job
from .job_control import Clock, ProgressReporter, cancel_job, runtime_job
from .model import Delivery, Outcome, OutcomeKind, ResultExtras, ResultLog
from .registry import HandlerSpec
from .results import Continue, NotJsonSerializableError, Result, to_jsonable
from .textforms import truncate_utf8

__all__ = [
    "CANCEL_OUTCOMES",
    "MAX_MESSAGE_BYTES",
    "BadInputError",
    "CancelSignal",
    "Done",
    "RunResult",
    "cancelled_outcome",
    "decode_payload",
    "describe_validation_error",
    "finished_result",
    "handler_budget",
    "run_handler",
    "start_or_refuse",
]

log = logging.getLogger("serverless_worker.handler_runner")

MAX_MESSAGE_BYTES = 4096    # failure messages are cut to this size
_POLL_SECONDS = 0.05        # how often the watcher looks at an external cancel signal
_MAX_LISTED_ERRORS = 20

# What a cancellation becomes. A shutdown hands the job back without using an attempt
# (Priostack's documented shutdown rule), a lost lease reports nothing (server recovery
# decides), a spent budget is a retryable timeout.
CANCEL_OUTCOMES: dict[CancelReason, tuple[OutcomeKind, str]] = {
    CancelReason.LEASE_LOST: (OutcomeKind.LEASE_LOST, "LEASE_LOST"),
    CancelReason.TIMEOUT: (OutcomeKind.TIMEOUT, "HANDLER_TIMEOUT"),
    CancelReason.SHUTDOWN: (OutcomeKind.NOT_STARTED, "SHUTDOWN"),
}


class CancelSignal(threading.Event):
    """A ``threading.Event`` that also says why it was set.

    The runtime sets it from the lease-renewal thread (``lease_lost``) or on shutdown.
    A plain ``Event`` works too and reads as ``lease_lost``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.reason: CancelReason | None = None

    def cancel(self, reason: CancelReason | str) -> None:
        if self.reason is None:
            self.reason = CancelReason(reason)
        self.set()


@dataclass(frozen=True)
class RunResult:
    """What one run came to.

    Exactly one of ``outcome`` and ``continuation`` is set. ``started`` says whether
    the handler was called (false for bad input or when there was no time to start).
    ``logs`` carries the result log lines of a continued slice, which has no outcome
    to hold them. ``abandoned`` is true when the handler ignored cancellation and its
    thread is still running.
    """

    outcome: Outcome | None
    continuation: Continue | None = None
    started: bool = False
    duration: float = 0.0
    logs: tuple[ResultLog, ...] = ()
    abandoned: bool = False


# Builds the RunResult (timing included) from an outcome; see run_handler's ``done``.
Done = Callable[..., RunResult]


class _Box:
    """What the handler thread hands back to the watcher."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None
        self.fatal: BaseException | None = None  # KeyboardInterrupt, SystemExit: re-raised by the caller


def describe_validation_error(err: ValidationError, limit: int = _MAX_LISTED_ERRORS) -> str:
    """``field.path: problem; ...`` without input values or documentation URLs."""
    errors = err.errors(include_input=False, include_url=False, include_context=False)
    parts = [f"{'.'.join(str(p) for p in e['loc']) or '(payload)'}: {e['msg']}" for e in errors[:limit]]
    if len(errors) > limit:
        parts.append(f"and {len(errors) - limit} more")
    return "; ".join(parts)


def decode_payload(spec: HandlerSpec, delivery: Delivery) -> Any:
    """The handler's ``job.input``: the validated model, or the decoded payload.

    A string (Pipelogiq sends stage input as one) is JSON-decoded when it is valid JSON
    and kept as a string otherwise; with an input model it must be valid JSON.
    """
    if delivery.invalid is not None:
        raise BadInputError(f"invalid delivery: {delivery.invalid}")
    payload = delivery.payload
    if isinstance(payload, bytes | bytearray):
        try:
            payload = bytes(payload).decode("utf-8")
        except UnicodeDecodeError:
            raise BadInputError("payload is not valid UTF-8") from None
    model = spec.input_model
    if model is None:
        if isinstance(payload, str):
            try:
                return json.loads(payload)
            except ValueError:
                return payload
            except RecursionError:  # valid JSON nested past the decoder's limit: unusable as input
                raise BadInputError("payload is JSON nested too deep to decode") from None
        return payload
    try:
        if isinstance(payload, str):
            return model.model_validate_json(payload)
        return model.model_validate(payload)
    except ValidationError as err:
        raise BadInputError(
            f"payload does not match {model.__name__}: {describe_validation_error(err)}") from None


def run_handler(
    spec: HandlerSpec,
    delivery: Delivery,
    *,
    budget_seconds: float,
    grace_seconds: float = 2.0,
    progress: ProgressReporter | None = None,
    checkpoint: Any = None,
    callback_token: str | None = None,
    cancel_event: threading.Event | None = None,
    clock: Clock | ModuleType = time,
) -> RunResult:
    """Run ``spec`` on ``delivery`` for at most ``budget_seconds`` (and the handler's own timeout).

    ``progress`` receives ``job.progress`` values; ``checkpoint`` is the previous
    slice's :class:`Continue` value; ``cancel_event`` (ideally a :class:`CancelSignal`)
    stops the run early.
    """
    started_at = clock.monotonic()

    def done(outcome: Outcome | None, *, started: bool, continuation: Continue | None = None,
             logs: tuple[ResultLog, ...] = (), abandoned: bool = False) -> RunResult:
        return RunResult(outcome, continuation, started, clock.monotonic() - started_at, logs, abandoned)

    budget = handler_budget(spec, budget_seconds)
    early = _reason_of(cancel_event) if cancel_event is not None and cancel_event.is_set() else None
    value, refusal = start_or_refuse(spec, delivery, budget, early)
    if refusal is not None:
        return done(refusal, started=False)

    job: Job[Any] = runtime_job(
        value, raw_payload=delivery.payload, attempt=delivery.attempt, retries_left=delivery.retries_left,
        deadline=clock.time() + budget, job_id=delivery.job_id, ledger_id=delivery.ledger_id,
        protocol=delivery.protocol, handler=spec.name, checkpoint=checkpoint,
        callback_token=callback_token, reporter=progress, clock=clock)
    box = _Box()
    try:
        handler_threads.run(f"sw-handler-{spec.name}", lambda: _call(spec, job, box))
    except RuntimeError as err:  # "can't start new thread": out of threads or memory
        log.error("could not start a thread for handler %s", spec.name, exc_info=err, extra=job.log_context)
        return done(Outcome(kind=OutcomeKind.NOT_STARTED, error_code="NO_THREAD",
                            message=f"could not start the handler thread: {err}"), started=False)
    reason: CancelReason | None = None
    try:
        reason = _watch(box.done, budget, cancel_event, clock)
    finally:
        if reason is None and not box.done.is_set():
            # The watcher itself was stopped (Ctrl-C, exit) or failed: nothing supervises the
            # handler any more, so tell it to stop too. The error itself goes on up.
            cancel_job(job, CancelReason.SHUTDOWN)
    if reason is not None:
        cancel_job(job, reason)
        stopped = box.done.wait(max(0.0, grace_seconds))
        return done(cancelled_outcome(spec, job, reason, budget, grace_seconds, stopped), started=True,
                    logs=tuple(job.logs), abandoned=not stopped)
    if box.fatal is not None:
        raise box.fatal
    return finished_result(spec, job, box.value, box.error, done, clock.time())


def handler_budget(spec: HandlerSpec, budget_seconds: float) -> float:
    """The seconds a run gets: the runtime's budget, capped by the handler's own ``timeout``."""
    return budget_seconds if spec.timeout is None else min(budget_seconds, spec.timeout)


def start_or_refuse(spec: HandlerSpec, delivery: Delivery, budget: float,
                    early: CancelReason | None) -> tuple[Any, Outcome | None]:
    """``(job.input, None)`` when the handler may start, else ``(None, the outcome)``: bad input,
    a crashing input model, a cancellation that came first (``early``) or no budget left."""
    try:
        value = decode_payload(spec, delivery)
    except BadInputError as err:
        log.warning("bad input for handler %s: %s", spec.name, err, extra=_context(spec, delivery))
        return None, Outcome(kind=OutcomeKind.BAD_INPUT, error_code="VALIDATION_ERROR", message=str(err))
    except Exception as err:  # an input model's own validator crashed: the model's bug
        log.error("input model of handler %s crashed", spec.name, exc_info=err,
                  extra=_context(spec, delivery))
        return None, _failure(err, "input model raised ")
    if early is not None:
        return None, Outcome(kind=OutcomeKind.NOT_STARTED, error_code=early.upper(),
                             message=f"cancelled ({early}) before the handler started")
    if not budget > 0:  # also NaN
        return None, Outcome(kind=OutcomeKind.NOT_STARTED, error_code="NO_TIME",
                             message="no time budget left to start the handler")
    return value, None


def finished_result(spec: HandlerSpec, job: Job[Any], value: Any, error: BaseException | None,
                    done: Done, now: float) -> RunResult:
    """What a handler that returned ``value`` (or raised ``error``) on its own comes to.

    Shared with :mod:`serverless_worker.testing`, so a test sees the runtime's mapping.
    A bug in the mapping is still a definite outcome: it never escapes.
    """
    try:
        return _map(spec, job, value, error, done, now)
    except Exception as err:  # the mapping's own bug: report it as a failure rather than lose the job
        log.error("mapping the outcome of handler %s failed", spec.name, exc_info=err, extra=job.log_context)
        return done(_failure(err, "internal error while mapping the handler's outcome: "), started=True)


def _call(spec: HandlerSpec, job: Job[Any], box: _Box) -> None:
    try:
        value = spec.fn(job)
        if inspect.isawaitable(value):  # async def handlers get their own event loop
            value = asyncio.run(_await(value))
        box.value = value
    except asyncio.CancelledError as err:  # a BaseException, but an async handler's normal stop
        box.error = err
    except Exception as err:
        box.error = err
    except BaseException as err:
        box.fatal = err
    finally:
        box.done.set()


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _watch(finished: threading.Event, budget: float, cancel_event: threading.Event | None,
           clock: Clock | ModuleType) -> CancelReason | None:
    """Wait for the handler; return why to cancel it, or None once it finished."""
    end = clock.monotonic() + budget
    while True:
        if finished.is_set():
            return None
        if cancel_event is not None and cancel_event.is_set():
            return _reason_of(cancel_event)
        left = end - clock.monotonic()
        if left <= 0:
            return CancelReason.TIMEOUT
        if cancel_event is not None:
            finished.wait(min(left, _POLL_SECONDS))
        else:
            finished.wait(left if math.isfinite(left) else None)


def _reason_of(event: threading.Event) -> CancelReason:
    reason = getattr(event, "reason", None)
    try:
        return CancelReason(reason) if reason is not None else CancelReason.LEASE_LOST
    except ValueError:
        return CancelReason.LEASE_LOST


def cancelled_outcome(spec: HandlerSpec, job: Job[Any], reason: CancelReason, budget: float, grace: float,
                      stopped: bool) -> Outcome:
    """The outcome of a run the runner cancelled (budget spent, lease lost, shutdown), whatever
    the handler did afterwards; ``stopped`` says whether it ended within ``grace`` seconds."""
    kind, code = CANCEL_OUTCOMES[reason]
    if reason is CancelReason.TIMEOUT:
        message = f"handler {spec.name!r} ran past its time budget of {budget:.3g}s"
    else:
        message = f"handler {spec.name!r} was cancelled: {reason}"
    if not stopped:
        message += f"; it did not stop within {grace:.3g}s and its thread was abandoned"
        log.warning("handler %s ignored cancellation (%s) for %.3gs; abandoning its thread (what it returns "
                    "later is dropped and lost: the job gets the cancellation's outcome)", spec.name,
                    reason, grace, extra=job.log_context)
    else:
        log.warning("handler %s cancelled: %s", spec.name, reason, extra=job.log_context)
    return Outcome(kind=kind, error_code=code, message=message, extras=_extras(job.logs))


def _map(spec: HandlerSpec, job: Job[Any], value: Any, err: BaseException | None, done: Done,
         now: float) -> RunResult:
    if err is None:
        return _map_value(spec, job, value, done, now)
    if isinstance(err, JobCancelledError) or (isinstance(err, asyncio.CancelledError) and job.cancelled):
        reason = job.cancel_reason or _reason_from(err)
        kind, code = CANCEL_OUTCOMES[reason]
        return done(Outcome(kind=kind, error_code=code, message=f"handler {spec.name!r} stopped: {reason}",
                            extras=_extras(job.logs)), started=True)
    if isinstance(err, BusinessError):
        try:
            variables = to_jsonable(err.variables)
        except NotJsonSerializableError as bad:
            return _invalid(spec, job, f"raised a BusinessError whose variables are not JSON-serializable: {bad}",
                            done)
        return done(Outcome(kind=OutcomeKind.BUSINESS_ERROR, error_code=err.code,
                            message=truncate_utf8(err.message, MAX_MESSAGE_BYTES), value=variables,
                            extras=_extras(job.logs)), started=True)
    log.error("handler %s raised %s", spec.name, type(err).__name__, exc_info=err, extra=job.log_context)
    if isinstance(err, ValidationError):
        message = ("handler raised a pydantic ValidationError (a bug in the handler, not bad input): "
                   f"{err.title}: {describe_validation_error(err)}")
        return done(Outcome(kind=OutcomeKind.FAILURE, error_code="ValidationError",
                            message=truncate_utf8(message, MAX_MESSAGE_BYTES), extras=_extras(job.logs)),
                    started=True)
    outcome = _failure(err)
    return done(outcome.model_copy(update={"extras": _extras(job.logs)}), started=True)


def _map_value(spec: HandlerSpec, job: Job[Any], value: Any, done: Done, now: float) -> RunResult:
    if isinstance(value, Continue):
        if not spec.long_running:
            return _invalid(spec, job, f"returned Continue but is declared mode={spec.mode!r}; declare it "
                                       "with @handler(..., mode=\"slices\") to run in slices", done)
        try:
            checkpoint = to_jsonable(value.checkpoint)
        except NotJsonSerializableError as err:
            return _invalid(spec, job, "returned a Continue checkpoint that is not "
                                 f"JSON-serializable: {err}", done)
        return done(None, continuation=Continue(checkpoint, value.delay_seconds), started=True,
                    logs=tuple(job.logs))
    extras: ResultExtras | None = None
    if isinstance(value, Result):
        try:
            extras = value.to_extras(now=now)
        except ValidationError as err:
            return _invalid(spec, job, "returned a Result with invalid extras: "
                                 f"{describe_validation_error(err)}", done)
        except NotJsonSerializableError as err:
            return _invalid(spec, job, f"returned a Result with a context value that is not "
                                 f"JSON-serializable: {err}", done)
        extras = extras.model_copy(update={"logs": [*job.logs, *extras.logs]})
        value = value.value
    else:
        extras = _extras(job.logs)
    try:
        normalized = to_jsonable(value)
    except NotJsonSerializableError as err:
        return _invalid(spec, job, f"returned a value that is not JSON-serializable: {err}", done)
    return done(Outcome(kind=OutcomeKind.SUCCESS, value=normalized, extras=extras), started=True)


def _invalid(spec: HandlerSpec, job: Job[Any], what: str, done: Done) -> RunResult:
    """An INVALID_RESULT failure whose message names the handler, the job and what was wrong
    (the offending type, from NotJsonSerializableError); reported as not retryable."""
    message = f"handler {spec.name!r} (job {job.job_id}) {what}"
    log.error("%s", message, extra=job.log_context)
    return done(Outcome(kind=OutcomeKind.FAILURE, error_code="INVALID_RESULT",
                        message=truncate_utf8(message, MAX_MESSAGE_BYTES), extras=_extras(job.logs)),
                started=True)


def _failure(err: BaseException, prefix: str = "") -> Outcome:
    text = f"{prefix}{type(err).__name__}: {err}" if str(err) else f"{prefix}{type(err).__name__}"
    return Outcome(kind=OutcomeKind.FAILURE, error_code=type(err).__name__,
                   message=truncate_utf8(text, MAX_MESSAGE_BYTES))


def _reason_from(err: BaseException) -> CancelReason:
    try:
        return CancelReason(getattr(err, "reason", CancelReason.SHUTDOWN))
    except ValueError:
        return CancelReason.SHUTDOWN


def _extras(logs: list[ResultLog]) -> ResultExtras | None:
    return ResultExtras(logs=logs) if logs else None


def _context(spec: HandlerSpec, delivery: Delivery) -> dict[str, Any]:
    return {"job_id": delivery.job_id, "ledger_id": delivery.ledger_id, "handler": spec.name,
            "protocol": delivery.protocol, "attempt": delivery.attempt}
