"""One delivery as a sequence of small steps: claim → lease → budget → run → store →
report → ack.

The executor runs the whole sequence in one invocation (:func:`deliver`, after its
claim); the state machine's steps (``runtime/steps.py``) run the same steps one Lambda
task at a time. Each step takes the collaborators it uses (the ledger store, the
protocol client, the clock) rather than the whole runtime; the steps that settle a
delivery (report, ack, hand back, discard) go through ``runtime/settle.py``, which takes
a ``Settler`` of its own collaborators, and the lease keeper and progress reporter take
the client and the events. The time a run may take is sized in ``runtime/budget.py``,
and the outcomes the runtime itself gives are built in ``runtime/outcomes.py``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, TypeVar

from ..errors import LeaseRefusedError, PayloadTooLargeError, ProtocolError, UnknownHandlerError
from ..model import Delivery, Lease, Outcome
from ..protocols.base import WorkerProtocol
from ..state.errors import StaleWriteError
from ..waits import time_limit
from . import outcomes
from .budget import budget_fits, lapsed_at_grant, lease_never_fits, never_fits, time_budget
from .fit import lease_bound_confirmed, lease_fitted, report_unfit
from .lease import LeaseKeeper
from .progress import progress_reporter
from .protocol_client import ProtocolCaller
from .settle import Settlement, Settler, discard, hand_back, settle

if TYPE_CHECKING:
    from ..registry import HandlerRegistry, HandlerSpec
    from ..state.base import StateStore
    from ..state.items import LedgerItem
    from .services import Services

__all__ = ["ProtocolCaller", "claim", "deliver", "find_handler", "lease_bound", "settle_lapsed", "settle_refusal",
           "store_if_owned", "store_outcome", "take_lease"]

log = logging.getLogger("serverless_worker.pipeline")
T = TypeVar("T")


# -- claim -----------------------------------------------------------------------------------------
def claim(store: StateStore, key: str, *, epoch: str, deadline: float) -> LedgerItem | None:
    """Take the ledger item for the run ``epoch`` (a conditional write that returns the item);
    ``None`` when someone else owns it or it is already past running."""
    return store.start_run(key, epoch=epoch, deadline=deadline)


# -- lease -----------------------------------------------------------------------------------------
def take_lease(client: ProtocolCaller, delivery: Delivery, *, handover: bool = False,
               retried: bool = False) -> Lease:
    """Acquire the lease. A continued execution (``handover``) refreshes the one its
    predecessor holds, and a retried claim (``retried``: the item was already claimed by this
    epoch) reconciles first: acquire is not reentrant, so acquiring again would refuse our own lease."""
    if (handover or retried) and client.protocol.lease_renewable:
        try:
            return client.call(lambda p: p.renew(delivery))
        except LeaseRefusedError as refusal:
            if handover or refusal.reason != "lease_not_acquired":
                raise
    return client.call(lambda p: p.acquire(delivery))


def find_handler(registry: HandlerRegistry, delivery: Delivery) -> HandlerSpec | Outcome:
    """The handler the delivery names, or the ``UNKNOWN_HANDLER`` outcome to store instead."""
    try:
        return registry.get(delivery.handler)
    except UnknownHandlerError as err:
        return outcomes.unknown_handler(err)


def lease_bound(spec: HandlerSpec, lease: Lease, protocol: WorkerProtocol) -> Lease | None:
    """The lease that bounds the run: none for a handler opted in to run past it where late
    results count (docs/timeouts.md)."""
    return None if spec.run_past_lease and protocol.late_results else lease


def settle_lapsed(services: Services, key: str, delivery: Delivery, why: str) -> Settlement:
    """A lease granted already over (``budget.lapsed_at_grant``): never run under it. Settled as a
    lost lease: discarded, so the server's recovery (Pipelogiq) or the lease's lapse (the claim
    queue) offers the job again; this one delivery only, never the worker's configuration."""
    log.warning("job %s not run: %s", delivery.job_id, why)
    services.events.add("job.lease_lapsed", f"job {delivery.job_id}: {why}", level="WARN", job_id=delivery.job_id)
    return discard(services.settler(), key, delivery, f"not run: {why}")


