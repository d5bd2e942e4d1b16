"""Rules every state-store backend shares: retention, counter names, the hand-back epoch,
and how a report receipt or an unfit handler is recorded (docs/ledger.md)."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from ..model import ReportReceipt
from .keys import PK, SK, TTL

__all__ = [
    "EXPIRED_RETENTION_SECONDS",
    "FINAL_RETENTION_SECONDS",
    "HANDBACK_EPOCH_PREFIX",
    "NOT_COUNTERS",
    "UNFIT_PREFIX",
    "check_counter_deltas",
    "in_doubt",
    "unfit_attribute",
]

# Epoch prefix of ledger claims taken only to hand a delivery back (runtime.settle).
HANDBACK_EPOCH_PREFIX = "handback:"

FINAL_RETENTION_SECONDS = 7 * 86400    # a settled ledger item stays this long (duplicate detection, audit)
EXPIRED_RETENTION_SECONDS = 86400      # sessions and locks linger this long past their own expiry

_COUNTER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
NOT_COUNTERS = frozenset({PK, SK, TTL, "updated_at"})
UNFIT_PREFIX = "unfit_"


def check_counter_deltas(deltas: dict[str, Any]) -> None:
    """Raise ``ValueError`` for a counter name DynamoDB or the item cannot take, or a non-int delta."""
    for name, delta in deltas.items():
        if not _COUNTER.fullmatch(name) or name in NOT_COUNTERS:
            raise ValueError(f"invalid counter name {name!r}")
        if not isinstance(delta, int) or isinstance(delta, bool):
            raise ValueError(f"counter {name} delta must be an int, got {delta!r}")


def in_doubt(receipt: ReportReceipt) -> bool:
    """The server answered "not found" (first try, or after an ambiguous one): it may have
    forgotten the delivery (a Priostack restart), so the job may come back and must then be
    recorded again, with our outcome, instead of dropped as a duplicate."""
    return receipt.status in ("not_found", "already_applied")


def unfit_attribute(handler: str) -> str:
    """The control item's attribute for one handler (names may hold dots, so a digest)."""
    return UNFIT_PREFIX + hashlib.sha256(handler.encode()).hexdigest()[:16]
