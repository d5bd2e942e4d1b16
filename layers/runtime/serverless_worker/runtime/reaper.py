"""Find deliveries stranded past their deadline and give each a definite outcome.

Never started (recorded or dispatched, the executor never claimed it): hand back.
Started but the executor vanished (killed, timed out hard): settle as a timeout, the
same outcome as a handler that ran past its budget. Outcome stored but not reported,
or reported but not acknowledged: finish settling. Each step first claims the item in
the ledger with a conditional write, so a late executor and the reaper never both act.

Its protocol calls are tried once each (``Services.reaper_client``): a settling call that
fails moves the item's deadline to its retry time (settle.py), a back-off kept in the
ledger and the reaper's only one (docs/retries.md). After ``SETTLE_ATTEMPTS_MAX`` failures
in a row the item is abandoned: a reported one is marked acknowledged (the server has its outcome), any other is
discarded and marked unknown to the server, so the job's return is recorded again.
Either way it is final within a bounded time, whatever the server answers, and an
ERROR event and the ``SettleAbandoned`` metric say so.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Literal

from ..errors import ServerlessWorkerError
from ..model import LedgerStatus, Outcome, OutcomeKind
from ..state.items import LedgerItem
from .services import Services
from .settle import HANDBACK_PREFIX, SETTLE_ATTEMPTS_MAX, Settler, acknowledge, hand_back, handback_epoch, settle

__all__ = ["ReapAction", "ReapReport", "reap", "reap_action"]

log = logging.getLogger("serverless_worker.reaper")


ReapAction = Literal["abandon", "hand_back", "hand_back_again", "time_out", "resettle", "acknowledge"]


def reap_action(item: LedgerItem) -> ReapAction | None:
    """What the reaper does with a stranded ``item``, decided from the item alone (pure,
    so each case is tested as a table); ``None``: nothing it can finish."""
    status = str(item.status)
    if item.settle_failures >= SETTLE_ATTEMPTS_MAX:
        return "abandon"
    if status.endswith(("RECORDED", "DISPATCHED", "DISPATCH_FAILED")):
        return "hand_back"
    if status.endswith("RUNNING") and str(item.epoch or "").startswith(HANDBACK_PREFIX):
        return "hand_back_again"
    if status.endswith("RUNNING"):
        return "time_out"
    if status.endswith("OUTCOME_STORED") and item.outcome is not None:
        return "resettle"
    if status.endswith("REPORTED"):
        return "acknowledge"
    return None


@dataclass
class ReapReport:
    handed_back: int = 0
    timed_out: int = 0
    resettled: int = 0
    abandoned: int = 0
    failed: int = 0

    @property
    def total(self) -> int:
        return self.handed_back + self.timed_out + self.resettled + self.abandoned


def reap(services: Services, *, limit: int = 50, grace: float = 30.0) -> ReapReport:
    """Settle up to ``limit`` stranded deliveries of this worker instance."""
    store = services.store
    settler = services.settler(reaping=True)  # one attempt per call: the item's retry time paces it
    report = ReapReport()
    now = services.clock()
    for item in store.stranded(services.protocol_name, services.instance, now)[:limit]:
        epoch = f"reaper:{uuid.uuid4()}"
        action = reap_action(item)
        running = item.epoch  # the run holding a RUNNING item (always set for one)
        try:
            if action == "abandon":
                report.abandoned += _abandon(services, item)
            elif action == "hand_back":
                claim = handback_epoch()
                if store.start_run(item.key, epoch=claim, deadline=now + grace) is not None:
                    hand_back(settler, item.key, item.delivery, "never started before its deadline", epoch=claim)
                    report.handed_back += 1
            elif action == "hand_back_again" and running is not None:
                # A hand-back whose call failed: the handler never ran, so hand back again.
                claim = handback_epoch()
                if store.take_over(item.key, old_epoch=running, new_epoch=claim, deadline=now + grace):
                    hand_back(settler, item.key, item.delivery, "earlier hand-back did not complete",
                              epoch=claim)
                    report.handed_back += 1
            elif action == "time_out" and running is not None and _lease_untaken(settler, item):
                # The run died before taking its lease (Pipelogiq leases after the pull): the
                # handler never ran, and a result would be refused; hand the job back.
                claim = handback_epoch()
                if store.take_over(item.key, old_epoch=running, new_epoch=claim, deadline=now + grace):
                    hand_back(settler, item.key, item.delivery, "the executor stopped before taking its lease",
                              epoch=claim)
                    report.handed_back += 1
            elif action == "time_out" and running is not None:
                if store.take_over(item.key, old_epoch=running, new_epoch=epoch, deadline=now + grace):
                    outcome = Outcome(kind=OutcomeKind.TIMEOUT, error_code="EXECUTOR_LOST",
                                      message="the executor stopped before storing an outcome")
                    store.store_outcome(item.key, epoch, outcome)
                    settle(settler, item.key, item.delivery, outcome)
                    report.timed_out += 1
            elif action == "resettle" and item.outcome is not None:
                settle(settler, item.key, item.delivery, item.outcome)
                report.resettled += 1
            elif action == "acknowledge":
                acknowledge(settler, item.key, item.delivery)
                report.resettled += 1
        except ServerlessWorkerError as err:
            report.failed += 1
            log.warning("could not reap %s (%s); the next tick's reaper tries again (nothing is lost yet)",
                        item.key, err)
    if report.total:
        services.events.add("worker.reaped", f"settled {report.total} stranded deliveries: {_reaped(report)}",
                            level="WARN",
                            handed_back=report.handed_back, timed_out=report.timed_out,
                            resettled=report.resettled, abandoned=report.abandoned)
    return report


def _reaped(report: ReapReport) -> str:
    """What became of the stranded deliveries, and what was lost: only the work of a run that
    stopped before storing its outcome (reported as timed out) and the outcomes given up on."""
    parts = [f"{n} {what}" for n, what in (
        (report.handed_back, "handed back unstarted"),
        (report.timed_out, "reported as timed out (the work of their stopped run is lost)"),
        (report.resettled, "stored outcomes reported again"),
        (report.abandoned, "given up on (left to the server's own timeout)")) if n]
    lost = "" if report.timed_out or report.abandoned else "; nothing was lost"
    return ", ".join(parts) + lost


def _lease_untaken(settler: Settler, item: LedgerItem) -> bool:
    """Whether the server shows the stranded run's execution as never leased (one read, only
    where leasing is a step of its own; see ``WorkerProtocol.lease_untaken``)."""
    untaken: bool = settler.client.call(lambda p: p.lease_untaken(item.delivery))
    return untaken


def _abandon(services: Services, item: LedgerItem) -> int:
    """Give up on settling ``item`` with the server: final now, loudly. Returns 1 if this
    call made it final."""
    from .metrics import metrics

    why = (f"abandoned after {item.settle_failures} failed settling calls in a row "
           f"(last: {item.error or 'unknown'})")
    if item.status is LedgerStatus.REPORTED:
        # The server has the outcome; only the acknowledgement never went through.
        done = services.store.mark_acknowledged(item.key)
        cost = "the server has its outcome, only the acknowledgement is missing: nothing is lost"
    else:
        done = services.store.mark_abandoned(item.key, why)
        cost = ("the job is left to the server's own timeout, which hands it out again; what this worker had "
                "for it is lost")
    if done:
        metrics.add("SettleAbandoned", 1)
        log.error("delivery %s of job %s %s; %s", item.key, item.delivery.job_id, why, cost)
        services.events.add("job.settle_abandoned", f"job {item.delivery.job_id} {why}", level="ERROR",
                            job_id=item.delivery.job_id, status=str(item.status))
    return int(done)
