"""The ledger's rulebook, written once for every backend: which status may move to which and
under which condition (the fences), retention, counter names, the hand-back epoch, and how
a report receipt or an unfit handler is recorded.

``TRANSITIONS`` is the table; the base store (``state/base.py``) looks each write's
condition up in it, and docs/ledger.md's table is generated from it
(``scripts/ledger_doc.py``; a test fails when they disagree)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from ..model import LedgerStatus, ReportReceipt
from .conditions import Compare, Condition, Exists, Missing, OneOf, Param, StartsWith
from .keys import PK, SCOPE, SK, TTL

__all__ = [
    "EXPIRED_RETENTION_SECONDS",
    "TRANSITIONS",
    "Transition",
    "FINAL_RETENTION_SECONDS",
    "HANDBACK_EPOCH_PREFIX",
    "NOT_COUNTERS",
    "UNFIT_PREFIX",
    "check_counter_deltas",
    "in_doubt",
    "recording_condition",
    "transition",
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


# -- the ledger's transitions -------------------------------------------------------------
S = LedgerStatus


def status_in(*statuses: LedgerStatus) -> Condition:
    return OneOf("status", statuses)


# A run's fence: the item is running and this epoch owns it.
OWNED = status_in(S.RUNNING) & Compare("epoch", "=", Param("epoch"))
# Not yet reported: the server has no outcome from us, so the delivery may still go back or be dropped.
UNREPORTED = status_in(S.RECORDED, S.DISPATCHED, S.DISPATCH_FAILED, S.RUNNING, S.OUTCOME_STORED)
# In flight: the item is in the in-flight index (the final write takes it out).
IN_FLIGHT = Exists(SCOPE)
# A settled item past its ttl counts as gone (DynamoDB's TTL and the SQLite sweep delete late).
EXPIRED = Compare(TTL, "<", Param("now"))


# Cases of a write that has more than one row (the table's second column).
CASE_RECORD_NEW = "a new delivery"
CASE_RECORD_AGAIN = "`again_after_hand_back` (the runtime always asks)"
CASE_RECORD_SETTLED_BEFORE = "`settled_before` (protocols whose settled ids return as new)"
CASE_RECORD_DUPLICATE = "a duplicate: note `redelivered`"
CASE_RECORD_FORGOTTEN = "a forgotten job's stored outcome kept"
CASE_DISPATCH_FAILED_NOW = "deadline now: reaped next"
CASE_HANDBACK_CLAIM = "a hand-back claim (epoch `handback:...`)"
CASE_WITH_RECEIPT = "with the receipt"
CASE_WITH_RECEIPT_NOT_FOUND = "with a receipt the server answered \"not found\""
CASE_WITH_EPOCH = "with the run's epoch"
CASE_SETTLE_RETRY = "deadline = the reaper's retry time"


@dataclass(frozen=True)
class Transition:
    """One conditional write of a ledger item: the store method, the case of it, the
    condition the stored item must meet (an absent item meets ``creates`` writes only),
    the status it moves to (``None``: unchanged) and what the method answers when refused."""

    write: str
    case: str
    condition: Condition
    to: LedgerStatus | None
    refused: str
    creates: bool = False


# When a delivery may be recorded over a stored item, written once for both recording writes
# (``record_delivery``, the scheduler's; ``record_running``, an executor's that pulled it itself).
# Also while a hand-back is still in progress (its claim's epoch says so): the server may
# redeliver before the hand-back's own ledger write lands, and that delivery is the job
# coming back; or a job whose report the server answered "not found" (a Priostack restart
# forgot the activation): it comes back under the same key and must not be dropped.
RECORD_AGAIN = (status_in(S.HANDED_BACK) | (status_in(S.RUNNING) & StartsWith("epoch", HANDBACK_EPOCH_PREFIX))
                | Compare("unknown_to_server", "=", True))
# The server handed out the id after it had our outcome, which it does only once it
# forgot it (reset): new work.
RECORD_SETTLED_BEFORE = status_in(S.ACKNOWLEDGED, S.DISCARDED) & Compare("updated_at", "<", Param("settled_before"))


def _recording_rows(write: str, to: LedgerStatus, forgotten_from: Condition, kept: str) -> tuple[Transition, ...]:
    """One recording write's rows: the same conditions for both writes, each into its own
    status; a forgotten job's outcome is then kept by a second write fenced by ``forgotten_from``."""
    return (
        Transition(write, CASE_RECORD_NEW, EXPIRED, to, "`None`: a duplicate", creates=True),
        Transition(write, CASE_RECORD_AGAIN, RECORD_AGAIN, to, "`None`: a duplicate", creates=True),
        Transition(write, CASE_RECORD_SETTLED_BEFORE, RECORD_SETTLED_BEFORE, to, "`None`: a duplicate",
                   creates=True),
        # A duplicate while in flight is noted: a report the server then answers "not found" must be sent again.
        Transition(write, CASE_RECORD_DUPLICATE, IN_FLIGHT, None, "nothing to note"),
        # A job the server forgot comes back with our outcome stored: re-report it, never re-run.
        Transition(write, CASE_RECORD_FORGOTTEN, forgotten_from, S.OUTCOME_STORED, kept),
    )


