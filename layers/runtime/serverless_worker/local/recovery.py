"""What a killed local run left in its state file, settled by the next run on the same file.

The state file is held by one process at a time (``local/state_file.py``), so when a run
starts, every delivery still in flight in its scope was left by a process that is gone:
nothing will ever finish it, and waiting for its deadline (minutes: the dispatch timeout,
the executor's Lambda timeout) would only hold the job. So, before the first tick:

- never claimed by a run (``RECORDED``, ``DISPATCHED``): dispatched again, as the
  scheduler dispatched it, so the handler runs once now (the executor claims it with the
  same conditional write; a lease the server took back meanwhile is refused and the
  delivery discarded, as on Lambda);
- anything else (``RUNNING``: the handler may have run, but its outcome was never
  stored; ``OUTCOME_STORED``/``REPORTED``: it ran and may have been reported): made
  stranded now, by moving its deadline to the past, so the first tick's reaper settles it
  exactly as it settles a delivery whose Lambda vanished (``runtime/reaper.py``,
  docs/ledger.md): a timeout for the run that vanished, the stored outcome re-reported,
  the acknowledgement finished. None of them runs its handler again.

Example::

    report = recover(services)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..errors import DispatchError
from ..model import DispatchMode, LedgerStatus
from ..runtime.services import Services

__all__ = ["RecoveryReport", "recover", "recovery_note"]

log = logging.getLogger("serverless_worker.local")

_NEVER_CLAIMED = frozenset({LedgerStatus.RECORDED, LedgerStatus.DISPATCHED})


@dataclass
class RecoveryReport:
    """How many deliveries of an earlier run were dispatched again, and how many left to the reaper."""

    dispatched: int = 0
    stranded: int = 0
    vanished: int = 0   # of ``stranded``: a run claimed it and no outcome was stored (RUNNING)
    unstarted: int = 0  # of ``stranded``: never claimed and not dispatched again (handed back unrun)

    @property
    def total(self) -> int:
        return self.dispatched + self.stranded


def recover(services: Services) -> RecoveryReport:
    """Settle the deliveries an earlier process left in flight (see the module docstring)."""
    store, report = services.store, RecoveryReport()
    now = services.clock()
    for item in store.in_flight(services.protocol_name, services.instance):
        if item.status in _NEVER_CLAIMED:
            try:
                if item.dispatch_mode == DispatchMode.STATE_MACHINE:
                    services.dispatch.start_execution(item.key)
                else:
                    services.dispatch.invoke_executor(item.key)
                report.dispatched += 1
                continue
            except DispatchError as err:  # no state machine this run: the reaper hands it back
                log.warning("delivery %s of an earlier run could not be dispatched again (%s); this run's reaper "
                            "hands it back to the server unstarted: nothing is lost", item.key, err)
        # Past its deadline now: the first tick's reaper claims it and settles it.
        if store.postpone(item.key, now - 1.0):
            report.stranded += 1
            report.vanished += item.status is LedgerStatus.RUNNING
            report.unstarted += item.status in _NEVER_CLAIMED
    if report.total:
        services.events.add("worker.recovered", recovery_note(report),
                            level="WARN", dispatched=report.dispatched, stranded=report.stranded)
    return report


def recovery_note(report: RecoveryReport) -> str:
    """What recovery did, in one line, and what it cost: nothing, except the work of a run
    that vanished before its outcome was stored (reported as timed out, so the server may
    retry the job)."""
    stored = report.stranded - report.vanished - report.unstarted
    parts = [f"{report.dispatched} never started (run now)"] if report.dispatched else []
    if report.unstarted:
        parts.append(f"{report.unstarted} never started and not run this time (handed back to the server "
                     "unstarted)")
    if stored:
        parts.append(f"{stored} already ran (their stored outcome is reported, not run again)")
    if report.vanished:
        parts.append(f"{report.vanished} running when it was killed (reported as timed out, so the server may "
                     "retry them)")
    lost = (f"only the unstored work of the {report.vanished} killed run{'s' if report.vanished != 1 else ''} is "
            "lost" if report.vanished else "nothing was lost")
    return (f"recovered {report.total} deliveries an earlier run left in flight: {'; '.join(parts)}; {lost}")
