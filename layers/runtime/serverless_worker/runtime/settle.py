"""Turn a stored outcome into its protocol calls: report then acknowledge, hand back,
or discard; and record each step in the ledger.

The outcome is already in the ledger when this runs, so any invocation (a retried
executor, the reaper, the state machine's report step) can settle it again without
running the handler again. A report that cannot be sent now raises, leaving the item at
OUTCOME_STORED for the next attempt.

Every function takes a :class:`Settler`: the collaborators settling uses (the ledger, the
job server's client, the worker events, the counters, the clock), built by
``Services.settler`` (the reaper's with a one-attempt client: docs/retries.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..errors import NotFoundError, PayloadTooLargeError, ResultNotAcceptedError, ServerlessWorkerError
from ..model import Delivery, Outcome, OutcomeKind, ReportReceipt
from ..state.rules import HANDBACK_EPOCH_PREFIX
from .events import EventBuffer
from .protocol_client import ProtocolCaller

if TYPE_CHECKING:
    from ..state.base import StateStore
    from .watcher import DeliveryWatcher

__all__ = ["Counting", "Settlement", "Settler", "settle", "hand_back", "discard", "report", "acknowledge",
           "handback_epoch", "note_failure", "retry_delay", "count_settled", "HANDBACK_PREFIX", "SETTLE_ATTEMPTS_MAX"]

# A settling call that fails after the client's own retries (the server down, answering
# garbage) is noted on its item, and the reaper is its one owner from then on
# (docs/retries.md): the item's deadline becomes the retry time, a back-off that doubles per
# failure up to SETTLE_RETRY_MAX_SECONDS, kept in the ledger, so no invocation waits it
# out; after SETTLE_ATTEMPTS_MAX failures in a row the reaper gives the item a final state
# (reaper.py). So every ledger item reaches a final state within a bounded time, whatever
# the server answers.
SETTLE_RETRY_BASE_SECONDS = 5.0
SETTLE_RETRY_MAX_SECONDS = 300.0
SETTLE_ATTEMPTS_MAX = 10

# Epochs of ledger claims taken only to hand a delivery back: the handler never ran
# under them, so a claim stranded by a failed hand-back call is handed back again,
# never settled as a run that died.
HANDBACK_PREFIX = HANDBACK_EPOCH_PREFIX


def handback_epoch() -> str:
    import uuid

    return f"{HANDBACK_PREFIX}{uuid.uuid4()}"

log = logging.getLogger("serverless_worker.settle")


class Counting(Protocol):
    """Where settled jobs are counted (``runtime.counters.CounterBuffer``)."""

    def add(self, **deltas: int) -> None: ...


@dataclass(frozen=True)
class Settler:
    """The collaborators settling uses. ``client`` makes the protocol calls: the container's
    (its full retry policy), or the reaper's one-attempt client, whose retries the ledger's
    noted retry time paces (:func:`retry_delay`). ``counters`` builds the counter buffer on
    first use; ``watcher`` is the local runner's live status (none in Lambda)."""

    store: StateStore
    client: ProtocolCaller
    events: EventBuffer
    counters: Callable[[], Counting]
    clock: Callable[[], float]
    watcher: DeliveryWatcher | None = None
    # Runs after the protocol's ack and before the final ledger write: an executor that
    # keeps pulling takes its next delivery there, so its slot never shows free between
    # the two (runtime/self_pull.py). A raising hook is logged; the final write still happens.
    before_final: Callable[[], None] | None = None


@dataclass(frozen=True)
class Settlement:
    """What settling did, for logs, metrics and tests."""

    action: str              # reported | handed_back | discarded
    accepted: bool = True
    detail: str = ""


def retry_delay(failures: int) -> float:
    """How long after its ``failures``-th failure in a row a settling call is tried again."""
    return min(SETTLE_RETRY_MAX_SECONDS, SETTLE_RETRY_BASE_SECONDS * 2.0 ** max(0, failures - 1))


def note_failure(settler: Settler, key: str, err: Exception) -> int:
    """Record a failed settling call: the item's deadline becomes the retry time, so it
    stops counting against capacity and the reaper tries again then. Returns the failures
    in a row (0 when the item is already final). Never raises: the caller re-raises ``err``."""
    store = settler.store
    try:
        failures = store.note_settle_failure(key, f"{type(err).__name__}: {err}",
                                             retry_at=settler.clock() + retry_delay(1))
        if failures > 1:  # the back-off grows with the count the write just returned
            store.postpone(key, settler.clock() + retry_delay(failures))
        return failures
    except ServerlessWorkerError as store_err:
        log.warning("settle failure of %s not recorded: %s", key, store_err)
        return 0


