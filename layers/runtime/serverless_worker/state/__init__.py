"""The worker's state: sessions, the delivery ledger, counters, locks.

The runtime depends on the :class:`StateStore` base (``state/base.py``: every operation,
the item layout and the rules, with the transition table in ``state/rules.py``); its
backends implement a few primitives: :class:`DynamoStateStore` (Lambda: one DynamoDB
table, ``state/store.py``) and :class:`SqliteStateStore` (one SQLite file on one machine,
``state/sqlite_store.py``). Statuses and transitions: docs/ledger.md.
"""

from __future__ import annotations

from .base import StateStore
from .errors import InvalidKeyError, ItemTooLargeError, StaleWriteError, StateStoreError, UnrecordableDeliveryError
from .items import LedgerItem
from .keys import IN_FLIGHT_INDEX, ledger_key, ledger_key_for, parse_ledger_key
from .rules import EXPIRED_RETENTION_SECONDS, FINAL_RETENTION_SECONDS
from .store import DynamoStateStore

__all__ = [
    "EXPIRED_RETENTION_SECONDS",
    "FINAL_RETENTION_SECONDS",
    "FINAL_STATUSES",
    "IN_FLIGHT_INDEX",
    "IN_FLIGHT_STATUSES",
    "DispatchMode",
    "DynamoStateStore",
    "InvalidKeyError",
    "ItemTooLargeError",
    "LedgerItem",
    "LedgerStatus",
    "SqliteStateStore",
    "StaleWriteError",
    "StateStore",
    "StateStoreError",
    "UnrecordableDeliveryError",
    "ledger_key",
    "ledger_key_for",
    "parse_ledger_key",
]


def __getattr__(name: str) -> object:
    """``SqliteStateStore`` is imported on first use: Lambda never needs sqlite3 at a cold start,
    and its layer leaves the SQLite backend out (layers/runtime/Makefile)."""
    if name == "SqliteStateStore":
        try:
            from .sqlite_store import SqliteStateStore
        except ModuleNotFoundError as err:
            raise ImportError("SqliteStateStore is the local runner's backend, which the Lambda layer "
                              "leaves out; Lambda uses DynamoStateStore") from err

        return SqliteStateStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
