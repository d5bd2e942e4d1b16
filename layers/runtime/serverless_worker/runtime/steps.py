"""The state machine's steps (functions/statemachine/worker.asl.json).

Each step receives only the ledger key and the run's epoch and reads everything else
from the ledger, so no token or payload ever enters execution history. The epoch (the
first execution's id, carried across continue-as-new) fences stale steps: a step whose
epoch no longer owns the item does nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from ..errors import LeaseRefusedError, ProtocolError, ServerlessWorkerError, UnknownHandlerError
from ..outcome import Outcome, OutcomeKind
from .context import LambdaContextLike
from .executor import _refused
from .services import Services
from .settle import acknowledge, discard, hand_back, handback_epoch, report, settle

__all__ = ["STEPS", "run_step"]

log = logging.getLogger("serverless_worker.steps")

MAX_RENEW_CYCLES = 1500  # ~6 history events per cycle: hand over well before 25,000 events


def _done(**extra: Any) -> dict[str, Any]:
    return {"action": "done", **extra}


def _remaining(context: LambdaContextLike) -> float:
    return context.get_remaining_time_in_millis() / 1000


def acquire(services: Services, event: dict[str, Any], context: LambdaContextLike) -> dict[str, Any]:
    key = event["ledger_key"]
    epoch = event.get("handover_epoch") or event["execution_id"]
    settings = services.settings
    now = services.clock()
    renew_seconds = float(event.get("renew_seconds") or settings.lease_renew_seconds)
    item = services.store.start_run(key, epoch=epoch, deadline=now + 3 * renew_seconds + 60)
    if item is None:
        return _done(reason="not owned", epoch=epoch)
    delivery = item.delivery
    try:
        spec = services.registry.get(delivery.handler)
    except UnknownHandlerError as err:
        outcome = Outcome(kind=OutcomeKind.FAILURE, error_code="UNKNOWN_HANDLER", message=str(err))
        services.store.store_outcome(key, epoch, outcome)
        settle(services, key, delivery, outcome)
        return _done(reason="unknown handler", epoch=epoch)
    if not event.get("handover_epoch"):  # a continued execution already holds the lease
        try:
            lease = services.call(lambda p: p.acquire(delivery))
        except LeaseRefusedError as refusal:
            _refused(services, key, delivery, refusal)
            return _done(reason=refusal.reason, epoch=epoch)
        except ProtocolError as err:
            hand_back(services, key, delivery, f"lease not acquired: {type(err).__name__}")
            return _done(reason="lease not acquired", epoch=epoch)
        if lease.expires_at is not None and lease.renewable:
            renew_seconds = max(1.0, min(renew_seconds, (lease.expires_at - now) / 2))
    timeout = float(spec.timeout or 86400)
    return {
        "action": "run",
        "epoch": epoch,
        "mode": "callback" if getattr(spec, "callback", False) else "slice",
        "renew_seconds": int(max(1, renew_seconds)),
        "callback_timeout_seconds": int(timeout),
        "callback_heartbeat_seconds": int(max(3 * renew_seconds, renew_seconds + 30)),
    }


def run_slice(services: Services, event: dict[str, Any], context: LambdaContextLike) -> dict[str, Any]:
    from ..runner import run_handler

    key, epoch = event["ledger_key"], event["epoch"]
    store = services.store
    item = store.get(key)
    if item is None or item.epoch != epoch or not str(item.status).endswith("RUNNING"):
        return {"continue": False, "handover": False}
    if item.cancel_reason:
        store.store_outcome(key, epoch, Outcome(kind=OutcomeKind.LEASE_LOST, message=item.cancel_reason))
        return {"continue": False, "handover": False}
    if item.handover_requested:
        return {"continue": False, "handover": True}
    try:
        spec = services.registry.get(item.delivery.handler)
    except UnknownHandlerError as err:
        store.store_outcome(key, epoch, Outcome(kind=OutcomeKind.FAILURE, error_code="UNKNOWN_HANDLER",
                                                message=str(err)))
        return {"continue": False, "handover": False}
    budget = max(1.0, _remaining(context) - services.settings.report_margin_seconds)
    cancel = threading.Event()
    watcher = _CancelWatcher(services, key, epoch, cancel, every=float(services.settings.lease_renew_seconds) / 2)
    try:
        result = run_handler(spec, item.delivery, budget_seconds=budget, cancel_event=cancel,
                             checkpoint=item.checkpoint,
                             progress=lambda value: _progress(services, item.delivery, value))
    finally:
        watcher.stop()
    if result.continuation is not None:
        store.save_checkpoint(key, epoch, result.continuation.checkpoint)
        fresh = store.get(key)
        handover = bool(fresh is not None and fresh.handover_requested)
        return {"continue": not handover, "handover": handover}
    outcome = result.outcome or Outcome(kind=OutcomeKind.FAILURE, error_code="NO_OUTCOME",
                                        message="handler produced no outcome")
    store.store_outcome(key, epoch, outcome)
    return {"continue": False, "handover": False}


def renew(services: Services, event: dict[str, Any], context: LambdaContextLike) -> dict[str, Any]:
    key, epoch = event["ledger_key"], event["epoch"]
    store = services.store
    item = store.get(key)
    if item is None or item.epoch != epoch or not str(item.status).endswith("RUNNING"):
        return {"finished": True}
    if item.cancel_reason or item.handover_requested:
        return {"finished": True}
    protocol = services.protocol
    renew_seconds = float(services.settings.lease_renew_seconds)
    if protocol.lease_renewable:
        try:
            services.call(lambda p: p.renew(item.delivery))
        except LeaseRefusedError as refusal:
            store.request_cancel(key, epoch, f"renewal refused: {refusal.reason}")
            from .metrics import metrics

            metrics.add("LeasesLost", 1)
            metrics.flush()
            services.events.add("job.lease_lost", f"job {item.delivery.job_id}: {refusal.reason}", level="WARN")
            services.events.flush(services.protocol)
            return {"finished": True, "refused": True}
        except ProtocolError as err:
            log.warning("renewal failed; will retry at the next cycle: %s", err)
    if item.callback_token:
        _callback_heartbeat(services, item.callback_token)
    cycles = store.renew_deadline(key, epoch, deadline=services.clock() + 3 * renew_seconds + 60)
    if cycles >= MAX_RENEW_CYCLES and not item.callback_token:
        store.request_handover(key, epoch)
        return {"finished": True, "handover": True}
    return {"finished": False}


def start_callback(services: Services, event: dict[str, Any], context: LambdaContextLike) -> dict[str, Any]:
    """Run the handler with the task token; it starts external work that will later call
    SendTaskSuccess/Failure. A handler that fails to start the work fails the task now."""
    from ..runner import run_handler

    key, epoch, token = event["ledger_key"], event["epoch"], event["task_token"]
    store = services.store
    item = store.get(key)
    if item is None or item.epoch != epoch:
        _sfn(services).send_task_failure(taskToken=token, error="NotOwner", cause="the run lost its epoch")
        return {"started": False}
    store.save_callback_token(key, epoch, token)
    spec = services.registry.get(item.delivery.handler)
    budget = max(1.0, _remaining(context) - services.settings.report_margin_seconds)
    result = run_handler(spec, item.delivery, budget_seconds=budget, callback_token=token,
                         progress=lambda value: _progress(services, item.delivery, value))
    outcome = result.outcome
    if outcome is not None and outcome.kind is not OutcomeKind.SUCCESS:
        store.store_outcome(key, epoch, outcome)
        _sfn(services).send_task_failure(taskToken=token, error="HandlerFailed",
                                         cause=f"{outcome.kind.value}: {outcome.error_code or ''}"[:256])
    return {"started": True}


def finish_callback(services: Services, event: dict[str, Any], context: LambdaContextLike) -> dict[str, Any]:
    key, epoch = event["ledger_key"], event["epoch"]
    item = services.store.get(key)
    if item is not None and item.epoch == epoch and str(item.status).endswith("RUNNING"):
        if "error" in event and event["error"] is not None:
            error = event["error"] or {}
            kind = OutcomeKind.TIMEOUT if error.get("Error") == "States.Timeout" else OutcomeKind.FAILURE
            outcome = Outcome(kind=kind, error_code=str(error.get("Error") or "CALLBACK_FAILED")[:64],
                              message=str(error.get("Cause") or "")[:4096])
        else:
            outcome = Outcome(kind=OutcomeKind.SUCCESS, value=event.get("output"))
        services.store.store_outcome(key, epoch, outcome)
    return {"continue": False, "handover": False}


def report_step(services: Services, event: dict[str, Any], context: LambdaContextLike) -> dict[str, Any]:
    key = event["ledger_key"]
    item = services.store.get(key)
    if item is None:
        return {"reported": False}
    status = str(item.status)
    if status.endswith("RUNNING") and item.handover_requested and item.epoch == event.get("epoch"):
        # The run stopped at a slice boundary to continue in a fresh execution.
        return {"reported": False, "handover": True}
    if status.endswith("OUTCOME_STORED") and item.outcome is not None:
        if item.outcome.kind is OutcomeKind.NOT_STARTED:
            hand_back(services, key, item.delivery, item.outcome.message or "not started")
        elif item.outcome.kind is OutcomeKind.LEASE_LOST:
            discard(services, key, item.delivery, "lease lost while running")
        else:
            receipt = report(services, key, item.delivery, item.outcome)
            return {"reported": True, "accepted": receipt.accepted, "handover": False}
    return {"reported": False, "status": status, "handover": False}


def ack_step(services: Services, event: dict[str, Any], context: LambdaContextLike) -> dict[str, Any]:
    key = event["ledger_key"]
    item = services.store.get(key)
    if item is not None and str(item.status).endswith("REPORTED"):
        acknowledge(services, key, item.delivery)
        return {"acknowledged": True}
    return {"acknowledged": False}


def give_back(services: Services, event: dict[str, Any], context: LambdaContextLike) -> dict[str, Any]:
    """The execution failed somewhere: give the job a definite outcome anyway."""
    import uuid

    key = event["ledger_key"]
    store = services.store
    item = store.get(key)
    if item is None:
        return {"action": "missing"}
    status = str(item.status)
    now = services.clock()
    error = event.get("error") or {}
    if status.endswith(("RECORDED", "DISPATCHED")):
        if store.start_run(key, epoch=handback_epoch(), deadline=now + 60) is not None:
            hand_back(services, key, item.delivery, f"state machine failed: {error.get('Error', '')}")
            return {"action": "handed_back"}
    if status.endswith("RUNNING"):
        epoch = f"giveback:{uuid.uuid4()}"
        if store.take_over(key, old_epoch=item.epoch, new_epoch=epoch, deadline=now + 60):
            outcome = Outcome(kind=OutcomeKind.FAILURE, error_code="STATE_MACHINE_ERROR",
                              message=str(error.get("Error") or "execution failed")[:256])
            store.store_outcome(key, epoch, outcome)
            settle(services, key, item.delivery, outcome)
            return {"action": "failed"}
    item = store.get(key)
    if item is not None and str(item.status).endswith("OUTCOME_STORED") and item.outcome is not None:
        settle(services, key, item.delivery, item.outcome)
        return {"action": "settled"}
    if item is not None and str(item.status).endswith("REPORTED"):
        acknowledge(services, key, item.delivery)
        return {"action": "acknowledged"}
    return {"action": "none", "status": status}


def continue_as_new(services: Services, event: dict[str, Any], context: LambdaContextLike) -> dict[str, Any]:
    key, epoch = event["ledger_key"], event["epoch"]
    services.store.clear_handover(key, epoch)
    services.dispatcher.start_execution(key, handover_epoch=epoch)  # type: ignore[union-attr]
    return {"handed_over": True}


STEPS: dict[str, Callable[[Services, dict[str, Any], LambdaContextLike], dict[str, Any]]] = {
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
        return STEPS[step](services, event, context)


def _progress(services: Services, delivery: Any, value: Any) -> None:
    try:
        services.protocol.progress(delivery, value)
    except ProtocolError as err:
        log.info("progress not reported: %s", err)


def _sfn(services: Services) -> Any:
    client = getattr(services.dispatcher, "sfn_client", None)
    if client is None:
        import boto3

        client = boto3.client("stepfunctions")
    return client


def _callback_heartbeat(services: Services, token: str) -> None:
    try:
        _sfn(services).send_task_heartbeat(taskToken=token)
    except Exception as err:  # the task may have finished or timed out meanwhile
        log.info("callback heartbeat not sent: %s", type(err).__name__)


class _CancelWatcher:
    """Polls the ledger for a cancellation requested by the renew branch."""

    def __init__(self, services: Services, key: str, epoch: str, cancel: threading.Event, every: float) -> None:
        self._services, self._key, self._epoch, self._cancel = services, key, epoch, cancel
        self._every = max(0.2, every)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="cancel-watch")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:
                item = self._services.store.get(self._key)
            except Exception:
                continue
            if item is None or item.epoch != self._epoch or item.cancel_reason:
                self._cancel.set()
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