_TABLE = (
    *_recording_rows("record_delivery", S.RECORDED, status_in(S.RECORDED), "`RECORDED` kept"),
    # An executor that pulled the delivery itself: recorded and claimed by its run in one write.
    *_recording_rows("record_running", S.RUNNING, OWNED, "`None`: another run owns it"),
    Transition("record_new", "each delivery of a batch", Missing(PK), S.RECORDED,
               "`None`: `record_delivery` decides", creates=True),
    # Only a recorded item: an executor that claimed it first has already moved it on.
    Transition("mark_dispatched", "", status_in(S.RECORDED), S.DISPATCHED, "`False`"),
    # Only while no run has claimed it: an ambiguous invoke may have started the executor after all.
    Transition("mark_dispatch_failed", CASE_DISPATCH_FAILED_NOW, status_in(S.RECORDED, S.DISPATCHED),
               S.DISPATCH_FAILED, "`False`"),
    # Claim an unstarted delivery, or resume our own run (a continuation slice, a retried invocation).
    Transition("start_run", "", status_in(S.RECORDED, S.DISPATCHED) | OWNED, S.RUNNING, "`None`"),
    # One whose dispatch failed is only claimed to be handed back (the reaper), never run.
    Transition("start_run", CASE_HANDBACK_CLAIM,
               status_in(S.RECORDED, S.DISPATCHED, S.DISPATCH_FAILED) | OWNED, S.RUNNING, "`None`"),
    # Compare-and-swap on the epoch: one successor wins, and the old run's fenced writes fail from now on.
    Transition("take_over", "", status_in(S.RUNNING) & Compare("epoch", "=", Param("old_epoch")), S.RUNNING,
               "`False`"),
    # Only the run holding the epoch may change its item; anyone else lost it (reaped, taken over).
    Transition("save_checkpoint", "", OWNED, None, "`StaleWriteError`"),
    Transition("renew_deadline", "", OWNED, None, "`StaleWriteError`"),
    Transition("save_callback_token", "", OWNED, None, "`StaleWriteError`"),
    # Only the current run: a stale renew loop must not cancel its successor.
    Transition("request_cancel", "", OWNED, None, "`False`"),
    Transition("request_handover", "", OWNED, None, "`False`"),
    # The epoch carries across continue-as-new: only the run that asked clears it.
    Transition("clear_handover", "", OWNED, None, "`False`"),
    Transition("store_outcome", "", OWNED, S.OUTCOME_STORED, "`StaleWriteError`"),
    # A report follows a stored outcome; a second reporter finds it already reported.
    Transition("mark_reported", "", status_in(S.OUTCOME_STORED), S.REPORTED, "`False`"),
    # Acknowledging settles a reported outcome, once.
    Transition("mark_acknowledged", "", status_in(S.REPORTED), S.ACKNOWLEDGED, "`False`"),
    # Report and acknowledgement of a stored outcome recorded together, once.
    Transition("mark_acknowledged", CASE_WITH_RECEIPT, status_in(S.OUTCOME_STORED, S.REPORTED), S.ACKNOWLEDGED,
               "`False`"),
    # Not while a redelivery is noted: the report is due again (see record_delivery).
    Transition("mark_acknowledged", CASE_WITH_RECEIPT_NOT_FOUND,
               status_in(S.OUTCOME_STORED, S.REPORTED) & Missing("redelivered"), S.ACKNOWLEDGED, "`False`"),
    Transition("clear_redelivered", "", Exists("redelivered"), None, "`False`"),
    # Anything the server has no outcome for may go back; a live run is claimed first
    # (start_run, take_over) or fenced here by its epoch.
    Transition("mark_handed_back", "", UNREPORTED, S.HANDED_BACK, "`False`"),
    Transition("mark_handed_back", CASE_WITH_EPOCH, UNREPORTED & Compare("epoch", "=", Param("epoch")),
               S.HANDED_BACK, "`False`"),
    Transition("mark_discarded", "", UNREPORTED, S.DISCARDED, "`False`"),
    Transition("mark_discarded", CASE_WITH_EPOCH, UNREPORTED & Compare("epoch", "=", Param("epoch")),
               S.DISCARDED, "`False`"),
    # Only while in flight: a final item left the index and must not be put back in it.
    Transition("note_settle_failure", CASE_SETTLE_RETRY, IN_FLIGHT, None, "`0`"),
    Transition("postpone", "", IN_FLIGHT, None, "`False`"),
    # Only what has not been reported (a reported outcome is acknowledged instead); marked
    # unknown to the server, so that the job's return is recorded again.
    Transition("mark_abandoned", "", UNREPORTED, S.DISCARDED, "`False`"),
)

