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

Where executors keep pulling (setting ``self_pull``), an executor whose delivery came from
a full pull, or a puller the scheduler started, goes on with the next delivery of the same
handler itself (``runtime/self_pull.py``): recorded and claimed in one write, so such a
job costs three.
"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import RateLimitedError
from ..model import LedgerStatus
from ..state.errors import StaleWriteError
from . import outcomes
from .context import LambdaContextLike, invocation_time_limit
from .pipeline import claim, deliver
from .pulling import long_running
from .retry_owners import CLIENT_RETRIED
from .self_pull import SelfPull, keep_pulling
from .services import Services
from .settle import acknowledge, settle

__all__ = ["execute", "execute_or_defer", "pull_for", "resume"]

log = logging.getLogger("serverless_worker.executor")


def execute_or_defer(services: Services, ledger_key: str, context: LambdaContextLike, *,
                     pull: bool = False) -> dict[str, Any]:
    """:func:`execute` as an invocation runs it (Lambda's entry, the local runner's executor
    threads): no wait outlasts the invocation, and a settling call the client gave up on (an
    outage, a Retry-After beyond the time left) ends the invocation ``deferred``: its outcome
    is stored and the failure noted on the ledger item, where the reaper (or the local
    runner's next run) takes it up at the noted time. Raising would only have Lambda retry
    the same call again (docs/retries.md). Logged once, in one line, with why."""
    try:
        with invocation_time_limit(context):
            return execute(services, ledger_key, context, pull=pull)
    except CLIENT_RETRIED as err:
        why = f"; {err.not_waited}" if isinstance(err, RateLimitedError) and err.not_waited else ""
        log.warning("delivery %s: its outcome is stored, but %s%s; left to the reaper and the next run, which "
                    "report it: nothing is lost", ledger_key, err, why)
        return {"ledger_key": ledger_key, "action": "deferred", "error": type(err).__name__}


def execute(services: Services, ledger_key: str, context: LambdaContextLike, *,
            pull: bool = False) -> dict[str, Any]:
    """Executor entry: claim the delivery behind ``ledger_key`` and run it once (``pipeline.deliver``).

    With ``pull`` (the scheduler's pull that brought it came back full) and ``self_pull`` on,
    the executor then keeps pulling for the same handler (``runtime/self_pull.py``); the
    result adds ``self_pulled`` and ``stopped``."""
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
        loop = _loop(services, context, item.delivery.handler, taken=1) if pull else None
        try:
            settlement = deliver(services, ledger_key, item.delivery, epoch=context.aws_request_id,
                                 remaining=lambda: context.get_remaining_time_in_millis() / 1000,
                                 lambda_limit=remaining, settler=loop.settler() if loop is not None else None)
        except StaleWriteError:
            # The reaper (or a newer run) took the delivery over while this run was still
            # going, and has given it its outcome: ours must not be stored or reported. That
            # is settled, not a failure; raising would only make Lambda retry the event.
            log.warning("run of %s was taken over (the reaper or a newer run owns it) before its outcome was "
                        "stored: that outcome is lost; the owner settles the job", ledger_key)
            return {"ledger_key": ledger_key, "action": "superseded", **_ended(loop, "superseded")}
        except BaseException:
            _ended(loop, "pull_error")
            raise
        result: dict[str, Any] = {"ledger_key": ledger_key, "action": settlement.action,
                                  "detail": settlement.detail}
        if loop is not None:
            loop.after(settlement)
            loop.run()
            result.update(self_pulled=loop.self_pulled, stopped=loop.stopped, **_unasked(loop))
        return result


def pull_for(services: Services, handler: str, by: float, context: LambdaContextLike) -> dict[str, Any]:
    """A puller (started by the scheduler after a full pull): pull for ``handler`` while
    the backlog lasts, taking its first slot only while one is free; invoked after ``by``
    (its reservation lapsed), it does nothing."""
    if services.clock() > by:
        log.info("puller for %s invoked after its reservation ended; not pulling", handler)
        return {"handler": handler, "action": "late"}
    with services.flushing_events():
        loop = _loop(services, context, handler, taken=0)
        if loop is None:
            return {"handler": handler, "self_pulled": [], "stopped": "refused"}
        loop.first()
        loop.run()
        return {"handler": handler, "self_pulled": loop.self_pulled, "stopped": loop.stopped, **_unasked(loop)}


def _unasked(loop: SelfPull) -> dict[str, int]:
    """``not_asked_for``: the deliveries its pulls gave back untouched, when there were any."""
    return {"not_asked_for": loop.not_asked_for} if loop.not_asked_for else {}


def _loop(services: Services, context: LambdaContextLike, handler: str, *, taken: int) -> SelfPull | None:
    """The self-pull loop for ``handler``: none with ``self_pull`` off (today's executor
    exactly), nor for a long-running handler (those go to the state machine)."""
    if not services.settings.self_pull or long_running(services, handler):
        return None
    return keep_pulling(services, context, handler, first_full=True, taken=taken)


def _ended(loop: SelfPull | None, reason: str) -> dict[str, Any]:
    """End ``loop`` early (its delivery failed): hand back what it pulled and not run."""
    if loop is None:
        return {}
    loop.end(reason)
    return {"self_pulled": loop.self_pulled, "stopped": loop.stopped}


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
