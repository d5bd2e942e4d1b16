"""The ledger's statuses and dispatch modes: the words every backend stores and the runtime reads.

The transitions between them are the state store's (docs/ledger.md); the values are the
names, as stored.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["FINAL_STATUSES", "IN_FLIGHT_STATUSES", "DispatchMode", "LedgerStatus"]


class LedgerStatus(StrEnum):
    """Where a delivery is in its life. The value is the name, as stored."""

    RECORDED = "RECORDED"                # in the ledger, not yet handed to an executor
    DISPATCHED = "DISPATCHED"            # executor invoked / execution started
    DISPATCH_FAILED = "DISPATCH_FAILED"  # the fan-out failed; to be handed back (reaper picks it up)
    RUNNING = "RUNNING"                  # claimed by the run holding `epoch`
    OUTCOME_STORED = "OUTCOME_STORED"    # outcome saved; report it (again) but never re-run
    REPORTED = "REPORTED"                # the server has the outcome; acknowledge it
    ACKNOWLEDGED = "ACKNOWLEDGED"        # final: done
    HANDED_BACK = "HANDED_BACK"          # final: returned unstarted (or lease lapsed)
    DISCARDED = "DISCARDED"              # final: duplicate, stale or refused; dropped unrun

    @property
    def is_final(self) -> bool:
        return self in FINAL_STATUSES


FINAL_STATUSES = frozenset({LedgerStatus.ACKNOWLEDGED, LedgerStatus.HANDED_BACK, LedgerStatus.DISCARDED})
IN_FLIGHT_STATUSES = frozenset(set(LedgerStatus) - FINAL_STATUSES)


class DispatchMode(StrEnum):
    """How a recorded delivery is run: by one executor invocation or by the state machine."""

    INVOKE = "invoke"                # one async executor invocation
    STATE_MACHINE = "state_machine"  # one Step Functions execution (long-running handlers)
    SELF_PULLED = "self"             # pulled, recorded and run by an executor that keeps pulling
