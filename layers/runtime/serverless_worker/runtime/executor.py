"""One delivery, start to finish: claim it in the ledger, take the lease, run the
handler within its time budget, store the outcome, report, acknowledge.

The ledger claim (a conditional write that also returns the item) makes a duplicate
or retried invocation harmless: whoever does not own the run either settles an outcome
that is already stored or does nothing. The outcome is stored *before* it is reported,
so a crash after running never leads to running the handler again.

A job costs four ledger writes, and none can go: the scheduler's record (before
dispatch: the event carries only the key, and the reaper finds a lost dispatch); the
claim (fences a duplicate invocation, and its run count tells a retry that the handler
may have run); the stored outcome (before the report, so a retry re-reports it); the
final write after report and ack (leaves the in-flight index, so capacity frees up and
the reaper never re-reports). Counters are not among them (``runtime.counters``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import LeaseRefusedError, ProtocolError, UnknownHandlerError
from ..model import Delivery, Lease, Outcome, OutcomeKind
from ..state.errors import ItemTooLargeError, StaleWriteError
from .context import LambdaContextLike
from .fit import never_fits, report_unfit
from .lease import MIN_RUN_SECONDS, LeaseKeeper, lapsed_at_grant, time_budget
from .progress import progress_reporter
from .services import Services
from .settle import Settlement, acknowledge, discard, hand_back, settle

if TYPE_CHECKING:
    from ..registry import HandlerSpec

__all__ = ["budget_fits", "execute", "resume", "run_claimed", "settle_lapsed", "settle_refusal", "store_outcome"]

log = logging.getLogger("serverless_worker.executor")

# Status names as the state store spells them (see serverless_worker.state).
_RESUMABLE_REPORT = "OUTCOME_STORED"
_RESUMABLE_ACK = "REPORTED"


def execute(services: Services, ledger_key: str, context: LambdaContextLike) -> dict[str, Any]:
    """Executor entry: run the delivery behind ``ledger_key`` once."""
    now = services.clock()
    remaining = context.get_remaining_time_in_millis() / 1000  # ~ the invocation's whole timeout
    with services.flushing_events():
        item = services.store.start_run(ledger_key, epoch=context.aws_request_id, deadline=now + remaining + 30)
        if item is None:
            return resume(services, ledger_key)
        if item.runs > 1:
            # Lambda retries an async invocation with the same request id: a run under our
            # epoch already started and died mid-handler. Never run the handler twice;
            # settle it as a run that ran out of time.
            outcome = Outcome(kind=OutcomeKind.TIMEOUT, error_code="EXECUTOR_LOST",
                              message="a previous attempt of this invocation died mid-handler")
            services.store.store_outcome(ledger_key, context.aws_request_id, outcome)
            settlement = settle(services, ledger_key, item.delivery, outcome)
            return {"ledger_key": ledger_key, "action": settlement.action, "detail": "executor lost"}
        try:
            settlement = run_claimed(services, ledger_key, item.delivery, epoch=context.aws_request_id,
                                     remaining=lambda: context.get_remaining_time_in_millis() / 1000,
                                     lambda_limit=remaining)
        except StaleWriteError:
            # The reaper (or a newer run) took the delivery over while this run was still
            # going, and has given it its outcome: ours must not be stored or reported. That
            # is settled, not a failure; raising would only make Lambda retry the event.
            log.warning("run of %s was taken over before its outcome was stored; outcome dropped",
                        ledger_key)
            return {"ledger_key": ledger_key, "action": "superseded"}
        return {"ledger_key": ledger_key, "action": settlement.action, "detail": settlement.detail}


def resume(services: Services, ledger_key: str) -> dict[str, Any]:
    """Someone already claimed this delivery: finish what a crashed run left, never re-run."""
    item = services.store.get(ledger_key)
    if item is None:
        log.warning("ledger item %s not found; nothing to do", ledger_key)
        return {"ledger_key": ledger_key, "action": "missing"}
    status = str(item.status)
    if status.endswith(_RESUMABLE_REPORT) and item.outcome is not None:
        settlement = settle(services, ledger_key, item.delivery, item.outcome)
        return {"ledger_key": ledger_key, "action": settlement.action, "resumed": True}
    if status.endswith(_RESUMABLE_ACK):
        acknowledge(services, ledger_key, item.delivery)
        return {"ledger_key": ledger_key, "action": "acknowledged", "resumed": True}
    return {"ledger_key": ledger_key, "action": "skipped", "status": status}


def run_claimed(services: Services, ledger_key: str, delivery: Delivery, *, epoch: str,
                remaining: Callable[[], float], lambda_limit: float | None = None) -> Settlement:
    """Lease, run, store, settle a delivery this invocation owns (status RUNNING, our epoch).

    A job handed back or refused before waits out its back-off first (``runtime/refusals.py``)."""
    pause = services.refusals.pause(delivery, remaining=remaining() - services.settings.report_margin_seconds,
                                    now=services.clock())
    if pause > 0:
        services.sleep(pause)
    try:
        lease = services.call(lambda p: p.acquire(delivery))
    except LeaseRefusedError as refusal:
        services.refusals.refused(delivery, f"lease refused: {refusal.reason}")
        return settle_refusal(services, ledger_key, delivery, refusal)
    except ProtocolError as err:
        # We could not learn whether we hold the lease; the handler has not started, so
        # handing back is safe and definite.
        services.refusals.refused(delivery, f"lease not acquired: {type(err).__name__}")
        log.warning("lease for job %s not acquired, handing it back: %s", delivery.job_id, err)
        return hand_back(services, ledger_key, delivery, f"lease not acquired: {type(err).__name__}",
                         epoch=epoch)

    try:
        spec = services.registry.get(delivery.handler)
    except UnknownHandlerError as err:
        outcome = Outcome(kind=OutcomeKind.FAILURE, error_code="UNKNOWN_HANDLER", message=str(err))
        services.store.store_outcome(ledger_key, epoch, outcome)
        return settle(services, ledger_key, delivery, outcome)

    settings = services.settings
    # Opted in where late results count: the lease lapsing does not end the run (docs/timeouts.md).
    bounding = None if spec.run_past_lease and services.protocol.late_results else lease
    lapsed = lapsed_at_grant(bounding, services.clock()) if bounding is not None else None
    if lapsed is not None:
        return settle_lapsed(services, ledger_key, delivery, lapsed)
    budget = time_budget(remaining_lambda=remaining(), report_margin=settings.report_margin_seconds,
                         handler_timeout=spec.timeout, job_timeout=delivery.timeout_seconds, lease=bounding,
                         now=services.clock())
    if not budget_fits(budget, spec.timeout):
        # A delivery whose remaining time cannot fit the handler's timeout is handed back.
        # When no delivery of this handler ever can (a fixed limit), say so and stop pulling it.
        why = never_fits(spec, delivery, bounding, lambda_limit=remaining() if lambda_limit is None else lambda_limit,
                         report_margin=settings.report_margin_seconds)
        services.refusals.refused(delivery, "time budget cannot fit")
        if why is not None:
            report_unfit(services, spec, why)
            return hand_back(services, ledger_key, delivery, why, epoch=epoch)
        return hand_back(services, ledger_key, delivery, f"time budget {budget:.1f}s cannot fit the handler",
                         epoch=epoch)

    services.refusals.went_through(delivery)
    outcome = store_outcome(services, ledger_key, epoch, _run(services, delivery, spec, lease, budget),
                            subject=f"handler {delivery.handler!r} (job {delivery.job_id})")
    return settle(services, ledger_key, delivery, outcome)


def budget_fits(budget: float, handler_timeout: float | None) -> bool:
    """Whether a run of ``budget`` seconds may start: at least a second, and not less than
    the handler's declared timeout (a shorter run is handed back rather than cut short)."""
    return not (budget < MIN_RUN_SECONDS or (handler_timeout is not None and budget < handler_timeout))