def settle_refusal(services: Services, key: str, delivery: Delivery, refusal: LeaseRefusedError) -> Settlement:
    """Never run a refused delivery. Every refusal settles the delivery (ack without
    requeue): stale and duplicate deliveries are dropped, and for ``lease_expired`` the
    server's recovery publishes a fresh execution, so requeueing this one would only
    come back stale. ``stop`` (application mismatch) also stops pulling."""
    services.events.add("job.lease_refused", f"job {delivery.job_id}: {refusal.reason}", level="WARN",
                        job_id=delivery.job_id, reason=refusal.reason)
    if refusal.action == "stop":
        log.error("lease refused with %s: stopping this worker; fix its configuration", refusal.reason)
        services.store.set_stopped(services.protocol_name, services.instance, f"lease refused: {refusal.reason}")
    return discard(services.settler(), key, delivery, f"lease refused: {refusal.reason} ({refusal.action})")


# -- store -----------------------------------------------------------------------------------------
def store_outcome(store: StateStore, key: str, epoch: str, outcome: Outcome, *,
                  delivery: Delivery | None = None) -> Outcome:
    """Store ``outcome`` and return what was stored: an outcome too large for the ledger
    item (a result of several hundred KB) is stored, and so reported, as a
    RESULT_TOO_LARGE failure instead, never left to crash the invocation. A run that no
    longer owns the item gets the ``StaleWriteError``."""
    try:
        store.store_outcome(key, epoch, outcome)
        return outcome
    except PayloadTooLargeError as err:
        # One message for every path: whose outcome (handler and job when known, the ledger
        # key) and its size against the limit, never the outcome itself.
        whose = f"handler {delivery.handler!r} (job {delivery.job_id}), " if delivery is not None else ""
        fallback = outcomes.result_too_large(f"{whose}delivery {key}: its {outcome.kind.value} outcome is "
                                             f"{err.size} bytes, over the state store's item limit of "
                                             f"{err.limit} bytes"[:1024])
        log.error("outcome does not fit the ledger; storing a RESULT_TOO_LARGE failure: %s", fallback.message)
        store.store_outcome(key, epoch, fallback)
        return fallback


def store_if_owned(store: StateStore, key: str, epoch: str, outcome: Outcome, *,
                   delivery: Delivery | None = None) -> bool:
    """:func:`store_outcome` for a step of the state machine; ``False`` when this run no
    longer owns the item (nothing to do then)."""
    try:
        store_outcome(store, key, epoch, outcome, delivery=delivery)
    except StaleWriteError:
        log.warning("run %s no longer owns delivery %s (the reaper or a newer run took it over): its outcome "
                    "was not stored, and is lost; the owner settles the job", epoch, key)
        return False
    return True


