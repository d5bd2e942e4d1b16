"""The state store's errors, rooted in the project's one error tree.

A transition the ledger refuses because someone else moved the item on is not an
error (the method returns ``False`` or ``None``); these are raised when the caller must
stop: a fenced write lost, a key or item DynamoDB would reject, or DynamoDB failing.
Messages name the item key and never an item's contents (they hold tokens).
"""

from __future__ import annotations

from ..errors import PayloadTooLargeError, ServerlessWorkerError

__all__ = ["InvalidKeyError", "ItemTooLargeError", "StaleWriteError", "StateStoreError"]


class StateStoreError(ServerlessWorkerError):
    """DynamoDB failed a call (throttled past retries, unreachable, table missing, denied)."""


class StaleWriteError(StateStoreError):
    """A fenced write lost: the session version or the run's epoch moved on.

    Whoever gets this no longer owns what it was about to change (another bootstrap
    saved a session; the reaper or a newer execution took the run over) and must stop
    acting on it; re-read to see the current state.
    """

    def __init__(self, message: str, *, key: str) -> None:
        self.key = key
        super().__init__(f"{key}: {message}")


class InvalidKeyError(StateStoreError, ValueError):
    """An id cannot be part of a DynamoDB key: empty, not encodable, or too long."""


class ItemTooLargeError(StateStoreError, PayloadTooLargeError):
    """A write would take an item past DynamoDB's 400 KB limit; nothing was written.

    ``size`` is the bytes this write adds (a lower bound on the item it would make).
    """

    def __init__(self, key: str, what: str, size: int, limit: int) -> None:
        self.key, self.what, self.size, self.limit = key, what, size, limit
        ServerlessWorkerError.__init__(
            self, f"{key}: {what} ({size} bytes written) does not fit DynamoDB's item limit of {limit} bytes")
