"""The state store: every operation the runtime performs on its state, written once.

One base, several backends, the way an idempotency library has one persistence base and a
layer per database: this class owns the item layout (``state/keys.py``, ``items.py``), the
statuses and which may move to which under which fence (``state/rules.py``), and writes
each operation as a template method. A backend implements only the primitives below it:
read an item, put one where absent (or where a condition holds), update one where a
condition holds, delete one, and read the in-flight index; conditions and updates arrive
in the neutral form of ``state/conditions.py``, which it translates.

Backends: ``DynamoStateStore`` (Lambda, ``state/store.py``) and ``SqliteStateStore`` (one
machine, ``state/sqlite_store.py``), proven by the same tests (tests/state).

A transition the ledger refuses returns ``False`` or ``None``; a fenced write that lost
raises ``StaleWriteError``; a backend failure is a ``StateStoreError``; a write too large is
an ``ItemTooLargeError`` (state/errors.py). ``ops`` counts the backend's requests as
``"read"`` and ``"write"`` (the cost model and the local summary read it).

Item layout (``pk`` partition key, ``sk`` sort key naming the kind):

=====================================  ==========  ==============================================
pk                                     sk          attributes
=====================================  ==========  ==============================================
``session#{protocol}#{instance}``      session     session (JSON of SessionState.to_record(), token
                                                   included), version (N), expires_at, ttl
``lock#{name}``                        lock        owner, expires_at, acquired_at, ttl
``delivery#{protocol}#{ledger_id}``    delivery    status, delivery (Delivery.to_record(), packed
                                                   by the backend; token included), protocol,
                                                   handler, instance, attempt, dispatch_mode, epoch,
                                                   runs, renewals, recorded_at, updated_at,
                                                   started_at, finished_at, outcome/checkpoint/
                                                   report (JSON, None fields left out), error,
                                                   cancel_reason, handover_requested,
                                                   callback_token; while in flight also
                                                   scope=``{protocol}#{instance}`` + deadline
                                                   (the in-flight index; DynamoDB also ``due``);
                                                   once final, ttl
``counters#{protocol}#{instance}``     counters    one N per counter (ADD), updated_at
``control#{protocol}#{instance}``      control     stopped (reason), draining (bool), updated_at,
                                                   unfit_{digest} (JSON handler + reason) per handler
=====================================  ==========  ==============================================

Final states drop ``scope``/``deadline``/``due`` (leaving the index) and the checkpoint,
and set ``ttl`` (``final_retention_seconds``, seven days by default) on.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Literal

from ..logsafety import server_text
from ..model import Delivery, DispatchMode, LedgerStatus, Outcome, ReportReceipt, SessionState
from . import rules
from .conditions import Condition, Missing, Update
from .errors import DeliveryTooLargeError, ItemTooLargeError, StaleWriteError, UnrecordableDeliveryError
from .items import (
    LedgerItem,
    compact_model,
    dumps,
    recordable,
    recorded_attributes,
)
from .keys import (
    DEADLINE,
    DUE,
    PK,
    SCOPE,
    SK,
    TTL,
    control_key,
    counters_key,
    lock_key,
    parse_ledger_key,
    scope_of,
    session_key,
    sort_key_for,
)
from .rules import (
    EXPIRED_RETENTION_SECONDS,
    FINAL_RETENTION_SECONDS,
    HANDBACK_EPOCH_PREFIX,
    NOT_COUNTERS,
    UNFIT_PREFIX,
    check_counter_deltas,
    in_doubt,
    transition,
    unfit_attribute,
)

__all__ = ["Returns", "StateStore"]

log = logging.getLogger("serverless_worker.state")

Returns = Literal["none", "new", "updated"]
"""What an update answers when applied: nothing (``{}``), the whole new item, or at least the
attributes it changed (a backend may give the whole item)."""


class StateStore(ABC):
    """Sessions, the bootstrap lock, the delivery ledger, counters and operator flags.

    ``clock`` is the time source for every timestamp and expiry check (tests pass a fake
    one); ``final_retention_seconds`` is how long a settled ledger item stays (the local
    runner keeps them minutes, not the stack's seven days).
    """

    records_in_batches: bool = False
    """Whether ``record_new`` writes a batch for less than ``record_delivery`` per delivery
    (the scheduler then records a pulled batch at once, on the tick's own thread)."""

    def __init__(self, *, clock: Callable[[], float] = time.time,
                 final_retention_seconds: int = FINAL_RETENTION_SECONDS) -> None:
        self._clock = clock
        self._final_retention = int(final_retention_seconds)
        self.ops: Counter[str] = Counter()
        self._ops_lock = threading.Lock()

    # -- the primitives each backend implements ---------------------------------------
    @abstractmethod
    def _get_record(self, pk: str) -> dict[str, Any] | None:
        """The item's attributes (a consistent read), or ``None``."""

    @abstractmethod
    def _put_record(self, pk: str, attributes: dict[str, Any], replace_if: Condition | None,
                    values: dict[str, Any], *, what: str, return_old: bool = False) -> dict[str, Any] | None:
        """Write the whole item where none exists, or where one exists and ``replace_if``
        holds; ``None`` when refused, else the old item's attributes (``{}`` when there was
        none, or ``return_old`` is false). ``None`` attributes are left out."""

    @abstractmethod
    def _update_record(self, pk: str, update: Update, condition: Condition | None, values: dict[str, Any], *,
                       what: str, returns: Returns = "none", create: bool = False,
                       wait: bool = True) -> dict[str, Any] | None:
        """Apply ``update`` where ``condition`` holds (none: always); ``None`` when refused.

        ``create``: an absent item is created first (an update with no condition, or one an
        absent item meets). ``wait=False`` lets a backend queue it and answer ``{}`` at once
        (see ``mark_acknowledged``)."""

    @abstractmethod
    def _delete_record(self, pk: str, condition: Condition, values: dict[str, Any]) -> bool:
        """Delete the item where ``condition`` holds; whether it did."""

    @abstractmethod
    def _in_flight_records(self, scope: str, *, before: float | None = None) -> list[dict[str, Any]]:
        """Every item in the in-flight index of ``scope`` (with ``before``, those whose index
        deadline is earlier); a superset the caller filters on the items themselves."""

    @abstractmethod
    def _count_in_flight_records(self, scope: str, *, live_at: float | None = None) -> int:
        """How many items of ``scope`` are in flight (with ``live_at``: whose own deadline
        is not before it)."""

    @abstractmethod
    def _pack_delivery(self, record: dict[str, Any], job_id: str) -> Any:
        """The delivery's record in the form this backend keeps documents; raises
        ``UnrecordableDeliveryError`` for one it cannot store."""

    def _put_new_records(self, rows: Sequence[tuple[str, dict[str, Any]]]) -> list[bool]:
        """Put each item where none exists; whether each was written (one too large is not).
        One put each; a backend with a cheaper batch overrides it (``records_in_batches``)."""
        written = []
        for key, attributes in rows:
            try:
                written.append(self._put_record(key, attributes, None, {}, what="the delivery") is not None)
            except ItemTooLargeError:
                written.append(False)  # record_delivery raises it where the caller handles it
        return written

    def _count(self, kind: str, n: int = 1) -> None:
        with self._ops_lock:
            self.ops[kind] += n

    # -- worker session ----------------------------------------------------------------
    def load_session(self, protocol: str, instance: str) -> tuple[SessionState, int] | None:
        """The stored session and its version; ``None`` when absent or expired (TTL deletes late)."""
        attrs = self._get_record(session_key(protocol, instance))
        if attrs is None or float(attrs["expires_at"]) <= self._clock():
            return None
        return SessionState.model_validate(json.loads(attrs["session"])), int(attrs["version"])

    def save_session(self, protocol: str, instance: str, session: SessionState,
                     expected_version: int | None) -> int:
        """Store ``session`` if nobody saved since ``expected_version`` was loaded; returns the new version.

        ``expected_version=None`` means "there was none" (``load_session`` returned ``None``).
        Raises :class:`StaleWriteError` when another writer got there first.
        """
        pk = session_key(protocol, instance)
        now = self._clock()
        update = Update().set(session=dumps(session.to_record()), expires_at=session.expires_at,
                              ttl=int(session.expires_at) + EXPIRED_RETENTION_SECONDS, updated_at=now,
                              protocol=protocol, instance=instance)
        if expected_version is None:
            doc = self._update_record(pk, update.add(version=1), rules.SESSION_ABSENT, {"now": now},
                                      what="the session", returns="updated", create=True)
        else:
            doc = self._update_record(pk, update.set(version=expected_version + 1), rules.SESSION_UNCHANGED,
                                      {"expected": expected_version}, what="the session", returns="updated")
        if doc is None:
            raise StaleWriteError(f"session changed since version {expected_version} was loaded", key=pk)
        return int(doc["version"])

    # -- bootstrap lock ----------------------------------------------------------------
    def acquire_lock(self, name: str, owner: str, ttl_seconds: float) -> bool:
        """Take (or extend) the named lock for ``ttl_seconds``; ``False`` while someone else holds it."""
        pk = lock_key(name)
        now = self._clock()
        expires_at = now + ttl_seconds
        item = {PK: pk, SK: sort_key_for(pk), "owner": owner, "expires_at": expires_at, "acquired_at": now,
                TTL: int(expires_at) + EXPIRED_RETENTION_SECONDS}
        return self._put_record(pk, item, rules.LOCK_FREE, {"now": now, "owner": owner}, what="the lock") is not None

    def release_lock(self, name: str, owner: str) -> bool:
        """Free the lock if ``owner`` still holds it; ``False`` when it expired and moved on."""
        return self._delete_record(lock_key(name), rules.LOCK_HELD, {"owner": owner})

    # -- ledger: recording and dispatch ------------------------------------------------
    def record_delivery(self, delivery: Delivery, *, instance: str, deadline: float,
                        dispatch_mode: DispatchMode | str, again_after_hand_back: bool = False,
                        settled_before: float | None = None) -> str | None:
        """Write the ledger item before dispatching; returns its key, or ``None`` for a duplicate.

        ``deadline`` is when it counts as stranded if no executor has claimed it. A final
        item past its ttl counts as absent. With ``again_after_hand_back`` a delivery whose
        item is HANDED_BACK is recorded afresh (handing back asks the server to deliver it
        again), and so is one the server answered "not found" (keeping its stored outcome to
        re-report). With ``settled_before`` (when the pull that brought it was sent) so is
        one whose item settled (acknowledged, discarded) before then: the server handed the
        id out again after it had our outcome, which on a protocol whose ids come back only
        from a server that forgot them means new work (``settled_id_returns_as_new``). An
        item that settled after the pull was sent, or one in flight, is a duplicate.
        A delivery no item can ever hold (content or id, ``items.recordable``; past the item
        limit) raises ``UnrecordableDeliveryError`` and nothing is written.
        """
        recorded = self._record("record_delivery", delivery, instance=instance, deadline=deadline,
                                dispatch_mode=dispatch_mode, again_after_hand_back=again_after_hand_back,
                                settled_before=settled_before)
        return recorded[0] if recorded is not None else None

    def record_running(self, delivery: Delivery, *, instance: str, epoch: str, deadline: float,
                       again_after_hand_back: bool = False, settled_before: float | None = None) -> LedgerItem | None:
        """Record a delivery an executor pulled itself straight into ``RUNNING`` under its run
        ``epoch`` until ``deadline``: the scheduler's record and the run's claim (``start_run``)
        in one conditional put, so the self-pull path pays no separate claim write.

        The conditions are ``record_delivery``'s (same flags, same errors, nothing written
        when it raises); the item is mode ``self`` and in the in-flight index, so capacity,
        the reaper and the drain treat it as any run. Returns the item as ``start_run`` does;
        ``None`` for a duplicate (its redelivery noted): discard the copy unrun. A job the
        server forgot comes back ``OUTCOME_STORED`` with our stored outcome: re-report it,
        never run the handler again."""
        recorded = self._record("record_running", delivery, instance=instance, deadline=deadline,
                                dispatch_mode=DispatchMode.SELF_PULLED, again_after_hand_back=again_after_hand_back,
                                settled_before=settled_before, epoch=epoch)
        return LedgerItem.from_attributes(recorded[1]) if recorded is not None else None

    def _record(self, write: str, delivery: Delivery, *, instance: str, deadline: float,
                dispatch_mode: DispatchMode | str, again_after_hand_back: bool, settled_before: float | None,
                epoch: str | None = None) -> tuple[str, dict[str, Any]] | None:
        """The one body of the recording writes (``rules._recording_rows``): the key and the
        item as written, or ``None`` for a duplicate. With ``epoch`` the item is the run's
        (``RUNNING``), else ``RECORDED``."""
        now = self._clock()
        key, item = self._new_ledger_item(delivery, instance, deadline, dispatch_mode, now, epoch=epoch)
        replace_if = rules.recording_condition(again_after_hand_back, settled_before is not None)
        values = {"now": now, "settled_before": settled_before}
        try:
            old = self._put_record(key, item, replace_if, values, what="the delivery", return_old=True)
        except ItemTooLargeError as err:
            raise DeliveryTooLargeError(delivery.job_id, err) from None
        if old is None:
            log.info("duplicate delivery %s: already in the ledger", key)
            noted = self._move(key, write, rules.CASE_RECORD_DUPLICATE,
                               Update().set(redelivered=True, updated_at=self._clock()))
            if noted or not (again_after_hand_back or settled_before is not None):
                return None
            # It went final between the two writes, maybe as unknown to the server: ask again.
            old = self._put_record(key, item, replace_if, values, what="the delivery", return_old=True)
            if old is None:
                return None
        if old.get("unknown_to_server") and old.get("outcome") is not None:
            # A job the server forgot comes back with our outcome already stored: keep it, so
            # the executor re-reports it instead of running the handler a second time.
            update = Update().set(outcome=old["outcome"], status=LedgerStatus.OUTCOME_STORED.value,
                                  updated_at=self._clock())
            if epoch is None:
                self._move(key, write, rules.CASE_RECORD_FORGOTTEN, update)
                return key, item
            kept = self._apply(key, write, rules.CASE_RECORD_FORGOTTEN, update, {"epoch": epoch}, returns="new",
                               what="the ledger item")
            if kept is None:
                return None  # another run took it over in between: not ours to report
            return key, kept
        return key, item

    def record_new(self, deliveries: Sequence[tuple[Delivery, DispatchMode | str]], *, instance: str,
                   deadline: float) -> list[str | None]:
        """Record each delivery that has no ledger item yet, as ``record_delivery`` would;
        its key, or ``None`` where an item exists or the delivery cannot be recorded, for
        ``record_delivery`` to decide (duplicate, redelivery, hand-back) or refuse. Never
        raises for one delivery of the batch."""
        now = self._clock()
        rows: list[tuple[int, str, dict[str, Any]]] = []
        for index, (delivery, mode) in enumerate(deliveries):
            try:
                key, item = self._new_ledger_item(delivery, instance, deadline, mode, now)
            except UnrecordableDeliveryError:
                continue
            rows.append((index, key, item))
        keys: list[str | None] = [None] * len(deliveries)
        if rows:
            written = self._put_new_records([(key, item) for _, key, item in rows])
            for (index, key, _), done in zip(rows, written, strict=True):
                keys[index] = key if done else None
        return keys

    def _new_ledger_item(self, delivery: Delivery, instance: str, deadline: float,
                         dispatch_mode: DispatchMode | str, now: float,
                         epoch: str | None = None) -> tuple[str, dict[str, Any]]:
        """The key and new item of ``delivery`` (with ``epoch``: already running under it);
        UnrecordableDeliveryError when it has none."""
        key, record = recordable(delivery)
        packed = self._pack_delivery(record, delivery.job_id)
        run: dict[str, Any] = {} if epoch is None else {
            "status": LedgerStatus.RUNNING, "epoch": epoch, "runs": 1, "started_at": now}
        item = recorded_attributes(key, delivery, packed_delivery=packed, instance=instance, deadline=deadline,
                                   dispatch_mode=dispatch_mode, now=now, **run)
        return key, {name: value for name, value in item.items() if value is not None}

    def mark_dispatched(self, key: str) -> bool:
        now = self._clock()
        return self._move(key, "mark_dispatched", "",
                          Update().set(status=LedgerStatus.DISPATCHED.value, updated_at=now, dispatched_at=now))

    def mark_dispatch_failed(self, key: str, error: str) -> bool:
        """The fan-out failed: keep it in flight with its deadline now, so the next reap hands it back."""
        now = self._clock()
        update = Update().set(status=LedgerStatus.DISPATCH_FAILED.value, error=server_text(error),
                              updated_at=now).move_deadline(now)
        return self._move(key, "mark_dispatch_failed", rules.CASE_DISPATCH_FAILED_NOW, update)

    # -- ledger: the run ---------------------------------------------------------------
    def start_run(self, key: str, epoch: str, deadline: float) -> LedgerItem | None:
        """Claim the delivery for the run ``epoch`` until ``deadline``; returns the item as claimed.

        ``None`` when another run owns it or it is already past running: then ``get`` it
        and settle a stored outcome instead of running the handler again.
        """
        now = self._clock()
        update = (Update().set(status=LedgerStatus.RUNNING.value, epoch=epoch, updated_at=now)
                  .default(started_at=now).add(runs=1).move_deadline(deadline, extends=True))
        case = rules.CASE_HANDBACK_CLAIM if epoch.startswith(HANDBACK_EPOCH_PREFIX) else ""
        attrs = self._apply(key, "start_run", case, update, {"epoch": epoch}, returns="new", what="the run")
        return LedgerItem.from_attributes(attrs) if attrs is not None else None

    def take_over(self, key: str, *, old_epoch: str, new_epoch: str, deadline: float) -> bool:
        """Move a running item from ``old_epoch`` (presumed dead) to ``new_epoch``."""
        update = (Update().set(epoch=new_epoch, updated_at=self._clock(), renewals=0)
                  .remove("cancel_reason", "handover_requested").add(runs=1).move_deadline(deadline, extends=True))
        return self._apply(key, "take_over", "", update, {"old_epoch": old_epoch}, what="the run") is not None

    def get(self, key: str) -> LedgerItem | None:
        """Consistent read of one ledger item."""
        parse_ledger_key(key)
        attrs = self._get_record(key)
        return LedgerItem.from_attributes(attrs) if attrs is not None else None

    def save_checkpoint(self, key: str, epoch: str, checkpoint: Any, deadline: float | None = None) -> None:
        """Record a continuation's checkpoint (and push the deadline out); epoch-fenced."""
        update = Update().set(checkpoint=dumps(checkpoint), updated_at=self._clock())
        if deadline is not None:
            update.move_deadline(deadline, extends=True)
        self._fenced(key, epoch, "save_checkpoint", update, "the checkpoint")

    def renew_deadline(self, key: str, epoch: str, deadline: float) -> int:
        """Push the run's deadline out; returns how many renewals this epoch has made."""
        update = Update().set(updated_at=self._clock()).add(renewals=1).move_deadline(deadline, extends=True)
        return int(self._fenced(key, epoch, "renew_deadline", update, "the deadline", returns="updated")["renewals"])

    def save_callback_token(self, key: str, epoch: str, token: str) -> None:
        """Keep a Step Functions task token with the run (never in execution history)."""
        self._fenced(key, epoch, "save_callback_token", Update().set(callback_token=token, updated_at=self._clock()),
                     "the callback token")

    def request_cancel(self, key: str, epoch: str, reason: str) -> bool:
        """Ask the run to stop (its lease was refused); ``False`` when that run no longer owns it."""
        return self._move(key, "request_cancel", "", Update().set(cancel_reason=reason, updated_at=self._clock()),
                          {"epoch": epoch})

    def request_handover(self, key: str, epoch: str) -> bool:
        """Ask the run to continue as a new execution (history limit); fenced like ``request_cancel``."""
        return self._move(key, "request_handover", "",
                          Update().set(handover_requested=True, updated_at=self._clock()), {"epoch": epoch})

    def clear_handover(self, key: str, epoch: str) -> bool:
        """The new execution took over (same epoch): clear the request and restart the renewal count."""
        return self._move(key, "clear_handover", "",
                          Update().set(handover_requested=False, renewals=0, updated_at=self._clock()),
                          {"epoch": epoch})

    def store_outcome(self, key: str, epoch: str, outcome: Outcome) -> None:
        """Save the outcome before reporting it, so a retry re-reports and never re-runs.

        Raises :class:`StaleWriteError` when ``epoch`` no longer owns the run (reaped or taken over).
        """
        now = self._clock()
        # The document comes first: moto applies clauses one by one and would keep the ones
        # before an oversized value (DynamoDB itself applies none).
        update = Update().set(outcome=compact_model(outcome), status=LedgerStatus.OUTCOME_STORED.value,
                              updated_at=now, finished_at=now).remove("checkpoint")
        self._fenced(key, epoch, "store_outcome", update, "the outcome")

    # -- ledger: settling --------------------------------------------------------------
    def mark_reported(self, key: str, receipt: ReportReceipt) -> bool:
        now = self._clock()
        update = Update().set(report=compact_model(receipt), status=LedgerStatus.REPORTED.value, reported_at=now,
                              updated_at=now)
        if in_doubt(receipt):
            update.set(unknown_to_server=True)  # the job may come back: see record_delivery
        return self._move(key, "mark_reported", "", update)

    def mark_acknowledged(self, key: str, receipt: ReportReceipt | None = None, *, wait: bool = True) -> bool:
        """Final. With ``receipt`` it also records the report: the short path writes once
        after report + ack instead of twice (a crash between them re-reports, which every
        protocol tolerates: fenced, 404-reconciled or ``accepted:false``). ``wait=False``
        lets a backend return before the write is durable, and then ``True`` before knowing:
        a crash before it lands leaves the item reported or with its outcome stored, which
        recovery settles again without running anything (SQLite queues it for its next group
        commit; DynamoDB always waits)."""
        if receipt is None:
            return self._final(key, "mark_acknowledged", "", LedgerStatus.ACKNOWLEDGED, wait=wait)
        # A report the server did not know marks the item so that the job's return is recorded again.
        not_found = in_doubt(receipt)
        case = rules.CASE_WITH_RECEIPT_NOT_FOUND if not_found else rules.CASE_WITH_RECEIPT
        return self._final(key, "mark_acknowledged", case, LedgerStatus.ACKNOWLEDGED, report=compact_model(receipt),
                           unknown_to_server=not_found, wait=wait)

    def clear_redelivered(self, key: str) -> bool:
        """The noted redelivery is being answered (the report is sent again)."""
        return self._move(key, "clear_redelivered", "", Update().set(updated_at=self._clock()).remove("redelivered"))

    def mark_handed_back(self, key: str, reason: str, *, epoch: str | None = None) -> bool:
        """Final: returned to the server unstarted. With ``epoch``, only if that run owns it."""
        return self._final(key, "mark_handed_back", rules.CASE_WITH_EPOCH if epoch else "", LedgerStatus.HANDED_BACK,
                           reason=reason, epoch=epoch)

    def mark_discarded(self, key: str, reason: str, *, epoch: str | None = None) -> bool:
        """Final: dropped unrun (stale, refused, lost). Duplicates never reach this: they have no item."""
        return self._final(key, "mark_discarded", rules.CASE_WITH_EPOCH if epoch else "", LedgerStatus.DISCARDED,
                           reason=reason, epoch=epoch)

    def note_settle_failure(self, key: str, error: str, retry_at: float) -> int:
        """A settling call failed: the item is retried by the reaper at ``retry_at`` (its new
        deadline, so it stops holding capacity then); returns the failures in a row.

        ``0`` when the item is already final (someone else settled it meanwhile)."""
        update = (Update().set(error=server_text(error), updated_at=self._clock()).add(settle_failures=1)
                  .move_deadline(retry_at))
        attrs = self._apply(key, "note_settle_failure", rules.CASE_SETTLE_RETRY, update, {},
                            returns="updated", what="the ledger item")
        return int(attrs["settle_failures"]) if attrs is not None else 0

    def postpone(self, key: str, deadline: float) -> bool:
        """Move an in-flight item's deadline (when the reaper next looks at it)."""
        return self._move(key, "postpone", "", Update().set(updated_at=self._clock()).move_deadline(deadline))

    def mark_abandoned(self, key: str, reason: str) -> bool:
        """Final: settling failed too often. The item is DISCARDED and marked as unknown to
        the server, so that the job's return is recorded again (with the stored outcome, if
        any: re-reported, never re-run)."""
        return self._final(key, "mark_abandoned", "", LedgerStatus.DISCARDED, reason=reason, unknown_to_server=True)

    # -- in flight ---------------------------------------------------------------------
    def count_in_flight(self, protocol: str, instance: str, *, live_at: float | None = None) -> int:
        """Unsettled deliveries of this instance (DynamoDB's index reads are eventually consistent).

        With ``live_at`` only those whose deadline has not passed by then: something (an
        executor, a state machine) will settle each of them by its deadline. One past its
        deadline is the reaper's, and must not hold a slot of capacity while it waits for
        the next tick's reap: that is what capacity is counted with."""
        return self._count_in_flight_records(scope_of(protocol, instance), live_at=live_at)

    def in_flight(self, protocol: str, instance: str) -> list[LedgerItem]:
        """Every unsettled delivery of this instance, soonest deadline first."""
        return _soonest_first([item for item in self._in_flight_items(scope_of(protocol, instance), None)
                               if not item.is_final])

    def stranded(self, protocol: str, instance: str, now: float) -> list[LedgerItem]:
        """Unsettled deliveries whose deadline passed before ``now``, re-checked on the full item."""
        return _soonest_first([item for item in self._in_flight_items(scope_of(protocol, instance), now)
                               if not item.is_final and item.deadline is not None and item.deadline < now])

    def _in_flight_items(self, scope: str, before: float | None) -> list[LedgerItem]:
        return [LedgerItem.from_attributes(attrs) for attrs in self._in_flight_records(scope, before=before)]

    # -- counters and control ----------------------------------------------------------
    def add_counters(self, protocol: str, instance: str, **deltas: int) -> None:
        """Add to named counters (``processed=1, failed=1``) atomically.

        The runtime batches these per container (``runtime.counters.CounterBuffer``):
        they are statistics, not worth a write per job."""
        check_counter_deltas(deltas)
        if deltas:
            # No condition: additions commute, and counters are statistics, not transitions.
            self._update_record(counters_key(protocol, instance), Update().set(updated_at=self._clock()).add(**deltas),
                                None, {}, what="the counters", create=True)

    def read_counters(self, protocol: str, instance: str) -> dict[str, int]:
        attrs = self._get_record(counters_key(protocol, instance)) or {}
        return {name: int(value) for name, value in attrs.items() if name not in NOT_COUNTERS}

    def get_control(self, protocol: str, instance: str) -> dict[str, Any]:
        """Operator flags for this instance: ``{"stopped": reason | None, "draining": bool,
        "unfit": {handler: reason}}`` (handlers no delivery of which can ever run)."""
        attrs = self._get_record(control_key(protocol, instance)) or {}
        unfit = {}
        for name, value in attrs.items():
            if name.startswith(UNFIT_PREFIX):
                record = json.loads(value)
                unfit[record["handler"]] = record["reason"]
        return {"stopped": attrs.get("stopped"), "draining": bool(attrs.get("draining", False)), "unfit": unfit}

    def set_unfit(self, protocol: str, instance: str, handler: str, reason: str) -> bool:
        """Stop pulling for ``handler``: its timeout can never fit (``runtime.fit``). ``True``
        when this call set it (the first executor to find out), ``False`` when already set."""
        attribute = unfit_attribute(handler)
        record = dumps({"handler": handler, "reason": server_text(reason, limit=1000)})
        update = Update().set(**{attribute: record, "updated_at": self._clock()})
        # One attribute per handler, set once: two executors finding it at once never lose either.
        return self._update_record(control_key(protocol, instance), update, Missing(attribute), {},
                                   what="control", create=True) is not None

    def clear_unfit(self, protocol: str, instance: str) -> None:
        """Pull for every handler again (the operator fixed the timeouts)."""
        pk = control_key(protocol, instance)
        names = [name for name in (self._get_record(pk) or {}) if name.startswith(UNFIT_PREFIX)]
        if names:
            # No condition: an operator flag, last writer wins.
            self._update_record(pk, Update().set(updated_at=self._clock()).remove(*names), None, {}, what="control")

    def set_stopped(self, protocol: str, instance: str, reason: str | None) -> None:
        """Stop pulling (configuration is wrong) with ``reason``; ``None`` clears it."""
        update = Update().set(stopped=server_text(reason, limit=1000), updated_at=self._clock()) if reason else \
            Update().set(updated_at=self._clock()).remove("stopped")
        # No condition: an operator flag, last writer wins.
        self._update_record(control_key(protocol, instance), update, None, {}, what="control", create=True)

    def set_draining(self, protocol: str, instance: str, draining: bool) -> None:
        # No condition: an operator flag, last writer wins.
        self._update_record(control_key(protocol, instance),
                            Update().set(draining=bool(draining), updated_at=self._clock()), None, {},
                            what="control", create=True)

    # -- the ledger's writes, by the rulebook's table ----------------------------------
    def _apply(self, key: str, write: str, case: str, update: Update, values: dict[str, Any], *,
               returns: Returns = "none", what: str, wait: bool = True) -> dict[str, Any] | None:
        """One transition of the table (``rules.TRANSITIONS``) on the ledger item ``key``."""
        parse_ledger_key(key)
        row = transition(write, case)
        attrs = self._update_record(key, update, row.condition, values, what=what, returns=returns, wait=wait)
        if attrs is None:
            log.debug("%s refused for %s", write, key)
        return attrs

    def _move(self, key: str, write: str, case: str, update: Update, values: dict[str, Any] | None = None, *,
              wait: bool = True) -> bool:
        return self._apply(key, write, case, update, values or {}, what="the ledger item", wait=wait) is not None

    def _fenced(self, key: str, epoch: str, write: str, update: Update, what: str, *,
                returns: Returns = "none") -> dict[str, Any]:
        """A write only the run ``epoch`` may make; anyone else lost it (reaped, taken over)."""
        attrs = self._apply(key, write, "", update, {"epoch": epoch}, returns=returns, what=what)
        if attrs is None:
            raise StaleWriteError(f"run {epoch!r} no longer owns this delivery; {what} was not saved", key=key)
        return attrs

    def _final(self, key: str, write: str, case: str, status: LedgerStatus, *, reason: str | None = None,
               epoch: str | None = None, report: str | None = None, unknown_to_server: bool = False,
               wait: bool = True) -> bool:
        now = self._clock()
        update = Update().set(status=status.value, updated_at=now, ttl=int(now) + self._final_retention,
                              error=server_text(reason, limit=1000) if reason is not None else None, report=report,
                              unknown_to_server=True if unknown_to_server else None)
        # Leaving the index is what makes it no longer in flight; the checkpoint is dead weight now.
        update.remove(SCOPE, DEADLINE, DUE, "checkpoint")
        return self._move(key, write, case, update, {"epoch": epoch} if epoch else {}, wait=wait)


def _soonest_first(items: list[LedgerItem]) -> list[LedgerItem]:
    """By the items' own deadlines (DynamoDB's index orders by its key, which may lag behind them)."""
    return sorted(items, key=lambda item: item.deadline if item.deadline is not None else 0.0)
