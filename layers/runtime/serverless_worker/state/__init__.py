"""The worker's state in DynamoDB: sessions, the delivery ledger, counters, locks.

Everything that touches the state table goes through :class:`StateStore`; the item
design and the condition on every transition are documented in ``state/store.py``.
"""

from __future__ import annotations

from .errors import InvalidKeyError, ItemTooLargeError, StaleWriteError, StateStoreError
from .items import FINAL_STATUSES, IN_FLIGHT_STATUSES, DispatchMode, LedgerItem, LedgerStatus
from .keys import IN_FLIGHT_INDEX, ledger_key, ledger_key_for, parse_ledger_key
from .store import EXPIRED_RETENTION_SECONDS, FINAL_RETENTION_SECONDS, StateStore

__all__ = [
    "EXPIRED_RETENTION_SECONDS",
    "FINAL_RETENTION_SECONDS",
    "FINAL_STATUSES",
    "IN_FLIGHT_INDEX",
    "IN_FLIGHT_STATUSES",
    "DispatchMode",
    "InvalidKeyError",
    "ItemTooLargeError",
    "LedgerItem",
    "LedgerStatus",
    "StaleWriteError",
    "StateStore",
    "StateStoreError",
    "ledger_key",
    "ledger_key_for",
    "parse_ledger_key",
]