TRANSITIONS: dict[tuple[str, str], Transition] = {(t.write, t.case): t for t in _TABLE}


def transition(write: str, case: str = "") -> Transition:
    """The table's row for one write (and case of it)."""
    return TRANSITIONS[(write, case)]


def recording_condition(again_after_hand_back: bool, settled_before: bool) -> Condition:
    """When ``record_delivery`` or ``record_running`` may replace a stored item: their rows
    for the cases asked (the same for both; built once each)."""
    return _RECORDING[(again_after_hand_back, settled_before)]


def _recording(again_after_hand_back: bool, settled_before: bool) -> Condition:
    condition = transition("record_delivery", CASE_RECORD_NEW).condition
    if again_after_hand_back:
        condition = condition | transition("record_delivery", CASE_RECORD_AGAIN).condition
    if settled_before:
        condition = condition | transition("record_delivery", CASE_RECORD_SETTLED_BEFORE).condition
    return condition


_RECORDING = {(again, settled): _recording(again, settled) for again in (False, True) for settled in (False, True)}


# -- sessions, the lock, operator flags -----------------------------------------------------
# None stored, or one load_session already treats as absent (expired, not yet deleted by TTL).
SESSION_ABSENT = Missing("expires_at") | Compare("expires_at", "<=", Param("now"))
# Optimistic concurrency: nobody saved a session since we loaded this version.
SESSION_UNCHANGED = Compare("version", "=", Param("expected"))
# Free (absent, or abandoned past its expiry), or already ours (re-entrant extend).
LOCK_FREE = Compare("expires_at", "<=", Param("now")) | Compare("owner", "=", Param("owner"))
# Only the holder frees it: a lock that expired and was taken by another stays theirs.
LOCK_HELD = Compare("owner", "=", Param("owner"))