def settle_lapsed(services: Services, ledger_key: str, delivery: Delivery, why: str) -> Settlement:
    """A lease granted already over (``lease.lapsed_at_grant``): never run under it. Settled as a
    lost lease: discarded, so the server's recovery (Pipelogiq) or the lease's lapse (the claim
    queue) offers the job again; this one delivery only, never the worker's configuration."""
    log.warning("job %s not run: %s", delivery.job_id, why)
    services.events.add("job.lease_lapsed", f"job {delivery.job_id}: {why}", level="WARN", job_id=delivery.job_id)
    return discard(services, ledger_key, delivery, f"not run: {why}")


def store_outcome(services: Services, ledger_key: str, epoch: str, outcome: Outcome, *,
                  subject: str = "the handler") -> Outcome:
    """Store ``outcome`` and return what was stored: an outcome too large for the ledger
    item (a result of several hundred KB) is stored, and so reported, as a
    RESULT_TOO_LARGE failure instead, never left to crash the invocation."""
    try:
        services.store.store_outcome(ledger_key, epoch, outcome)
        return outcome
    except ItemTooLargeError as err:
        log.error("outcome of job %s does not fit the ledger; storing a RESULT_TOO_LARGE failure: %s",
                  ledger_key, err)
        fallback = Outcome(kind=OutcomeKind.FAILURE, error_code="RESULT_TOO_LARGE",
                           message=f"{subject}: its {outcome.kind.value} outcome is {err.size} bytes, "
                                   f"over the state store's item limit of {err.limit} bytes")
        services.store.store_outcome(ledger_key, epoch, fallback)
        return fallback


def _run(services: Services, delivery: Delivery, spec: HandlerSpec, lease: Lease, budget: float) -> Outcome:
    from ..handler_runner import run_handler

    cancel = threading.Event()
    reason: list[str] = []

    def lost(why: str) -> None:
        reason.append(why)
        cancel.set()

    keeper = None
    if services.protocol.lease_renewable:
        keeper = LeaseKeeper(services, delivery, lease, renew_every=services.settings.lease_renew_seconds,
                             on_lost=lost, clock=services.clock).start()
    try:
        result = run_handler(spec, delivery, budget_seconds=budget, cancel_event=cancel,
                             progress=progress_reporter(services, delivery, on_terminal=lost))
    finally:
        if keeper is not None:
            keeper.stop()
    outcome: Outcome | None = result.outcome
    if outcome is None:  # a Continue from a short handler is turned into a failure by the runner
        outcome = Outcome(kind=OutcomeKind.FAILURE, error_code="NO_OUTCOME", message="handler produced no outcome")
    return outcome


def settle_refusal(services: Services, ledger_key: str, delivery: Delivery, refusal: LeaseRefusedError) -> Settlement:
    """Never run a refused delivery. Every refusal settles the delivery (ack without
    requeue): stale and duplicate deliveries are dropped, and for ``lease_expired`` the
    server's recovery publishes a fresh execution, so requeueing this one would only
    come back stale. ``stop`` (application mismatch) also stops pulling."""
    services.events.add("job.lease_refused", f"job {delivery.job_id}: {refusal.reason}", level="WARN",
                        job_id=delivery.job_id, reason=refusal.reason)
    if refusal.action == "stop":
        log.error("lease refused with %s: stopping this worker; fix its configuration", refusal.reason)
        services.store.set_stopped(services.protocol_name, services.instance, f"lease refused: {refusal.reason}")
    return discard(services, ledger_key, delivery, f"lease refused: {refusal.reason} ({refusal.action})")