def settle(settler: Settler, key: str, delivery: Delivery, outcome: Outcome) -> Settlement:
    """Report + acknowledge, hand back or discard, as the outcome requires. A call that
    fails is noted on the item (:func:`note_failure`) before the error propagates."""
    result: Settlement = _noting(settler, key, _settle, settler, key, delivery, outcome)
    return result


def _is_stale(err: Exception) -> bool:
    from ..state.errors import StaleWriteError

    return isinstance(err, StaleWriteError)


def _settle(settler: Settler, key: str, delivery: Delivery, outcome: Outcome) -> Settlement:
    if outcome.kind is OutcomeKind.NOT_STARTED:
        return _hand_back(settler, key, delivery, outcome.message or "not started")
    if outcome.kind is OutcomeKind.LEASE_LOST:
        # Ownership moved to the server's recovery: no result from us, settle the delivery.
        return _discard(settler, key, delivery, "lease lost while running")
    receipt = _report(settler, key, delivery, outcome, record=False)
    # Only a report the server did not know needs to learn whether the final write applied;
    # any other the store may record without waiting (a crash before it lands re-settles).
    forgotten = receipt.status in ("not_found", "already_applied")
    if not _acknowledge(settler, key, delivery, receipt=receipt, wait=forgotten) \
            and forgotten and settler.store.clear_redelivered(key):
        # The server forgot this delivery (404) and has since delivered the job again (a
        # Priostack restart, then a re-activation dropped as a duplicate): report again, now
        # to the new activation, rather than strand the job with nobody holding it.
        receipt = _report(settler, key, delivery, outcome, record=False)
        _acknowledge(settler, key, delivery, receipt=receipt)
    count_settled(settler, outcome, delivery=delivery)
    return Settlement("reported", accepted=receipt.accepted, detail=receipt.status or "")


def report(settler: Settler, key: str, delivery: Delivery, outcome: Outcome) -> ReportReceipt:
    """Send the outcome and record it (:func:`_report`); a failed call is noted on the item,
    then raised: the reaper sends it again at the noted time (docs/retries.md)."""
    receipt: ReportReceipt = _noting(settler, key, _report, settler, key, delivery, outcome)
    return receipt


def _report(settler: Settler, key: str, delivery: Delivery, outcome: Outcome, *,
            record: bool = True) -> ReportReceipt:
    """Send the outcome (the client retries it); a too-large result becomes a failure.

    ``record=False`` leaves the ledger write to :func:`acknowledge` (one write, not two)."""
    try:
        receipt = settler.client.call(lambda p: p.report(delivery, outcome))
    except PayloadTooLargeError as err:
        log.error("result too large; reporting a failure instead: %s", err)
        fallback = Outcome(kind=OutcomeKind.FAILURE, error_code="RESULT_TOO_LARGE",
                           message=f"handler {delivery.handler!r} (job {delivery.job_id}): {err}")
        receipt = settler.client.call(lambda p: p.report(delivery, fallback))
    except ResultNotAcceptedError as err:
        # Someone else (or the queue's timeout) finished the job first: a definite outcome.
        receipt = ReportReceipt(accepted=False, status=err.item_status)
        settler.events.add("job.result_not_accepted", f"result for {delivery.job_id} not accepted: "
                            f"{err.item_status}", level="WARN", job_id=delivery.job_id)
    if record:
        settler.store.mark_reported(key, receipt)
    return receipt


def acknowledge(settler: Settler, key: str, delivery: Delivery, *,
                receipt: ReportReceipt | None = None) -> None:
    """Acknowledge a reported delivery; a failed call is noted on the item, then raised."""
    _noting(settler, key, _acknowledge, settler, key, delivery, receipt=receipt)


def _noting[**P, R](settler: Settler, key: str, fn: Callable[P, R], *args: P.args,
                    **kwargs: P.kwargs) -> R:
    """Run a settling step; a failure (not a lost fence) is noted on the item, then raised."""
    try:
        return fn(*args, **kwargs)
    except ServerlessWorkerError as err:
        if not _is_stale(err):
            note_failure(settler, key, err)
        raise