# -- the executor's sequence, in one go --------------------------------------------------------------
def deliver(services: Services, key: str, delivery: Delivery, *, epoch: str, remaining: Callable[[], float],
            lambda_limit: float | None = None, settler: Settler | None = None) -> Settlement:
    """Lease, size the budget, run, store, settle a delivery this invocation has claimed
    (status RUNNING, our epoch). A job handed back or refused before waits out its back-off
    first (``runtime/refusals.py``). ``settler`` settles a run's outcome (``services.settler()``
    unless given: an executor that keeps pulling passes one with its ``before_final`` hook)."""
    settings = services.settings
    pause = services.refusals.pause(delivery, remaining=remaining() - settings.report_margin_seconds,
                                    now=services.clock())
    if pause > 0:
        services.sleep(pause)
    try:
        lease = take_lease(services, delivery)
    except LeaseRefusedError as refusal:
        services.refusals.refused(delivery, f"lease refused: {refusal.reason}")
        return settle_refusal(services, key, delivery, refusal)
    except ProtocolError as err:
        # We could not learn whether we hold the lease; the handler has not started, so
        # handing back is safe and definite.
        services.refusals.refused(delivery, f"lease not acquired: {type(err).__name__}")
        log.warning("lease for job %s not acquired, handing it back: %s", delivery.job_id, err)
        return hand_back(services.settler(), key, delivery, f"lease not acquired: {type(err).__name__}", epoch=epoch)

    spec = find_handler(services.registry, delivery)
    if isinstance(spec, Outcome):
        services.store.store_outcome(key, epoch, spec)
        return settle(services.settler(), key, delivery, spec)

    bounding = lease_bound(spec, lease, services.protocol)
    lapsed = lapsed_at_grant(bounding, services.clock()) if bounding is not None else None
    if lapsed is not None:
        return settle_lapsed(services, key, delivery, lapsed)
    budget = time_budget(remaining_lambda=remaining(), report_margin=settings.report_margin_seconds,
                         handler_timeout=spec.timeout, job_timeout=delivery.timeout_seconds, lease=bounding,
                         now=services.clock())
    if not budget_fits(budget, spec.timeout):
        # A delivery whose remaining time cannot fit the handler's timeout is handed back.
        # When no delivery of this handler ever can (a fixed limit), say so and stop pulling it.
        by_lease = lease_never_fits(spec, delivery, bounding)
        if by_lease is not None:
            # Maybe an older lease a late duplicate carries: confirmed by the next delivery.
            why = by_lease if lease_bound_confirmed(spec.name) else None
        else:
            why = never_fits(spec, delivery, bounding, report_margin=settings.report_margin_seconds,
                             lambda_limit=remaining() if lambda_limit is None else lambda_limit)
        services.refusals.refused(delivery, "time budget cannot fit")
        if why is not None:
            report_unfit(services, spec, why)
            return hand_back(services.settler(), key, delivery, why, epoch=epoch)
        return hand_back(services.settler(), key, delivery, f"time budget {budget:.1f}s cannot fit the handler",
                         epoch=epoch)

    services.refusals.went_through(delivery)
    lease_fitted(spec.name)
    held: list[float | None] = [lease.expires_at]
    outcome = store_outcome(services.store, key, epoch, _run(services, delivery, spec, lease, budget, held),
                            delivery=delivery)
    with _within_lease(services, held[0]):
        return settle(settler or services.settler(), key, delivery, outcome)


def _within_lease(services: Services, expires_at: float | None) -> AbstractContextManager[None]:
    """Retry waits of the report end at the lease's end less the report margin, where a
    result after the lease is not taken (Pipelogiq: its recovery redispatches the job); past
    it the stored outcome is the reaper's. The claim queue takes a late result: no limit."""
    if expires_at is None or services.protocol.late_results:
        return nullcontext()
    end = expires_at - services.settings.report_margin_seconds
    clock = services.clock
    return time_limit(lambda: end - clock(), what="the job's lease end less the report margin")


def _run(services: Services, delivery: Delivery, spec: HandlerSpec, lease: Lease, budget: float,
         held: list[float | None]) -> Outcome:
    """Run the handler within ``budget``, renewing a renewable lease beside it; a lost lease
    cancels it. ``held[0]`` becomes the lease's end as last renewed."""
    from ..handler_runner import run_handler

    cancel = threading.Event()
    reason: list[str] = []

    def lost(why: str) -> None:
        reason.append(why)
        cancel.set()

    keeper = None
    if services.protocol.lease_renewable:
        keeper = LeaseKeeper(services.client, services.events, delivery, lease,
                             renew_every=services.settings.lease_renew_seconds, on_lost=lost,
                             clock=services.clock).start()
    try:
        result = run_handler(spec, delivery, budget_seconds=budget, cancel_event=cancel,
                             progress=progress_reporter(services.client, services.events, delivery, on_terminal=lost,
                                                        watcher=services.watcher))
    finally:
        if keeper is not None:
            keeper.stop()
            held[0] = keeper.expires_at
    # A Continue from a short handler is turned into a failure by the runner
    return result.outcome if result.outcome is not None else outcomes.no_outcome()
