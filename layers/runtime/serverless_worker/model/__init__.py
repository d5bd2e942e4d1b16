"""The worker's vocabulary, shared by every package and owned by none of them.

A :class:`Delivery` is pulled by a protocol client, recorded by the state store and run by
the runtime; its :class:`Outcome` is stored before it is reported; the ledger's
:class:`LedgerStatus` says how far it got. Protocols, state and runtime import these
names from here, and this package imports nothing of theirs
(docs/contributing/architecture.md).
"""

from __future__ import annotations

from .delivery import Delivery, Lease, ReportReceipt, SessionState
from .ledger import FINAL_STATUSES, IN_FLIGHT_STATUSES, DispatchMode, LedgerStatus
from .outcome import (
    DETERMINISTIC_FAILURES,
    AppendedStage,
    ContextUpdate,
    Outcome,
    OutcomeKind,
    ResultExtras,
    ResultLog,
)

__all__ = [
    "Delivery",
    "Lease",
    "ReportReceipt",
    "SessionState",
    "FINAL_STATUSES",
    "IN_FLIGHT_STATUSES",
    "DispatchMode",
    "LedgerStatus",
    "DETERMINISTIC_FAILURES",
    "Outcome",
    "OutcomeKind",
    "AppendedStage",
    "ContextUpdate",
    "ResultExtras",
    "ResultLog",
]
