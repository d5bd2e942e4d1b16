"""One delivery, start to finish, in one invocation: claim it in the ledger, then run the
rest of the delivery pipeline in one go (``runtime/pipeline.py``: take the lease, run the
handler within its time budget, store the outcome, report, acknowledge).

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
from typing import Any

from ..model import LedgerStatus
from ..state.errors import StaleWriteError
from . import outcomes
from .context import LambdaContextLike
from .pipeline import claim, deliver
from .services import Services
from .settle import acknowledge, settle

__all__ = ["execute", "resume"]

log = logging.getLogger("serverless_worker.executor")


def execute(services: Services, ledger_key: str, context: LambdaContextLike) -> dict[str, Any]:
    """Executor entry: claim the delivery behind ``ledger_key`` and run it once (``pipeline.deliver``)."""
    now = services.clock()
    remaining = context.get_remaining_time_in_millis() / 1000  # ~ the invocation's whole timeout
    with services.flushing_events():
        item = claim(services.store, ledger_key, epoch=context.aws_request_id, deadline=now + remaining + 30)
        if item is None:
            return resume(services, ledger_key)
        if item.runs > 1:
            # Lambda retries an async invocation with the same request id: a run under our
            # epoch already started and died mid-handler. Never run the handler twice;
            # settle it as a run that ran out of time.
            outcome = outcomes.executor_lost()
            services.store.store_outcome(ledger_key, context.aws_request_id, outcome)
            settlement = settle(services.settler(), ledger_key, item.delivery, outcome)
            return {"ledger_key": ledger_key, "action": settlement.action, "detail": "executor lost"}
        try:
            settlement = deliver(services, ledger_key, item.delivery, epoch=context.aws_request_id,
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
    if item.status is LedgerStatus.OUTCOME_STORED and item.outcome is not None:
        settlement = settle(services.settler(), ledger_key, item.delivery, item.outcome)
        return {"ledger_key": ledger_key, "action": settlement.action, "resumed": True}
    if item.status is LedgerStatus.REPORTED:
        acknowledge(services.settler(), ledger_key, item.delivery)
        return {"ledger_key": ledger_key, "action": "acknowledged", "resumed": True}
    return {"ledger_key": ledger_key, "action": "skipped", "status": str(item.status)}
