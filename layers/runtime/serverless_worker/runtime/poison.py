"""A delivery the ledger cannot hold gets its own definite outcome; its batch runs on.

A job whose content nests past the serialisation depth, is not valid Unicode or makes a
ledger item past the limit, or whose id cannot be part of a key, can never be recorded
(``state.items.recordable``), so it can never be dispatched: the runtime dispatches only
what the ledger holds. Failing the tick instead would strand every other job pulled with
it, and on Priostack, whose jobs never expire, for good.

So the scheduler settles such a delivery on its own, at once, with no ledger item: it
is reported as bad input (``VALIDATION_ERROR``, docs/outcomes.md: Priostack ``fail`` with
``retries: 0``, a claim-queue result with the error, a Pipelogiq result after taking its
lease) naming the reason, and acknowledged. Nothing fences a second delivery of it, so a
redelivery is settled the same way again; the handler never runs for it.

Where no request can name it (an id that is not valid Unicode), or the server refuses or
fails the calls, it is left to the server's own timeout (the claim queue's lease, the
Pipelogiq visibility timeout; a Priostack job stays active until the server restarts):
logged as an error with its id and why, an event, and counted as unsettled so a local
run does not end as if every delivery had an outcome.
"""

from __future__ import annotations

import logging

from ..errors import LeaseRefusedError, ProtocolError
from ..model import Delivery, Outcome, OutcomeKind
from ..state.errors import UnrecordableDeliveryError
from .services import Services
from .settle import count_settled

__all__ = ["SETTLED", "UNSETTLED", "settle_unrecordable"]

log = logging.getLogger("serverless_worker.poison")

SETTLED = "unrecordable_settled"      # its outcome is with the server (or the server's recovery owns it)
UNSETTLED = "unrecordable_unsettled"  # left to the server's timeout: nothing we sent settled it


def settle_unrecordable(services: Services, delivery: Delivery, err: UnrecordableDeliveryError) -> tuple[str, str]:
    """Report ``delivery`` as bad input and acknowledge it; ``(SETTLED or UNSETTLED, why)``."""
    job = ascii(delivery.job_id)  # the id itself may be what is poisoned: never log it raw
    reason = f"the worker cannot record this job: {err.reason}"
    log.error("job %s cannot be recorded (%s); reporting it as VALIDATION_ERROR without running it",
              job, err.reason)
    unaddressable = _unaddressable(delivery)
    if unaddressable is not None:
        return _unsettled(services, delivery, f"{err.reason}; {unaddressable}")
    outcome = Outcome(kind=OutcomeKind.BAD_INPUT, error_code="VALIDATION_ERROR", message=reason)
    try:
        if services.protocol.has_lease:
            services.call(lambda p: p.acquire(delivery))  # a result needs the lease (Pipelogiq)
        receipt = services.call(lambda p: p.report(delivery, outcome))
    except LeaseRefusedError as refusal:
        # Not ours to settle: the server's recovery owns it (as for any refused lease).
        try:
            services.call(lambda p: p.discard(delivery))
        except ProtocolError as ack_err:
            log.warning("refused unrecordable job %s not acknowledged: %s", job, ack_err)
        _event(services, delivery, f"{err.reason}; lease refused: {refusal.reason}")
        count_settled(services.settler(), None, delivery=delivery, discarded=1)
        return SETTLED, f"{err.reason}; lease refused ({refusal.reason})"
    except (ProtocolError, ValueError) as call_err:
        return _unsettled(services, delivery, f"{err.reason}; reporting it failed: {type(call_err).__name__}")
    try:
        services.call(lambda p: p.acknowledge(delivery))
    except ProtocolError as ack_err:  # the result is in; an ack that fails proves nothing more
        log.warning("unrecordable job %s reported, acknowledgement failed: %s", job, ack_err)
    _event(services, delivery, f"{err.reason}; reported as VALIDATION_ERROR ({receipt.status or 'accepted'})")
    count_settled(services.settler(), outcome, delivery=delivery)
    return SETTLED, f"{err.reason}; reported as VALIDATION_ERROR"


def _unaddressable(delivery: Delivery) -> str | None:
    """Why no request can name ``delivery``, or ``None``. An id that is not valid Unicode
    has no form in a URL the server would map back to it; a guess could name another job."""
    try:
        delivery.job_id.encode("utf-8")
    except UnicodeEncodeError:
        return "so no request can name it"
    return None


def _unsettled(services: Services, delivery: Delivery, why: str) -> tuple[str, str]:
    log.error("job %s is left to the server's own timeout, without an outcome: %s", ascii(delivery.job_id), why)
    _event(services, delivery, f"{why}; left without an outcome", level="ERROR")
    if services.watcher is not None:
        try:
            services.watcher.unsettled(delivery.job_id, why)
        except Exception:  # informational, as in settle.count_settled
            log.warning("delivery watcher failed", exc_info=True)
    return UNSETTLED, why


def _event(services: Services, delivery: Delivery, message: str, *, level: str = "WARN") -> None:
    job = ascii(delivery.job_id)
    services.events.add("job.unrecordable", f"job {job}: {message}", level=level, job_id=job)
