"""The state store's contract: every operation the runtime performs on its state.

One contract, several backends (``DynamoStateStore`` for Lambda, ``SqliteStateStore``
for one machine), the way an idempotency library has one persistence base and a layer
per database. The runtime depends on this protocol only; which backend it gets is
decided where the store is built. The behaviour every backend must share (statuses,
the condition on each transition, what a refused transition returns) is written down
in docs/ledger.md and proven for each backend by the same tests (tests/state).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from ..model import Delivery, DispatchMode, Outcome, ReportReceipt, SessionState
from .items import LedgerItem

__all__ = ["StateStore"]


@runtime_checkable
class StateStore(Protocol):
    """Sessions, the bootstrap lock, the delivery ledger, counters and operator flags.

    ``ops`` counts the backend's requests as ``"read"`` and ``"write"`` (the cost model
    and the local summary read it). A transition the ledger refuses returns ``False`` or
    ``None``; a fenced write that lost raises ``StaleWriteError``; a backend failure is a
    ``StateStoreError``; a write too large is an ``ItemTooLargeError`` (state/errors.py).
    """

    ops: Counter[str]

    # -- worker session
    def load_session(self, protocol: str, instance: str) -> tuple[SessionState, int] | None: ...

    def save_session(self, protocol: str, instance: str, session: SessionState,
                     expected_version: int | None) -> int: ...

    # -- bootstrap lock
    def acquire_lock(self, name: str, owner: str, ttl_seconds: float) -> bool: ...

    def release_lock(self, name: str, owner: str) -> bool: ...

    # -- ledger: recording and dispatch
    def record_delivery(self, delivery: Delivery, *, instance: str, deadline: float,
                        dispatch_mode: DispatchMode | str, again_after_hand_back: bool = False,
                        settled_before: float | None = None) -> str | None:
        """The delivery's new item, or ``None`` for a duplicate. A final item past its ttl
        counts as absent; ``again_after_hand_back`` also replaces a handed-back item (or one
        the server answered "not found", keeping its stored outcome to re-report);
        ``settled_before`` (when the pull was sent) an acknowledged or discarded item last
        written before then, for a protocol whose ids come back after settling only from a
        server that forgot them. An item in flight is always a duplicate. A delivery no item
        can ever hold (content or id, ``items.recordable``; past the item limit) raises
        ``UnrecordableDeliveryError`` and nothing is written."""
        ...

    records_in_batches: bool
    """Whether ``record_new`` writes a batch for less than ``record_delivery`` per delivery
    (the scheduler then records a pulled batch at once, on the tick's own thread)."""

    def record_new(self, deliveries: Sequence[tuple[Delivery, DispatchMode | str]], *, instance: str,
                   deadline: float) -> list[str | None]:
        """Record each delivery that has no ledger item yet, as ``record_delivery`` would;
        its key, or ``None`` where an item exists or the delivery cannot be recorded, for
        ``record_delivery`` to decide (duplicate, redelivery, hand-back) or refuse. Never
        raises for one delivery of the batch."""
        ...

    def mark_dispatched(self, key: str) -> bool: ...

    def mark_dispatch_failed(self, key: str, error: str) -> bool: ...

    # -- ledger: the run
    def start_run(self, key: str, epoch: str, deadline: float) -> LedgerItem | None: ...

    def take_over(self, key: str, *, old_epoch: str, new_epoch: str, deadline: float) -> bool: ...

    def get(self, key: str) -> LedgerItem | None: ...

    def save_checkpoint(self, key: str, epoch: str, checkpoint: Any, deadline: float | None = None) -> None: ...

    def renew_deadline(self, key: str, epoch: str, deadline: float) -> int: ...

    def save_callback_token(self, key: str, epoch: str, token: str) -> None: ...

    def request_cancel(self, key: str, epoch: str, reason: str) -> bool: ...

    def request_handover(self, key: str, epoch: str) -> bool: ...

    def clear_handover(self, key: str, epoch: str) -> bool: ...

    def store_outcome(self, key: str, epoch: str, outcome: Outcome) -> None: ...

    # -- ledger: settling
    def mark_reported(self, key: str, receipt: ReportReceipt) -> bool: ...

    def mark_acknowledged(self, key: str, receipt: ReportReceipt | None = None, *, wait: bool = True) -> bool:
        """The final write after report and acknowledgement. ``wait=False`` lets a backend
        return before the write is durable, and then ``True`` before knowing: only where a
        lost write costs nothing, since a crash before it lands leaves the item reported or
        with its outcome stored, which recovery settles again without running anything
        (the SQLite backend queues it for its next group commit; DynamoDB always waits)."""
        ...

    def clear_redelivered(self, key: str) -> bool: ...

    def mark_handed_back(self, key: str, reason: str, *, epoch: str | None = None) -> bool: ...

    def mark_discarded(self, key: str, reason: str, *, epoch: str | None = None) -> bool: ...

    def note_settle_failure(self, key: str, error: str, retry_at: float) -> int: ...

    def postpone(self, key: str, deadline: float) -> bool: ...

    def mark_abandoned(self, key: str, reason: str) -> bool: ...

    # -- in flight
    def count_in_flight(self, protocol: str, instance: str, *, live_at: float | None = None) -> int: ...

    def in_flight(self, protocol: str, instance: str) -> list[LedgerItem]: ...

    def stranded(self, protocol: str, instance: str, now: float) -> list[LedgerItem]: ...

    # -- counters and control
    def add_counters(self, protocol: str, instance: str, **deltas: int) -> None: ...

    def read_counters(self, protocol: str, instance: str) -> dict[str, int]: ...

    def get_control(self, protocol: str, instance: str) -> dict[str, Any]: ...

    def set_unfit(self, protocol: str, instance: str, handler: str, reason: str) -> bool: ...

    def clear_unfit(self, protocol: str, instance: str) -> None: ...

    def set_stopped(self, protocol: str, instance: str, reason: str | None) -> None: ...

    def set_draining(self, protocol: str, instance: str, draining: bool) -> None: ...
