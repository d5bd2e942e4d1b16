"""All DynamoDB access of the project: one table (``StateTable`` in template.yaml).

The Lambda backend of the state-store contract (``state/contract.py``); the SQLite one is
``state/sqlite_store.py``. The rules both share live in ``state/rules.py``.

Item design (``pk`` partition key, ``sk`` sort key, both strings):

=====================================  ==========  ==============================================
pk                                     sk          attributes
=====================================  ==========  ==============================================
``session#{protocol}#{instance}``      session     session (JSON of SessionState.to_record(), token
                                                   included), version (N), expires_at, ttl
``lock#{name}``                        lock        owner, expires_at, acquired_at, ttl
``delivery#{protocol}#{ledger_id}``    delivery    status, delivery (Delivery.to_record() as deflated
                                                   JSON bytes, items.pack_document; token included),
                                                   protocol, handler, instance, attempt,
                                                   dispatch_mode, epoch, runs, renewals, recorded_at,
                                                   updated_at, started_at, finished_at,
                                                   outcome/checkpoint/report (JSON, None fields
                                                   left out), error, cancel_reason, handover_requested,
                                                   callback_token; while in flight also
                                                   scope=``{protocol}#{instance}`` + deadline
                                                   (the sparse ``in-flight`` index) and due;
                                                   once final, ttl
``counters#{protocol}#{instance}``     counters    one N per counter (ADD), updated_at
``control#{protocol}#{instance}``      control     stopped (reason), draining (bool), updated_at,
                                                   unfit_{digest} (JSON handler + reason) per handler
=====================================  ==========  ==============================================

Ledger statuses (``LedgerStatus``) and the condition on each transition::

    record_delivery   (new)                  -> RECORDED      absent, or final and past its ttl; asked,
                                                              also handed back, or settled before the pull
    mark_dispatched   RECORDED               -> DISPATCHED
    mark_dispatch_failed RECORDED|DISPATCHED -> DISPATCH_FAILED (deadline = now: reaped next)
    start_run         RECORDED|DISPATCHED    -> RUNNING(epoch)  also RUNNING(same epoch); a hand-back
                      claim (epoch ``handback:...``) also takes DISPATCH_FAILED
    take_over         RUNNING(old)           -> RUNNING(new)
    save_checkpoint / renew_deadline / request_cancel / request_handover: RUNNING(epoch)
    store_outcome     RUNNING(epoch)         -> OUTCOME_STORED
    mark_reported     OUTCOME_STORED         -> REPORTED
    mark_acknowledged REPORTED               -> ACKNOWLEDGED   final
    mark_handed_back  any not yet REPORTED   -> HANDED_BACK    final (optionally epoch-fenced)
    mark_discarded    any not yet REPORTED   -> DISCARDED      final (optionally epoch-fenced)
    note_settle_failure any in flight        -> (same)         deadline = the reaper's retry time
    mark_abandoned    any not yet REPORTED   -> DISCARDED      final, the job's return recorded again

Final states drop ``scope``/``deadline``/``due`` (leaving the index) and set ``ttl`` seven days on.

Index writes: the in-flight index holds keys only, so a write costs index units only when it
adds (1), moves (2) or removes (1) an entry. Its range key ``deadline`` is set when the
delivery is recorded and is *never later* than the item's own deadline ``due``: a run that
pushes its deadline out (start_run, take_over, renew_deadline, save_checkpoint) writes
``due`` only, and moves ``deadline`` just when the new deadline is earlier (a refused first
try, then a second write). So the short path costs the index 2 units (record, settle), not 4.
Readers treat the index as a superset: ``stranded`` re-checks ``due`` on the full item, and
``count_in_flight(live_at=...)`` counts entries whose ``deadline`` has not passed and reads
the few whose has (runs outliving their dispatch deadline) to check their ``due``.
A refused transition that the caller branches on returns ``False``/``None``; a fenced
write that loses (session version, run epoch) raises :class:`StaleWriteError`, because
carrying on after losing ownership would report an outcome someone else owns.

Sizes: DynamoDB items are capped at 400 KB. A write that would cross it raises
:class:`ItemTooLargeError` (a ``PayloadTooLargeError``) naming the ledger key, before the
call where the write alone is too large, else from DynamoDB's own refusal. The runtime
should then settle the job with a small outcome instead: a delivery too large to record
is reported as bad input (or handed back) without being run; an outcome or checkpoint
too large is replaced by a ``FAILURE`` outcome saying so, which does fit.

Example::

    store = DynamoStateStore.from_env()          # TABLE_NAME from the function's environment
    key = store.record_delivery(delivery, instance="blue", deadline=now + 60, dispatch_mode="invoke")
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from .. import logsafety  # noqa: F401  (botocore must not log item bodies: they hold tokens)
from ..awsclients import LazyClient
from ..errors import ConfigurationError
from ..logsafety import server_text
from ..model import Delivery, DispatchMode, LedgerStatus, Outcome, ReportReceipt, SessionState
from .errors import (
    DeliveryTooLargeError,
    ItemTooLargeError,
    StaleWriteError,
    StateStoreError,
    UnrecordableDeliveryError,
)
from .items import (
    LedgerItem,
    compact_model,
    dumps,
    from_item,
    item_size,
    pack_document,
    recordable,
    recorded_attributes,
    to_attribute,
    to_item,
)
from .keys import (
    DEADLINE,
    DUE,
    IN_FLIGHT_INDEX,
    ITEM_MAX_BYTES,
    PK,
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
    unfit_attribute,
)

__all__ = [
    "EXPIRED_RETENTION_SECONDS",
    "FINAL_RETENTION_SECONDS",
    "HANDBACK_EPOCH_PREFIX",
    "DynamoStateStore",
    "check_counter_deltas",
]

log = logging.getLogger("serverless_worker.state")

# Every call has a timeout; throttling and 5xx are retried by botocore's standard mode.
# No client-side parameter validation: DynamoDB validates every request itself (a bad one
# is a ValidationException, a StateStoreError here), and skipping botocore's copy saves
# about a tenth of the client's CPU per request, four requests per job.
_CLIENT_CONFIG = Config(connect_timeout=3, read_timeout=10, retries={"mode": "standard", "max_attempts": 5},
                        parameter_validation=False)

_NAME = re.compile(r"#([A-Za-z_][A-Za-z0-9_]*)")
_VALUE = re.compile(r":([A-Za-z_][A-Za-z0-9_]*)")
_BATCH_GET_MAX = 100

# A run's fence: the item is running and this epoch owns it.
_OWNED = "#status = :running AND #epoch = :epoch"
# Not yet reported: the server has no outcome from us, so the delivery may still go back or be dropped.
_UNREPORTED = "#status IN (:recorded, :dispatched, :dispatch_failed, :running, :outcome_stored)"
_STATUS_VALUES = {status.name.lower(): status.value for status in LedgerStatus}


class DynamoStateStore:
    """The worker's state in one DynamoDB table (the Lambda backend of ``contract.StateStore``).

    The client is built once when not given.

    ``clock`` is the time source for every timestamp and expiry check (tests pass a fake
    one). ``ops`` counts the DynamoDB requests made, as ``"read"`` and ``"write"``.
    ``final_retention_seconds`` is how long a settled ledger item stays (the local runner
    keeps them minutes, not the stack's seven days).
    """

    def __init__(self, table_name: str, *, client: Any = None,
                 clock: Callable[[], float] = time.time,
                 final_retention_seconds: int = FINAL_RETENTION_SECONDS) -> None:
        if not table_name:
            raise ConfigurationError("state table name is empty (set TABLE_NAME)")
        self.table_name = table_name
        # Built on its first request (awsclients): a cold start does not pay for an unused client.
        self._client = client if client is not None else LazyClient("dynamodb", config=_CLIENT_CONFIG)
        self._clock = clock
        self._final_retention = int(final_retention_seconds)
        self.ops: Counter[str] = Counter()
        self._ops_lock = threading.Lock()

    records_in_batches = False  # see record_new

    @classmethod
    def from_env(cls, *, client: Any = None, clock: Callable[[], float] = time.time) -> DynamoStateStore:
        """Build from ``TABLE_NAME`` (template.yaml passes the table's name to every function)."""
        name = os.environ.get("TABLE_NAME", "")
        if not name:
            raise ConfigurationError("TABLE_NAME is not set: it must name the stack's StateTable")
        return cls(name, client=client, clock=clock)

    # -- worker session ----------------------------------------------------------
    def load_session(self, protocol: str, instance: str) -> tuple[SessionState, int] | None:
        """The stored session and its version; ``None`` when absent or expired (TTL deletes late)."""
        attrs = self._get(session_key(protocol, instance))
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
        values: dict[str, Any] = {
            "session": dumps(session.to_record()), "expires_at": session.expires_at,
            "ttl": int(session.expires_at) + EXPIRED_RETENTION_SECONDS, "now": now, "protocol": protocol,
            "instance": instance, "one": 1, "zero": 0,
        }
        update = ("SET #session = :session, #expires_at = :expires_at, #ttl = :ttl, #updated_at = :now, "
                  "#protocol = :protocol, #instance = :instance, ")
        if expected_version is None:
            # None stored, or one load_session already treats as absent (expired, not yet deleted by TTL).
            condition = "attribute_not_exists(#pk) OR #expires_at <= :now"
            update += "#version = if_not_exists(#version, :zero) + :one"
        else:
            # Optimistic concurrency: nobody saved a session since we loaded this version.
            condition = "#version = :expected"
            update += "#version = :next"
            values.update(expected=expected_version, next=expected_version + 1)
        response = self._update(pk, update, condition, values, returns="UPDATED_NEW", what="the session")
        if response is None:
            raise StaleWriteError(f"session changed since version {expected_version} was loaded", key=pk)
        return int(from_item(response["Attributes"])["version"])

    # -- bootstrap lock ----------------------------------------------------------
    def acquire_lock(self, name: str, owner: str, ttl_seconds: float) -> bool:
        """Take (or extend) the named lock for ``ttl_seconds``; ``False`` while someone else holds it."""
        pk = lock_key(name)
        now = self._clock()
        expires_at = now + ttl_seconds
        item = to_item({PK: pk, SK: sort_key_for(pk), "owner": owner, "expires_at": expires_at,
                        "acquired_at": now, TTL: int(expires_at) + EXPIRED_RETENTION_SECONDS})
        # Free, abandoned (past its expiry; TTL deletes late), or already ours (re-entrant extend).
        condition = "attribute_not_exists(#pk) OR #expires_at <= :now OR #owner = :owner"
        return self._put(pk, item, condition, {"now": now, "owner": owner}, what="the lock") is not None

    def release_lock(self, name: str, owner: str) -> bool:
        """Free the lock if ``owner`` still holds it; ``False`` when it expired and moved on."""
        pk = lock_key(name)
        # Only the holder frees it: a lock that expired and was taken by another stays theirs.
        condition = "#owner = :owner"
        request = {"Key": self._key(pk), "ConditionExpression": condition,
                   **self._expression(condition, values={"owner": owner})}
        return self._call("write", "delete_item", pk, request) is not None

    # -- delivery ledger: recording and dispatch -----------------------------------
    def record_delivery(self, delivery: Delivery, *, instance: str, deadline: float,
                        dispatch_mode: DispatchMode | str, again_after_hand_back: bool = False,
                        settled_before: float | None = None) -> str | None:
        """Write the ledger item before dispatching; returns its key, or ``None`` for a duplicate.

        ``deadline`` is when it counts as stranded if no executor has claimed it. With
        ``again_after_hand_back`` a delivery whose item is HANDED_BACK is recorded afresh:
        handing back asks the server to deliver it again (Pipelogiq requeues the same
        execution, Priostack re-activates the job with the same ``retries``), so its
        return is the expected next delivery, not a duplicate to drop. With
        ``settled_before`` (when the pull that brought it was sent) so is one whose item
        settled (acknowledged, discarded) before then: the server handed the id out again
        after it had our outcome, which on a protocol whose ids come back only from a
        server that forgot them (a reset) means new work
        (``WorkerProtocol.settled_id_returns_as_new``). An item that settled after the pull
        was sent may have been handed out before our outcome landed: a duplicate.
        """
        now = self._clock()
        key, item = self._recorded_item(delivery, instance, deadline, dispatch_mode, now)
        # A new execution; or one whose settled item outlived its ttl (TTL deletes late: it counts as gone).
        condition = "attribute_not_exists(#pk) OR #ttl < :now"
        if again_after_hand_back:
            # Also while a hand-back is still in progress (its claim's epoch says so): the
            # server may redeliver before the hand-back's own ledger write lands, and that
            # delivery is the job coming back, not a duplicate.
            condition += (" OR #status = :handed_back"
                          " OR (#status = :running AND begins_with(#epoch, :handback))")
            # Or a job whose report the server answered "not found" (a Priostack restart forgot
            # the activation): it comes back under the same key and must not be dropped.
            condition += " OR #unknown_to_server = :yes"
        if settled_before is not None:
            # Or an item settled before the pull was sent: the server handed out the id after
            # it had our outcome, which it does only once it forgot it (reset): new work.
            condition += " OR (#status IN (:acknowledged, :discarded) AND #updated_at < :settled_before)"
        values = {"now": now, "handed_back": LedgerStatus.HANDED_BACK.value, "settled_before": settled_before,
                  "acknowledged": LedgerStatus.ACKNOWLEDGED.value, "discarded": LedgerStatus.DISCARDED.value,
                  "running": LedgerStatus.RUNNING.value, "handback": HANDBACK_EPOCH_PREFIX, "yes": True}
        try:
            response = self._put(key, item, condition, values, what="the delivery", returns="ALL_OLD")
        except ItemTooLargeError as err:
            raise DeliveryTooLargeError(delivery.job_id, err) from None
        if response is None:
            log.info("duplicate delivery %s: already in the ledger", key)
            # While in flight, note it: a report the server then answers "not found" (a Priostack
            # restart forgot the activation, then re-activated the job) must be sent again.
            if self._transition(key, "SET #redelivered = :yes, #updated_at = :now", "attribute_exists(#scope)",
                                yes=True) or not (again_after_hand_back or settled_before is not None):
                return None
            # It went final between the two writes, maybe as unknown to the server: ask again.
            response = self._put(key, item, condition, values, what="the delivery", returns="ALL_OLD")
            if response is None:
                return None
        self._carry_forgotten_outcome(key, from_item(response.get("Attributes") or {}))
        return key

    def record_new(self, deliveries: Sequence[tuple[Delivery, DispatchMode | str]], *, instance: str,
                   deadline: float) -> list[str | None]:
        """One conditional put per delivery, only where no item exists; ``None`` for the rest
        (``record_delivery`` decides those). DynamoDB has no cheaper batch with conditions:
        ``records_in_batches`` is false, so the scheduler records each on its dispatch pool."""
        now = self._clock()
        keys: list[str | None] = []
        for delivery, mode in deliveries:
            try:
                key, item = self._recorded_item(delivery, instance, deadline, mode, now)
                written = self._put(key, item, "attribute_not_exists(#pk)", {}, what="the delivery")
            except (ItemTooLargeError, UnrecordableDeliveryError):
                written = None  # record_delivery raises it where the caller handles it
            keys.append(key if written is not None else None)
        return keys

    @staticmethod
    def _recorded_item(delivery: Delivery, instance: str, deadline: float,
                       dispatch_mode: DispatchMode | str, now: float) -> tuple[str, dict[str, Any]]:
        """The key and new item of ``delivery``; UnrecordableDeliveryError when it has none."""
        key, record = recordable(delivery)
        packed = pack_document(record, job_id=delivery.job_id)
        return key, to_item(recorded_attributes(key, delivery, packed_delivery=packed, instance=instance,
                                                deadline=deadline, dispatch_mode=dispatch_mode, now=now))

    def _carry_forgotten_outcome(self, key: str, old: dict[str, Any]) -> None:
        """A job the server forgot comes back with our outcome already stored: keep it, so the
        executor re-reports it instead of running the handler a second time."""
        if not old.get("unknown_to_server") or old.get("outcome") is None:
            return
        self._transition(key, "SET #outcome = :outcome, #status = :outcome_stored, #updated_at = :now",
                         "#status = :recorded", outcome=old["outcome"])

    def mark_dispatched(self, key: str) -> bool:
        # Only a recorded item: an executor that claimed it first has already moved it on.
        return self._transition(key, "SET #status = :dispatched, #updated_at = :now, #dispatched_at = :now",
                                "#status = :recorded")

    def mark_dispatch_failed(self, key: str, error: str) -> bool:
        """The fan-out failed: keep it in flight with its deadline now, so the next reap hands it back."""
        # Only while no run has claimed it: an ambiguous invoke may have started the executor after all.
        return self._transition(
            key, "SET #status = :dispatch_failed, #error = :error, #deadline = :now, #due = :now, #updated_at = :now",
            "#status IN (:recorded, :dispatched)", error=server_text(error))

    # -- delivery ledger: the run ---------------------------------------------------
    def start_run(self, key: str, epoch: str, deadline: float) -> LedgerItem | None:
        """Claim the delivery for the run ``epoch`` until ``deadline``; returns the item as claimed.

        ``None`` when another run owns it or it is already past running: then ``get`` it
        and settle a stored outcome instead of running the handler again.
        """
        parse_ledger_key(key)
        update = ("SET #status = :running, #epoch = :epoch, #updated_at = :now, "
                  "#started_at = if_not_exists(#started_at, :now)", "ADD #runs :one")
        # Claim an unstarted delivery, or resume our own run (a continuation slice, a retried invocation).
        # One whose dispatch failed is only claimed to be handed back (the reaper), never run.
        unstarted = "(:recorded, :dispatched, :dispatch_failed)" if epoch.startswith(HANDBACK_EPOCH_PREFIX) \
            else "(:recorded, :dispatched)"
        condition = f"#status IN {unstarted} OR (#status = :running AND #epoch = :epoch)"
        response = self._with_deadline(key, update, condition, self._values(epoch=epoch, deadline=deadline, one=1),
                                       returns="ALL_NEW", what="the run")
        return LedgerItem.from_attributes(from_item(response["Attributes"])) if response is not None else None

    def take_over(self, key: str, *, old_epoch: str, new_epoch: str, deadline: float) -> bool:
        """Move a running item from ``old_epoch`` (presumed dead) to ``new_epoch``."""
        parse_ledger_key(key)
        update = ("SET #epoch = :new_epoch, #updated_at = :now, #renewals = :zero",
                  "REMOVE #cancel_reason, #handover_requested ADD #runs :one")
        # Compare-and-swap on the epoch: one successor wins, and the old run's fenced writes fail from now on.
        condition = "#status = :running AND #epoch = :old_epoch"
        values = self._values(old_epoch=old_epoch, new_epoch=new_epoch, deadline=deadline, zero=0, one=1)
        return self._with_deadline(key, update, condition, values, what="the run") is not None

    def get(self, key: str) -> LedgerItem | None:
        """Consistent read of one ledger item."""
        parse_ledger_key(key)
        attrs = self._get(key)
        return LedgerItem.from_attributes(attrs) if attrs is not None else None

    def save_checkpoint(self, key: str, epoch: str, checkpoint: Any, deadline: float | None = None) -> None:
        """Record a continuation's checkpoint (and push the deadline out); epoch-fenced."""
        update = "SET #checkpoint = :checkpoint, #updated_at = :now"
        if deadline is None:
            self._fenced(key, epoch, update, "the checkpoint", checkpoint=dumps(checkpoint))
        else:
            self._fenced(key, epoch, (update, ""), "the checkpoint", checkpoint=dumps(checkpoint), deadline=deadline)

    def renew_deadline(self, key: str, epoch: str, deadline: float) -> int:
        """Push the run's deadline out; returns how many renewals this epoch has made."""
        update = ("SET #updated_at = :now", "ADD #renewals :one")
        response = self._fenced(key, epoch, update, "the deadline", returns="UPDATED_NEW", deadline=deadline,
                                one=1)
        return int(from_item(response["Attributes"])["renewals"])

    def save_callback_token(self, key: str, epoch: str, token: str) -> None:
        """Keep a Step Functions task token with the run (never in execution history)."""
        self._fenced(key, epoch, "SET #callback_token = :token, #updated_at = :now", "the callback token",
                     token=token)

    def request_cancel(self, key: str, epoch: str, reason: str) -> bool:
        """Ask the run to stop (its lease was refused); ``False`` when that run no longer owns it."""
        # Only the current run: a stale renew loop must not cancel its successor.
        return self._transition(key, "SET #cancel_reason = :reason, #updated_at = :now", _OWNED,
                                epoch=epoch, reason=reason)

    def request_handover(self, key: str, epoch: str) -> bool:
        """Ask the run to continue as a new execution (history limit); fenced like ``request_cancel``."""
        # Only the current run decides to hand over its own execution.
        return self._transition(key, "SET #handover_requested = :true, #updated_at = :now", _OWNED,
                                epoch=epoch, true=True)

    def clear_handover(self, key: str, epoch: str) -> bool:
        """The new execution took over (same epoch): clear the request and restart the renewal count."""
        # Only the run that asked; the epoch carries across continue-as-new.
        update = "SET #handover_requested = :false, #renewals = :zero, #updated_at = :now"
        return self._transition(key, update, _OWNED, epoch=epoch, false=False, zero=0)

    def store_outcome(self, key: str, epoch: str, outcome: Outcome) -> None:
        """Save the outcome before reporting it, so a retry re-reports and never re-runs.

        Raises :class:`StaleWriteError` when ``epoch`` no longer owns the run (reaped or taken over).
        """
        # The document comes first in every SET: moto applies clauses one by one and would keep
        # the ones before an oversized value (DynamoDB itself applies none).
        self._fenced(key, epoch, "SET #outcome = :outcome, #status = :outcome_stored, #updated_at = :now, "
                     "#finished_at = :now REMOVE #checkpoint", "the outcome", outcome=compact_model(outcome))

    # -- delivery ledger: settling ------------------------------------------------
    def mark_reported(self, key: str, receipt: ReportReceipt) -> bool:
        # A report follows a stored outcome; a second reporter finds it already reported.
        update = "SET #report = :report, #status = :reported, #reported_at = :now, #updated_at = :now"
        if in_doubt(receipt):
            update += ", #unknown_to_server = :yes"  # the job may come back: see record_delivery
        return self._transition(key, update, "#status = :outcome_stored",
                                report=compact_model(receipt), yes=True)

    def mark_acknowledged(self, key: str, receipt: ReportReceipt | None = None, *, wait: bool = True) -> bool:
        """Final. With ``receipt`` it also records the report: the short path writes once
        after report + ack instead of twice (a crash between them re-reports, which every
        protocol tolerates: fenced, 404-reconciled or ``accepted:false``). Always waits:
        ``wait`` is for backends that can queue a write (the contract's)."""
        if receipt is None:
            # Acknowledging settles a reported outcome, once.
            return self._final(key, LedgerStatus.ACKNOWLEDGED, "#status = :reported")
        # Report and acknowledgement of a stored outcome recorded together, once. A report the
        # server did not know marks the item so that the job's return is recorded again.
        not_found = in_doubt(receipt)
        condition = "#status IN (:outcome_stored, :reported)"
        if not_found:
            # Not while a redelivery is noted: the report is due again (see record_delivery).
            condition += " AND attribute_not_exists(#redelivered)"
        return self._final(key, LedgerStatus.ACKNOWLEDGED, condition,
                           report=compact_model(receipt), unknown_to_server=not_found)

    def clear_redelivered(self, key: str) -> bool:
        """The noted redelivery is being answered (the report is sent again)."""
        return self._transition(key, "SET #updated_at = :now REMOVE #redelivered", "attribute_exists(#redelivered)")

    def mark_handed_back(self, key: str, reason: str, *, epoch: str | None = None) -> bool:
        """Final: returned to the server unstarted. With ``epoch``, only if that run owns it."""
        # Anything the server has no outcome for may go back; a live run is claimed first (start_run,
        # take_over) or fenced here by its epoch.
        return self._final(key, LedgerStatus.HANDED_BACK, _unreported(epoch), reason=reason, epoch=epoch)

    def mark_discarded(self, key: str, reason: str, *, epoch: str | None = None) -> bool:
        """Final: dropped unrun (stale, refused, lost). Duplicates never reach this: they have no item."""
        # Same rule as handing back: only what has not been reported, fenced by epoch when given.
        return self._final(key, LedgerStatus.DISCARDED, _unreported(epoch), reason=reason, epoch=epoch)

    def note_settle_failure(self, key: str, error: str, retry_at: float) -> int:
        """A settling call failed: the item is retried by the reaper at ``retry_at`` (its new
        deadline, so it stops holding capacity then); returns the failures in a row.

        ``0`` when the item is already final (someone else settled it meanwhile)."""
        parse_ledger_key(key)
        update = ("SET #deadline = :retry_at, #due = :retry_at, #error = :error, #updated_at = :now "
                  "ADD #settle_failures :one")
        # Only while in flight: a final item left the index and must not be put back in it.
        response = self._update(key, update, "attribute_exists(#scope)",
                                self._values(retry_at=retry_at, error=server_text(error), one=1),
                                returns="UPDATED_NEW", what="the ledger item")
        return int(from_item(response["Attributes"])["settle_failures"]) if response is not None else 0

    def postpone(self, key: str, deadline: float) -> bool:
        """Move an in-flight item's deadline (when the reaper next looks at it)."""
        # Only while in flight, as note_settle_failure.
        return self._transition(key, "SET #deadline = :deadline, #due = :deadline, #updated_at = :now",
                                "attribute_exists(#scope)", deadline=deadline)

    def mark_abandoned(self, key: str, reason: str) -> bool:
        """Final: settling failed too often. The item is DISCARDED and marked as unknown to
        the server, so that the job's return is recorded again (with the stored outcome, if
        any: re-reported, never re-run)."""
        # Only what has not been reported: a reported outcome is acknowledged instead.
        return self._final(key, LedgerStatus.DISCARDED, _UNREPORTED, reason=reason, unknown_to_server=True)

    # -- in flight -----------------------------------------------------------------
    def count_in_flight(self, protocol: str, instance: str, *, live_at: float | None = None) -> int:
        """Unsettled deliveries of this instance (index reads are eventually consistent).

        With ``live_at`` only those whose deadline has not passed by then: something (an
        executor, a state machine) will settle each of them by its deadline. One past its
        deadline is the reaper's, and must not hold a slot of capacity while it waits for
        the next tick's reap: that is what capacity is counted with."""
        scope = scope_of(protocol, instance)
        pages = self._index_pages(scope, None, count=True, not_before=live_at)
        counted = int(sum(page["Count"] for page in pages))
        if live_at is None:
            return counted
        # The index's deadline never is later than the item's: those past it may live on (a run
        # that pushed its deadline out); read them to count the ones whose own deadline has not passed.
        lagging = self._index_items(scope, live_at)
        return counted + sum(1 for item in lagging
                             if not item.is_final and item.deadline is not None and item.deadline >= live_at)

    def in_flight(self, protocol: str, instance: str) -> list[LedgerItem]:
        """Every unsettled delivery of this instance, soonest deadline first."""
        return _soonest_first([item for item in self._index_items(scope_of(protocol, instance), None)
                               if not item.is_final])

    def stranded(self, protocol: str, instance: str, now: float) -> list[LedgerItem]:
        """Unsettled deliveries whose deadline passed before ``now``, re-checked on the full item."""
        return _soonest_first([item for item in self._index_items(scope_of(protocol, instance), now)
                               if not item.is_final and item.deadline is not None and item.deadline < now])

    # -- counters and control --------------------------------------------------------
    def add_counters(self, protocol: str, instance: str, **deltas: int) -> None:
        """Add to named counters (``processed=1, failed=1``) atomically.

        The runtime batches these per container (``runtime.counters.CounterBuffer``):
        they are statistics, not worth a write per job."""
        check_counter_deltas(deltas)
        if not deltas:
            return
        pk = counters_key(protocol, instance)
        update = "SET #updated_at = :now ADD " + ", ".join(f"#{name} :counter_{name}" for name in deltas)
        # No condition: ADD is atomic and commutative, and counters are statistics, not transitions.
        values = self._values(**{f"counter_{name}": delta for name, delta in deltas.items()})
        self._update(pk, update, None, values, what="the counters")

    def read_counters(self, protocol: str, instance: str) -> dict[str, int]:
        attrs = self._get(counters_key(protocol, instance)) or {}
        return {name: int(value) for name, value in attrs.items() if name not in NOT_COUNTERS}

    def get_control(self, protocol: str, instance: str) -> dict[str, Any]:
        """Operator flags for this instance: ``{"stopped": reason | None, "draining": bool,
        "unfit": {handler: reason}}`` (handlers no delivery of which can ever run)."""
        attrs = self._get(control_key(protocol, instance)) or {}
        unfit = {}
        for name, value in attrs.items():
            if name.startswith(UNFIT_PREFIX):
                record = json.loads(value)
                unfit[record["handler"]] = record["reason"]
        return {"stopped": attrs.get("stopped"), "draining": bool(attrs.get("draining", False)),
                "unfit": unfit}

    def set_unfit(self, protocol: str, instance: str, handler: str, reason: str) -> bool:
        """Stop pulling for ``handler``: its timeout can never fit (``runtime.fit``). ``True``
        when this call set it (the first executor to find out), ``False`` when already set."""
        attribute = unfit_attribute(handler)
        update = f"SET #{attribute} = :record, #updated_at = :now"
        # One attribute per handler, set once: two executors finding it at once never lose either.
        condition = f"attribute_not_exists(#{attribute})"
        values = self._values(record=dumps({"handler": handler, "reason": server_text(reason, limit=1000)}))
        return self._update(control_key(protocol, instance), update, condition, values,
                            what="control") is not None

    def clear_unfit(self, protocol: str, instance: str) -> None:
        """Pull for every handler again (the operator fixed the timeouts)."""
        pk = control_key(protocol, instance)
        names = [name for name in (self._get(pk) or {}) if name.startswith(UNFIT_PREFIX)]
        if names:
            # No condition: an operator flag, last writer wins.
            self._update(pk, "SET #updated_at = :now REMOVE " + ", ".join(f"#{n}" for n in names), None,
                         self._values(), what="control")

    def set_stopped(self, protocol: str, instance: str, reason: str | None) -> None:
        """Stop pulling (configuration is wrong) with ``reason``; ``None`` clears it."""
        update = "SET #stopped = :reason, #updated_at = :now" if reason else "SET #updated_at = :now REMOVE #stopped"
        # No condition: an operator flag, last writer wins.
        self._update(control_key(protocol, instance), update, None,
                     self._values(reason=server_text(reason, limit=1000) if reason else reason),
                     what="control")

    def set_draining(self, protocol: str, instance: str, draining: bool) -> None:
        # No condition: an operator flag, last writer wins.
        self._update(control_key(protocol, instance), "SET #draining = :draining, #updated_at = :now", None,
                     self._values(draining=bool(draining)), what="control")

    # -- internals -------------------------------------------------------------------
    def _values(self, **values: Any) -> dict[str, Any]:
        """Expression values: the given ones, ``:now`` and every status by its lower-case name."""
        return {"now": self._clock(), **_STATUS_VALUES, **values}

    def _transition(self, key: str, update: str, condition: str, **values: Any) -> bool:
        parse_ledger_key(key)
        response = self._update(key, update, condition, self._values(**values), what="the ledger item")
        if response is None:
            log.debug("transition refused for %s: %s", key, condition)
        return response is not None

    def _fenced(self, key: str, epoch: str, update: str | tuple[str, str], what: str, *, returns: str = "NONE",
                **values: Any) -> dict[str, Any]:
        """A write only the run ``epoch`` may make; a ``(set, rest)`` update also moves the deadline."""
        parse_ledger_key(key)
        # Only the run holding the epoch may change its item; anyone else lost it (reaped, taken over).
        if isinstance(update, tuple):
            response = self._with_deadline(key, update, _OWNED, self._values(epoch=epoch, **values),
                                           returns=returns, what=what)
        else:
            response = self._update(key, update, _OWNED, self._values(epoch=epoch, **values), returns=returns,
                                    what=what)
        if response is None:
            raise StaleWriteError(f"run {epoch!r} no longer owns this delivery; {what} was not saved",
                                  key=key)
        return response

    def _with_deadline(self, key: str, update: tuple[str, str], condition: str, values: dict[str, Any], *,
                       returns: str = "NONE", what: str) -> dict[str, Any] | None:
        """``update`` (its SET clause and the rest) plus the item's new deadline ``:deadline``.

        The index key stays put when it is not later than the new deadline (the hot path: a
        run's deadline only moves out), so no index write; otherwise, or when the first try is
        refused for any reason, a second write under ``condition`` alone moves it too."""
        set_clause, rest = update
        keep = f"{set_clause}, #{DUE} = :deadline {rest}".strip()
        stays = f"({condition}) AND (attribute_not_exists(#{DEADLINE}) OR #{DEADLINE} <= :deadline)"
        response = self._update(key, keep, stays, values, returns=returns, what=what)
        if response is None:
            moves = f"{set_clause}, #{DUE} = :deadline, #{DEADLINE} = :deadline {rest}".strip()
            response = self._update(key, moves, condition, values, returns=returns, what=what)
        return response

    def _final(self, key: str, status: LedgerStatus, condition: str, *, reason: str | None = None,
               epoch: str | None = None, report: str | None = None, unknown_to_server: bool = False) -> bool:
        update = "SET #status = :final, #updated_at = :now, #ttl = :ttl"
        if reason is not None:
            update += ", #error = :reason"
            reason = server_text(reason, limit=1000)
        if report is not None:
            update += ", #report = :report"
        if unknown_to_server:
            update += ", #unknown_to_server = :yes"
        # Leaving the index is what makes it no longer in flight; the checkpoint is dead weight now.
        update += " REMOVE #scope, #deadline, #due, #checkpoint"
        ttl = int(self._clock()) + self._final_retention
        return self._transition(key, update, condition, final=status.value, ttl=ttl, reason=reason,
                                epoch=epoch, report=report, yes=True)

    def _key(self, pk: str) -> dict[str, Any]:
        return {PK: {"S": pk}, SK: {"S": sort_key_for(pk)}}

    @staticmethod
    def _expression(*expressions: str | None, values: dict[str, Any]) -> dict[str, Any]:
        """Names and values for the expressions: exactly those they use (DynamoDB rejects extras)."""
        text = " ".join(e for e in expressions if e)
        names = {f"#{name}": name for name in _NAME.findall(text)}
        used = {f":{name}": to_attribute(values[name]) for name in set(_VALUE.findall(text))}
        request: dict[str, Any] = {}
        if names:
            request["ExpressionAttributeNames"] = names
        if used:
            request["ExpressionAttributeValues"] = used
        return request

    def _get(self, pk: str) -> dict[str, Any] | None:
        response = self._call("read", "get_item", pk, {"Key": self._key(pk), "ConsistentRead": True})
        item = (response or {}).get("Item")
        return from_item(item) if item else None

    def _put(self, pk: str, item: dict[str, Any], condition: str, values: dict[str, Any], *,
             what: str, returns: str = "NONE") -> dict[str, Any] | None:
        request = {"Item": item, "ConditionExpression": condition, "ReturnValues": returns,
                   **self._expression(condition, values=values)}
        return self._call("write", "put_item", pk, request, what=what)

    def _update(self, pk: str, update: str, condition: str | None, values: dict[str, Any], *,
                returns: str = "NONE", what: str) -> dict[str, Any] | None:
        request: dict[str, Any] = {"Key": self._key(pk), "UpdateExpression": update, "ReturnValues": returns,
                                   **self._expression(update, condition, values=values)}
        if condition:
            request["ConditionExpression"] = condition
        return self._call("write", "update_item", pk, request, what=what)

    def _call(self, kind: str, operation: str, key: str, request: dict[str, Any], *,
              what: str = "") -> dict[str, Any] | None:
        """One DynamoDB request; ``None`` when its condition refused it. The one place errors translate."""
        written = _written_size(request) if kind == "write" else 0
        if written > ITEM_MAX_BYTES:
            raise ItemTooLargeError(key, what, written, ITEM_MAX_BYTES)
        if operation != "batch_get_item":
            request = {"TableName": self.table_name, **request}
        with self._ops_lock:
            self.ops[kind] += 1
        try:
            response: dict[str, Any] = getattr(self._client, operation)(**request)
            return response
        except ClientError as err:
            error = err.response.get("Error", {})
            code, message = error.get("Code", ""), error.get("Message", "")
            if code == "ConditionalCheckFailedException":
                return None
            if code == "ValidationException" and "item size" in message.lower():
                raise ItemTooLargeError(key, what, written, ITEM_MAX_BYTES) from err
            raise StateStoreError(f"DynamoDB {operation} for {key} failed: {code}: {message}") from err
        except BotoCoreError as err:
            raise StateStoreError(f"DynamoDB {operation} for {key} failed: {type(err).__name__}") from err

    def _index_pages(self, scope: str, before: float | None, *, count: bool,
                     not_before: float | None = None) -> Iterator[dict[str, Any]]:
        condition = "#scope = :scope"
        if before is not None:
            condition += " AND #deadline < :before"
        elif not_before is not None:
            condition += " AND #deadline >= :not_before"
        values = {"scope": scope, "before": before, "not_before": not_before}
        request: dict[str, Any] = {"IndexName": IN_FLIGHT_INDEX, "KeyConditionExpression": condition,
                                   **self._expression(condition, values=values)}
        if count:
            request["Select"] = "COUNT"
        while True:
            page = self._call("read", "query", scope, request)
            assert page is not None  # queries have no condition to refuse
            yield page
            if "LastEvaluatedKey" not in page:
                return
            request["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def _index_items(self, scope: str, before: float | None) -> list[LedgerItem]:
        """Query the index, then read the full items (the index holds keys only)."""
        keys = [entry[PK]["S"] for page in self._index_pages(scope, before, count=False)
                for entry in page.get("Items", [])]
        found: dict[str, LedgerItem] = {}
        for start in range(0, len(keys), _BATCH_GET_MAX):
            for attrs in self._batch_get(keys[start:start + _BATCH_GET_MAX], scope):
                found[attrs[PK]] = LedgerItem.from_attributes(attrs)
        return [found[key] for key in keys if key in found]

    def _batch_get(self, pks: list[str], scope: str) -> list[dict[str, Any]]:
        pending: dict[str, Any] = {
            self.table_name: {"Keys": [self._key(pk) for pk in pks], "ConsistentRead": True}}
        items: list[dict[str, Any]] = []
        for attempt in range(8):
            response = self._call("read", "batch_get_item", scope, {"RequestItems": pending})
            assert response is not None
            items.extend(from_item(item) for item in response.get("Responses", {}).get(self.table_name, []))
            pending = response.get("UnprocessedKeys") or {}
            if not pending:
                return items
            time.sleep(min(1.0, 0.05 * 2**attempt))  # unprocessed keys are throttling: back off
        raise StateStoreError(f"DynamoDB batch_get_item for {scope} left keys unprocessed after 8 attempts")


def _soonest_first(items: list[LedgerItem]) -> list[LedgerItem]:
    """By the items' own deadlines (the index orders by its key, which may lag behind them)."""
    return sorted(items, key=lambda item: item.deadline if item.deadline is not None else 0.0)


def _unreported(epoch: str | None) -> str:
    return _UNREPORTED + (" AND #epoch = :epoch" if epoch else "")


def _written_size(request: dict[str, Any]) -> int:
    """Bytes a write puts into one item: the whole item for a put, key plus values for an update."""
    if "Item" in request:
        return item_size(request["Item"])
    values = request.get("ExpressionAttributeValues", {})
    return item_size(request.get("Key", {})) + item_size(values)