def _acknowledge(settler: Settler, key: str, delivery: Delivery, *,
                 receipt: ReportReceipt | None = None, wait: bool = True) -> bool:
    """Acknowledge and record it; ``False`` when the ledger refused the final write (with
    ``wait``: see ``StateStore.mark_acknowledged``)."""
    try:
        settler.client.call(lambda p: p.acknowledge(delivery))
    except NotFoundError as err:
        # The token expired, was already settled or was forgotten by a restart: the result is
        # in, recovery handles the rest. Where the protocol offers a read, verify the outcome.
        read = settler.client.protocol.reconcile(delivery)
        log.warning("acknowledgement not found: %s; server says %s", err, read)
        if read is not None:
            settler.events.add("job.ack_not_found", f"job {delivery.job_id}: ack not found; {read}",
                                level="WARN", job_id=delivery.job_id)
            if receipt is not None:
                receipt = receipt.model_copy(update={"detail": {**receipt.detail, "reconciled": read}})
    _before_final(settler)
    return settler.store.mark_acknowledged(key, receipt, wait=wait)


def _before_final(settler: Settler) -> None:
    """The settler's ``before_final`` hook, if any; its failure never blocks the final write."""
    if settler.before_final is None:
        return
    try:
        settler.before_final()
    except Exception:
        log.exception("before-final hook failed; writing the final state anyway")


def hand_back(settler: Settler, key: str, delivery: Delivery, reason: str, *,
              epoch: str | None = None) -> Settlement:
    """Return an unstarted delivery without using an attempt (:func:`_hand_back`); a
    failed call is noted on the item, then raised."""
    result: Settlement = _noting(settler, key, _hand_back, settler, key, delivery, reason, epoch=epoch)
    return result


def _hand_back(settler: Settler, key: str, delivery: Delivery, reason: str, *,
               epoch: str | None = None) -> Settlement:
    """Return an unstarted delivery without using an attempt.

    The ledger claim is first moved to a hand-back epoch, so that when the server
    redelivers the job before our final write, the scheduler records the redelivery
    afresh (instead of dropping it as a duplicate), and our final write, fenced by that
    epoch, cannot clobber the new item.
    """
    if epoch is not None and not epoch.startswith(HANDBACK_PREFIX):
        claim = handback_epoch()
        if settler.store.take_over(key, old_epoch=epoch, new_epoch=claim, deadline=settler.clock() + 60):
            epoch = claim
    try:
        settler.client.call(lambda p: p.hand_back(delivery))
    except NotFoundError as err:
        log.warning("hand back found nothing to return: %s", err)
    settler.store.mark_handed_back(key, reason, epoch=epoch)
    settler.events.add("job.handed_back", f"job {delivery.job_id} handed back: {reason}",
                        job_id=delivery.job_id)
    count_settled(settler, None, delivery=delivery, handed_back=1)
    return Settlement("handed_back", detail=reason)


def discard(settler: Settler, key: str, delivery: Delivery, reason: str) -> Settlement:
    """Drop a duplicate, stale or lost delivery without a result (a failed call is noted)."""
    result: Settlement = _noting(settler, key, _discard, settler, key, delivery, reason)
    return result


def _discard(settler: Settler, key: str, delivery: Delivery, reason: str) -> Settlement:
    try:
        settler.client.call(lambda p: p.discard(delivery))
    except NotFoundError as err:
        log.info("discard found nothing to settle: %s", err)
    settler.store.mark_discarded(key, reason)
    count_settled(settler, None, delivery=delivery, discarded=1)
    return Settlement("discarded", detail=reason)


def count_settled(settler: Settler, outcome: Outcome | None, *, delivery: Delivery | None = None,
                  **extra: int) -> None:
    """Count the settled job in this container's buffer: no DynamoDB write per job (the
    buffer writes a batch at most every ``counters_flush_seconds``); and tell the
    watcher, if any (the local runner's live status), which delivery it was."""
    deltas = dict(extra)
    if outcome is not None:
        deltas["processed"] = 1
        if not outcome.is_success:
            deltas["failed"] = 1
    try:
        settler.counters().add(**deltas)
    except Exception:  # counters are informational; never fail a settled job over them
        log.warning("counters not updated", exc_info=True)
    if settler.watcher is not None and delivery is not None:
        how = ("done" if outcome.is_success else "failed") if outcome is not None else \
            ("handed_back" if extra.get("handed_back") else "discarded")
        try:
            settler.watcher.settled(delivery, how)
        except Exception:  # as informational as the counters
            log.warning("delivery watcher failed", exc_info=True)
