"""The state machine's steps (functions/statemachine/worker.asl.json).

Each step receives only the ledger key and the run's epoch and reads everything else
from the ledger, so no token or payload ever enters execution history. The epoch fences
stale steps: a step whose epoch no longer owns the item does nothing. An execution's
epoch is its own id; continue-as-new moves the run to a successor epoch (a take-over in
the ledger) that the next execution receives as ``handover_epoch``, so every execution
has its own fence and its own, deterministic, execution name.

The run branch and the renew loop talk only through the ledger: the renew step records
a refused renewal as a cancel request (the running slice's watcher cancels the handler),
and the renew loop ends once the run no longer holds the item as RUNNING, or stopped at
a slice boundary to hand over.

What a renew cycle does depends on the protocol's lease:

- renewable (Pipelogiq): renew it; a refusal cancels the run (no result, the delivery is
  discarded: the server's recovery publishes a fresh execution);
- none (Priostack): nothing to renew; the cycle only pushes the ledger deadline out so
  the reaper leaves the live run alone;
- fixed, not renewable (claim queue: no renew endpoint): the claim's lease must cover
  the job. Each slice, and a callback's wait, is bounded by it, so a handler still
  running near its end is stopped as a timeout (no result; the lease lapses and the
  queue, whose own timeout bounds the retries, offers the item again) instead of
  running on while the item may be claimed by someone else.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any, cast

from ..errors import DispatchError, LeaseRefusedError, PayloadTooLargeError, ProtocolError, ServerlessWorkerError
from ..model import Lease, LedgerStatus, Outcome, OutcomeKind
from ..state.errors import StaleWriteError, StateStoreError
from ..state.items import LedgerItem
from . import outcomes
from .budget import callback_budget, lapsed_at_grant, lease_room, time_budget
from .context import LambdaContextLike
from .pipeline import claim, find_handler, lease_bound, settle_lapsed, settle_refusal, store_if_owned, take_lease
from .progress import progress_reporter
from .retry_owners import CLIENT_RETRIED_NAMES
from .services import Services
from .settle import acknowledge, count_settled, discard, hand_back, handback_epoch, report, settle
from .step_events import (
    AckEvent,
    AckResult,
    AcquireDone,
    AcquireEvent,
    AcquireRun,
    CallbackStarted,
    ContinueAsNewEvent,
    FinishCallbackEvent,
    GiveBackEvent,
    GiveBackResult,
    HandoverResult,
    RenewEvent,
    RenewResult,
    ReportEvent,
    ReportResult,
    RunSliceEvent,
    SliceResult,
    StartCallbackEvent,
)

__all__ = ["MAX_RENEW_CYCLES", "STEPS", "run_step"]

log = logging.getLogger("serverless_worker.steps")

# A Standard execution fails at 25,000 history events. A renew cycle (Wait, Task, Choice)
# writes about 9 events and a slice about 7; both count as a cycle, and the run hands over
# to a fresh execution at the first slice boundary past this many cycles. That leaves room
# for the renewals of one more slice (a 15-minute slice renewed every second is 900
# cycles). A callback cannot hand over (its task token belongs to the execution), so its
# timeout is capped at this many renew intervals.
MAX_RENEW_CYCLES = 1500
_TIMEOUT_ERRORS = frozenset({"States.Timeout", "States.HeartbeatTimeout"})


def _done(*, reason: str, epoch: str) -> AcquireDone:
    return {"action": "done", "reason": reason, "epoch": epoch}


def _slice(more: bool = False, *, handover: bool = False, delay: int = 0) -> SliceResult:
    """run_slice's answer; every key is always present (the ASL's Choice states read them)."""
    return {"continue": more, "handover": handover, "delay_seconds": delay}


def _remaining(context: LambdaContextLike) -> float:
    return context.get_remaining_time_in_millis() / 1000


def _grace(services: Services) -> float:
    """How far a heartbeat of the run pushes its ledger deadline (when the reaper may act)."""
    return 3 * float(services.settings.lease_renew_seconds) + 60


def _owned(item: LedgerItem | None, epoch: str | None) -> bool:
    return item is not None and item.status is LedgerStatus.RUNNING and item.epoch == epoch


def _successor(epoch: str) -> str:
    """The epoch a continued execution runs under: deterministic, so a retried handover is idempotent."""
    return "handover:" + hashlib.sha256(epoch.encode()).hexdigest()[:32]


def _lease_lost(item: LedgerItem) -> Outcome:
    return outcomes.lease_lost(item.cancel_reason or "lease lost")


# -- acquire -------------------------------------------------------------------------------------
def acquire(services: Services, event: AcquireEvent, context: LambdaContextLike) -> AcquireRun | AcquireDone:
    """Claim the ledger item for this execution, take (or, after a handover, refresh) the
    lease, and say how to run: slices or a callback, and how often to renew."""
    key = event["ledger_key"]
    handover = event.get("handover_epoch")
    epoch = handover or event["execution_id"]
    settings = services.settings
    now = services.clock()
    item = claim(services.store, key, epoch=epoch, deadline=now + _grace(services))
    if item is None:
        return _done(reason="not owned", epoch=epoch)
    delivery = item.delivery
    try:
        lease = take_lease(services, delivery, handover=bool(handover), retried=item.runs > 1)
    except LeaseRefusedError as refusal:
        if handover:
            # The run already started in an earlier execution: the lease is gone, report nothing.
            services.store.request_cancel(key, epoch, f"renewal refused: {refusal.reason}")
            store_if_owned(services.store, key, epoch, outcomes.lease_lost(f"renewal refused: {refusal.reason}"))
            discard(services.settler(), key, delivery, f"lease lost at handover: {refusal.reason}")
        else:
            settle_refusal(services, key, delivery, refusal)
        return _done(reason=refusal.reason, epoch=epoch)
    except ProtocolError as err:
        if handover:  # unknown whether the renewal went through: the renew loop tries again
            log.warning("lease refresh at handover failed; the renew loop tries again before the lease expires "
                        "(nothing is lost yet): %s", err)
            lease = Lease()
        else:
            # Unknown whether we hold the lease; the handler has not started: handing back is safe.
            hand_back(services.settler(), key, delivery, f"lease not acquired: {type(err).__name__}", epoch=epoch)
            return _done(reason="lease not acquired", epoch=epoch)
    spec = find_handler(services.registry, delivery)
    if isinstance(spec, Outcome):
        if store_if_owned(services.store, key, epoch, spec):
            settle(services.settler(), key, delivery, spec)
        return _done(reason="unknown handler", epoch=epoch)
    bounding = None if handover else lease_bound(spec, lease, services.protocol)
    lapsed = lapsed_at_grant(bounding, services.clock()) if bounding is not None else None
    if lapsed is not None:
        settle_lapsed(services, key, delivery, lapsed)
        return _done(reason="lease lapsed", epoch=epoch)
    renew_seconds = float(settings.lease_renew_seconds)
    if lease.expires_at is not None and lease.renewable:
        renew_seconds = min(renew_seconds, (lease.expires_at - now) / 2)
    renew_every = max(1, int(renew_seconds))  # a Wait takes whole seconds
    # The task waits at most the handler's timeout, and no longer than the history allows.
    timeout = min(int(spec.timeout or 86400), MAX_RENEW_CYCLES * renew_every)
    room = lease_room(lease, now)
    if spec.callback and room is not None:
        # Nor past a lease that cannot be renewed: after it the item may run elsewhere.
        timeout = min(timeout, int(room))
        if timeout < 2:
            hand_back(services.settler(), key, delivery, "too little lease left to wait for a callback", epoch=epoch)
            return _done(reason="no time", epoch=epoch)
    timeout = max(2, timeout)
    # The renew loop heartbeats every cycle; AWS wants the heartbeat below the timeout.
    heartbeat = max(1, min(max(3 * renew_every, renew_every + 30), timeout - 1))
    return {
        "action": "run",
        "epoch": epoch,
        "mode": "callback" if spec.callback else "slice",
        "renew_seconds": renew_every,
        "callback_timeout_seconds": timeout,
        "callback_heartbeat_seconds": heartbeat,
    }


# -- the run branch --------------------------------------------------------------------------------
def run_slice(services: Services, event: RunSliceEvent, context: LambdaContextLike) -> SliceResult:
    """Run the handler once (one slice) from the stored checkpoint; store a continuation's
    checkpoint or the final outcome. Decides the handover at a slice boundary."""
    from ..handler_runner import run_handler

    key, epoch = event["ledger_key"], event["epoch"]
    store = services.store
    item = store.get(key)
    if not _owned(item, epoch):
        return _slice()
    assert item is not None
    if item.cancel_reason:
        store_if_owned(services.store, key, epoch, _lease_lost(item))
        return _slice()
    if item.handover_requested:
        return _slice(handover=True)
    spec = find_handler(services.registry, item.delivery)
    if isinstance(spec, Outcome):
        store_if_owned(services.store, key, epoch, spec)
        return _slice()
    protocol = services.protocol
    lease = Lease(expires_at=item.delivery.lease_expires_at, renewable=protocol.lease_renewable)
    # A lease that cannot be renewed (claim queue) bounds the slice: past it the item is
    # someone else's, so the handler stops first (a timeout: no result, the lease lapses).
    settings = services.settings
    budget = time_budget(remaining_lambda=_remaining(context), report_margin=settings.report_margin_seconds,
                         handler_timeout=None, job_timeout=None, lease=lease, now=services.clock())
    cancel = threading.Event()
    watcher = _CancelWatcher(services, key, epoch, cancel, every=float(settings.lease_renew_seconds) / 2)
    try:
        result = run_handler(spec, item.delivery, budget_seconds=budget, cancel_event=cancel,
                             checkpoint=item.checkpoint,
                             progress=progress_reporter(services.client, services.events, item.delivery,
                                                        on_terminal=lambda _: cancel.set(),
                                                        watcher=services.watcher))
    finally:
        watcher.stop()
    if result.continuation is None:
        outcome = result.outcome or outcomes.no_outcome()
        if outcome.kind is OutcomeKind.NOT_STARTED and item.checkpoint is not None:
            # Not the first slice: the job did start, so this is a spent budget, not a hand-back.
            outcome = Outcome(kind=OutcomeKind.TIMEOUT, error_code="NO_TIME", message=outcome.message)
        store_if_owned(services.store, key, epoch, outcome, delivery=item.delivery)
        return _slice()
    try:
        store.save_checkpoint(key, epoch, result.continuation.checkpoint)
        cycles = store.renew_deadline(key, epoch, deadline=services.clock() + _grace(services))
    except StaleWriteError:
        log.warning("run %s no longer owns delivery %s at a slice boundary (the reaper or a newer run took it "
                    "over): this slice's checkpoint is lost; the owner settles the job", epoch, key)
        return _slice()
    except PayloadTooLargeError as err:
        store_if_owned(store, key, epoch, Outcome(kind=OutcomeKind.FAILURE, error_code="CHECKPOINT_TOO_LARGE",
                                                  message=str(err)[:1024]))
        return _slice()
    fresh = store.get(key)
    if not _owned(fresh, epoch):
        return _slice()
    assert fresh is not None
    if fresh.cancel_reason:  # refused while the slice was ending: start no further slice
        store_if_owned(services.store, key, epoch, _lease_lost(fresh))
        return _slice()
    if cycles >= MAX_RENEW_CYCLES:
        # The history is filling up: stop here and continue in a fresh execution.
        if store.request_handover(key, epoch):
            return _slice(handover=True)
        return _slice()
    return _slice(True, delay=math.ceil(result.continuation.delay_seconds))


def start_callback(services: Services, event: StartCallbackEvent, context: LambdaContextLike) -> CallbackStarted:
    """Run the handler with the task token; it starts external work that will later call
    SendTaskSuccess/Failure. A handler that fails to start the work fails the task now."""
    from ..handler_runner import run_handler

    key, epoch, token = event["ledger_key"], event["epoch"], event["task_token"]
    store = services.store
    item = store.get(key)
    if not _owned(item, epoch) or item is None or item.cancel_reason:
        _fail_task(services, token, error="NotOwner", cause="the run no longer owns the delivery")
        return {"started": False}
    try:
        store.save_callback_token(key, epoch, token)
    except StaleWriteError:
        _fail_task(services, token, error="NotOwner", cause="the run no longer owns the delivery")
        return {"started": False}
    spec = find_handler(services.registry, item.delivery)
    if isinstance(spec, Outcome):
        store_if_owned(services.store, key, epoch, spec)
        _fail_task(services, token, error="UnknownHandler", cause="see the ledger item")
        return {"started": False}
    budget = callback_budget(remaining_lambda=_remaining(context),
                             report_margin=services.settings.report_margin_seconds)
    result = run_handler(spec, item.delivery, budget_seconds=budget, callback_token=token,
                         progress=progress_reporter(services.client, services.events, item.delivery,
                                                    on_terminal=None, watcher=services.watcher))
    outcome = result.outcome
    if outcome is None or outcome.kind is not OutcomeKind.SUCCESS:
        outcome = outcome or Outcome(kind=OutcomeKind.FAILURE, error_code="INVALID_RESULT",
                                     message="a callback handler cannot return Continue")
        store_if_owned(services.store, key, epoch, outcome, delivery=item.delivery)
        _fail_task(services, token, error="HandlerFailed",
                   cause=f"{outcome.kind.value}: {outcome.error_code or ''}"[:256])
    return {"started": True}


def finish_callback(services: Services, event: FinishCallbackEvent, context: LambdaContextLike) -> SliceResult:
    """Turn the callback's output (or its failure, or the task's timeout) into the stored outcome."""
    key, epoch = event["ledger_key"], event["epoch"]
    item = services.store.get(key)
    if _owned(item, epoch):
        assert item is not None
        error = event.get("error")
        if item.cancel_reason:
            outcome = _lease_lost(item)
        elif error is not None:
            name = str(error.get("Error") or "CALLBACK_FAILED")
            cause = str(error.get("Cause") or name)[:4096]
            if name in _TIMEOUT_ERRORS:
                outcome = Outcome(kind=OutcomeKind.TIMEOUT, error_code="CALLBACK_TIMEOUT",
                                  message=f"no callback within the task's timeout ({name})")
            else:
                outcome = Outcome(kind=OutcomeKind.FAILURE, error_code=name[:64], message=cause)
        else:
            outcome = Outcome(kind=OutcomeKind.SUCCESS, value=event.get("output"))
        store_if_owned(services.store, key, epoch, outcome, delivery=item.delivery)
    return _slice()


# -- the renew loop ---------------------------------------------------------------------------------
def renew(services: Services, event: RenewEvent, context: LambdaContextLike) -> RenewResult:
    """One renew cycle: extend the lease, heartbeat a waiting callback, push the deadline.
    ``finished`` once the run no longer needs it (outcome stored, cancelled, handing over)."""
    key, epoch = event["ledger_key"], event["epoch"]
    store = services.store
    item = store.get(key)
    if not _owned(item, epoch) or item is None or item.cancel_reason or item.handover_requested:
        return {"finished": True}
    protocol = services.protocol
    if protocol.lease_renewable:
        try:
            services.call(lambda p: p.renew(item.delivery))
        except LeaseRefusedError as refusal:
            return _renewal_refused(services, item, epoch, refusal)
        except ProtocolError as err:
            log.warning("renewal failed; tried again at the next cycle, before the lease expires (nothing is lost "
                        "yet): %s", err)
    if item.callback_token:
        _callback_heartbeat(services, item.callback_token)
    try:
        store.renew_deadline(key, epoch, deadline=services.clock() + _grace(services))
    except StaleWriteError:  # the run ended (or was taken over) meanwhile
        return {"finished": True}
    return {"finished": False}


def _renewal_refused(services: Services, item: LedgerItem, epoch: str,
                     refusal: LeaseRefusedError) -> RenewResult:
    from .metrics import metrics

    key, delivery = item.key, item.delivery
    if not services.store.request_cancel(key, epoch, f"renewal refused: {refusal.reason}"):
        return {"finished": True}  # the run ended meanwhile
    metrics.add("LeasesLost", 1)
    services.events.add("job.lease_lost", f"job {delivery.job_id}: {refusal.reason}", level="WARN",
                        job_id=delivery.job_id, reason=refusal.reason)
    if refusal.action == "stop":
        reason = f"lease refused: {refusal.reason}"
        services.store.set_stopped(services.protocol_name, services.instance, reason)
    if item.callback_token:
        # Nothing will come of the callback for us any more: end the wait now. Best effort: a
        # wait not ended here ends at its heartbeat timeout (the renew loop has stopped), and
        # finish_callback then finds the cancel request.
        try:
            _fail_task(services, item.callback_token, error="LeaseLost",
                       cause=f"renewal refused: {refusal.reason}")
        except DispatchError as err:
            log.warning("callback not failed after a refused renewal: %s", err)
    return {"finished": True, "refused": True}


# -- after the run ----------------------------------------------------------------------------------
def report_step(services: Services, event: ReportEvent, context: LambdaContextLike) -> ReportResult:
    """Report the stored outcome (hand back or discard where the outcome says so), or say
    that the run stopped at a slice boundary to continue in a fresh execution."""
    key, epoch = event["ledger_key"], event.get("epoch")
    item = services.store.get(key)
    if item is None:
        return {"reported": False, "handover": False}
    if _owned(item, epoch):
        if item.cancel_reason:  # refused while handing over: the lease is gone
            if store_if_owned(services.store, key, str(epoch), _lease_lost(item)):
                discard(services.settler(), key, item.delivery, "lease lost while running")
            return {"reported": False, "handover": False}
        if item.handover_requested:
            return {"reported": False, "handover": True}
    status = item.status
    if status is LedgerStatus.OUTCOME_STORED and item.outcome is not None:
        if item.outcome.kind is OutcomeKind.NOT_STARTED:
            hand_back(services.settler(), key, item.delivery, item.outcome.message or "not started")
        elif item.outcome.kind is OutcomeKind.LEASE_LOST:
            discard(services.settler(), key, item.delivery, "lease lost while running")
        else:
            receipt = report(services.settler(), key, item.delivery, item.outcome)
            return {"reported": True, "accepted": receipt.accepted, "handover": False}
    return {"reported": False, "status": str(status), "handover": False}


def ack_step(services: Services, event: AckEvent, context: LambdaContextLike) -> AckResult:
    key = event["ledger_key"]
    item = services.store.get(key)
    if item is not None and item.status is LedgerStatus.REPORTED:
        acknowledge(services.settler(), key, item.delivery)
        count_settled(services.settler(), item.outcome, delivery=item.delivery)
        return {"acknowledged": True}
    return {"acknowledged": False}


def give_back(services: Services, event: GiveBackEvent, context: LambdaContextLike) -> GiveBackResult:
    """The execution failed somewhere: give the job a definite outcome anyway.

    Unstarted (recorded, or claimed but failed in the acquire step of a first execution):
    hand back. Started: a failure (or, with the lease lost, discard). Already settling:
    finish. A run owned by another epoch is not ours to touch.
    """
    key = event["ledger_key"]
    store = services.store
    item = store.get(key)
    if item is None:
        return {"action": "missing"}
    phase = event.get("phase", "run")
    epoch = event.get("epoch") or event.get("handover_epoch") or event.get("execution_id")
    now = services.clock()
    error = event.get("error") or {}
    name = str(error.get("Error") or "execution failed")[:128]
    if item.status in (LedgerStatus.OUTCOME_STORED, LedgerStatus.REPORTED) and name in CLIENT_RETRIED_NAMES:
        # The client gave up on the report or ack and it is noted on the item: the reaper
        # sends it again at the noted time, not this step now (docs/retries.md).
        return {"action": "deferred", "status": str(item.status)}
    if item.status in (LedgerStatus.RECORDED, LedgerStatus.DISPATCHED):
        handback = handback_epoch()
        if claim(store, key, epoch=handback, deadline=now + 60) is not None:
            hand_back(services.settler(), key, item.delivery, f"state machine failed: {name}", epoch=handback)
            return {"action": "handed_back"}
    elif item.status is LedgerStatus.RUNNING and item.epoch is not None:
        # Ours, or our successor's when the handover failed before its execution started.
        if epoch is not None and item.epoch not in (epoch, _successor(epoch)):
            return {"action": "none", "reason": "not owned"}
        unstarted = phase == "acquire" and not event.get("handover_epoch") and not item.cancel_reason
        # A claim that only hands back is marked so (the reaper hands it back again if stranded).
        new_epoch = handback_epoch() if unstarted else f"giveback:{uuid.uuid4()}"
        if store.take_over(key, old_epoch=item.epoch, new_epoch=new_epoch, deadline=now + 60):
            if item.cancel_reason:
                store_if_owned(services.store, key, new_epoch, _lease_lost(item))
            elif unstarted:
                hand_back(services.settler(), key, item.delivery, f"failed before the handler started: {name}",
                          epoch=new_epoch)
                return {"action": "handed_back"}
            else:
                failure = Outcome(kind=OutcomeKind.FAILURE, error_code="STATE_MACHINE_ERROR",
                                  message=f"the execution failed: {name}")
                store_if_owned(services.store, key, new_epoch, failure)
    item = store.get(key)
    if item is not None and item.status is LedgerStatus.OUTCOME_STORED and item.outcome is not None:
        settlement = settle(services.settler(), key, item.delivery, item.outcome)
        return {"action": settlement.action}
    if item is not None and item.status is LedgerStatus.REPORTED:
        acknowledge(services.settler(), key, item.delivery)
        return {"action": "acknowledged"}
    return {"action": "none", "status": str(item.status) if item else None}


def continue_as_new(services: Services, event: ContinueAsNewEvent, context: LambdaContextLike) -> HandoverResult:
    """Move the run to its successor epoch and start the execution that continues it."""
    key, epoch = event["ledger_key"], event["epoch"]
    successor = _successor(epoch)
    store = services.store
    item = store.get(key)
    if item is None or item.status is not LedgerStatus.RUNNING or item.epoch not in (epoch, successor):
        return {"handed_over": False}
    if item.epoch == epoch:
        # Renew once more: the lease must outlast the gap until the next execution renews it.
        if services.protocol.lease_renewable:
            try:
                services.call(lambda p: p.renew(item.delivery))
            except LeaseRefusedError as refusal:
                lost = outcomes.lease_lost(f"renewal refused: {refusal.reason}")
                if store_if_owned(services.store, key, epoch, lost):
                    discard(services.settler(), key, item.delivery, "lease lost while running")
                return {"handed_over": False}
            except ProtocolError as err:  # the next execution's acquire renews again
                log.warning("lease renewal before the handover failed: %s", err)
        if not store.take_over(key, old_epoch=epoch, new_epoch=successor,
                               deadline=services.clock() + _grace(services)):
            return {"handed_over": False}
    # Named after (ledger key, successor epoch): a retried step starts it at most once.
    services.dispatch.start_execution(key, handover_epoch=successor)
    return {"handed_over": True}


# Each step takes its own event type (``runtime/step_events.py``); the ASL picks the step by name.
Step = Callable[[Services, Any, LambdaContextLike], Mapping[str, Any]]
STEPS: dict[str, Step] = {
    "acquire": acquire,
    "run_slice": run_slice,
    "renew": renew,
    "start_callback": start_callback,
    "finish_callback": finish_callback,
    "report": report_step,
    "ack": ack_step,
    "give_back": give_back,
    "continue_as_new": continue_as_new,
}


def run_step(services: Services, event: dict[str, Any], context: LambdaContextLike) -> dict[str, Any]:
    """Dispatch on ``event["step"]``; an unknown step is a configuration error."""
    step = event.get("step")
    if step not in STEPS:
        raise ServerlessWorkerError(f"unknown step {step!r}; expected one of {sorted(STEPS)}")
    with services.flushing_events():
        return cast(dict[str, Any], STEPS[step](services, event, context))  # a TypedDict is a dict


def _fail_task(services: Services, token: str, *, error: str, cause: str) -> None:
    """End the callback task now; a task that already ended needs nothing more."""
    if not services.dispatch.fail_task(token, error=error, cause=cause):
        log.info("callback task already ended; not failed (%s)", error)


def _callback_heartbeat(services: Services, token: str) -> None:
    """Best effort: a missed heartbeat is covered by the next cycle's (the task's heartbeat
    timeout spans several renew intervals), so a failed one must not fail the renew step."""
    try:
        if not services.dispatch.heartbeat_task(token):
            log.info("callback heartbeat not sent: the task already ended")
    except DispatchError as err:
        log.warning("callback heartbeat failed; the next cycle sends another (nothing is lost yet: the task's "
                    "heartbeat timeout spans several cycles): %s", err)


class _CancelWatcher:
    """Polls the ledger for a cancellation requested by the renew branch (or a take-over)."""

    def __init__(self, services: Services, key: str, epoch: str, cancel: threading.Event,
                 every: float) -> None:
        self._services, self._key, self._epoch, self._cancel = services, key, epoch, cancel
        self._every = max(0.2, every)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="cancel-watch")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:
                item = self._services.store.get(self._key)
            except StateStoreError as err:  # DynamoDB unavailable a moment: look again next turn
                log.warning("cancel watcher could not read the ledger: %s", err)
                continue
            if not _owned(item, self._epoch) or (item is not None and item.cancel_reason):
                self._cancel.set()
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
