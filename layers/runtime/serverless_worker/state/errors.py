"""The state store's errors, rooted in the project's one error tree.

A transition the ledger refuses because someone else moved the item on is not an
error (the method returns ``False`` or ``None``); these are raised when the caller must
stop: a fenced write lost, a key or item DynamoDB would reject, or DynamoDB failing.
Messages name the item key and never an item's contents (they hold tokens).
"""

from __future__ import annotations

from ..errors import PayloadTooLargeError, ServerlessWorkerError

__all__ = ["DeliveryTooLargeError", "InvalidKeyError", "ItemTooLargeError", "StaleWriteError", "StateStoreError",
           "UnrecordableDeliveryError", "UnrecordableKeyError"]


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



class UnrecordableDeliveryError(StateStoreError, ValueError):
    """This one delivery cannot be put in the ledger, whatever is retried: its content nests
    deeper than it can be serialised or is not valid Unicode, its id cannot be part of a key
    (:class:`UnrecordableKeyError`), or it makes an item past the limit
    (:class:`DeliveryTooLargeError`). Nothing was written. The caller settles it without a
    ledger item (``runtime/poison.py``); the other deliveries of its batch are not affected.

    ``reason`` says which, in words fit for the job server's error field (never the content)."""

    def __init__(self, job_id: str, reason: str) -> None:
        self.job_id, self.reason = job_id, reason
        ServerlessWorkerError.__init__(self, f"job {_short(job_id)} cannot be recorded: {reason}")


class UnrecordableKeyError(UnrecordableDeliveryError, InvalidKeyError):
    """The delivery's id cannot be part of a ledger key (``state/keys.py`` says why)."""

    def __init__(self, job_id: str, err: InvalidKeyError) -> None:
        self.job_id, self.reason = job_id, f"its id cannot be stored: {err}"
        ServerlessWorkerError.__init__(self, str(err))


class DeliveryTooLargeError(UnrecordableDeliveryError, ItemTooLargeError):
    """The delivery alone makes its ledger item past the limit: no write of it can go through."""

    def __init__(self, job_id: str, err: ItemTooLargeError) -> None:
        self.job_id = job_id
        self.key, self.what, self.size, self.limit = err.key, err.what, err.size, err.limit
        self.reason = (f"it makes a ledger item of at least {err.size} bytes, over the state store's "
                       f"item limit of {err.limit} bytes")
        ServerlessWorkerError.__init__(self, str(err))


def _short(value: str) -> str:
    return ascii(value if len(value) <= 40 else value[:40] + "...")
