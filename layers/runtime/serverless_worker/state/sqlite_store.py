"""The state store on one SQLite file (standard library ``sqlite3``, WAL mode).

The same contract as the DynamoDB backend (``state/contract.py``, docs/ledger.md), for a
worker on one machine. Each item is one row: its attributes as a JSON document in
``doc`` (the same names and JSON-string documents as the DynamoDB item), with generated,
indexed columns for what queries need (``scope`` + ``deadline``: the in-flight index;
``ttl``: the expiry sweep). Every conditional transition is one guarded
``UPDATE ... WHERE <condition>`` (or an upsert whose ``DO UPDATE ... WHERE`` guards it):
its row count decides, as DynamoDB's condition does, and a lost fence raises the same
:class:`StaleWriteError`. DynamoDB's TTL becomes a sweep that deletes expired rows when
the store opens and then at most every ``sweep_interval`` seconds, on a write.

Threads: a connection per thread for reads (WAL lets them run beside the writer), and
one connection for every write; writes queued while one commits are committed together
in one ``BEGIN IMMEDIATE`` transaction (``group_commit.py``), and another process's
writer waits on SQLite's lock (``busy_timeout``) instead of failing. Sizes are held to DynamoDB's 400 KB
item limit, measured as DynamoDB measures, so a job behaves the same on both backends.

Example::

    store = SqliteStateStore(Path(".serverless-worker/state.db"))
"""

from __future__ import annotations

import functools
import json
import logging
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..logsafety import server_text
from ..model import Delivery, DispatchMode, LedgerStatus, Outcome, ReportReceipt, SessionState
from .errors import (
    DeliveryTooLargeError,
    ItemTooLargeError,
    StaleWriteError,
    StateStoreError,
    UnrecordableDeliveryError,
)
from .group_commit import GroupCommit
from .items import (
    LedgerItem,
    attributes_size,
    attributes_size_bound,
    compact_model,
    dumps,
    encoded_document,
    recordable,
    recorded_attributes,
)
from .keys import (
    DEADLINE,
    ITEM_MAX_BYTES,
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
    unfit_attribute,
)

__all__ = ["SqliteStateStore"]

log = logging.getLogger("serverless_worker.state")

_T = TypeVar("_T")

# DynamoDB's size of an item is at most twice its compact JSON's bytes (a one-digit number
# is 2 bytes there, 1 in JSON; everything else costs JSON more), and UTF-8 spends at most
# 4 bytes a character: so 8 bytes per JSON character bound the size from above.
_BOUND_PER_CHAR = 8
# Rows in the order they were written (a rowid table; ``pk`` is a unique index beside it):
# a job's writes come within seconds of its record, so a group commit's writes land on the
# few newest pages, where rows kept in key order (job ids are random) put nearly every
# write of a group on a page of its own, each page written to the WAL again.
_SCHEMA_VERSION = 3
_TABLE = f"""
CREATE TABLE IF NOT EXISTS items (
    pk TEXT NOT NULL UNIQUE,
    doc TEXT NOT NULL,
    scope TEXT GENERATED ALWAYS AS (json_extract(doc, '$.{SCOPE}')) VIRTUAL,
    deadline REAL GENERATED ALWAYS AS (json_extract(doc, '$.{DEADLINE}')) VIRTUAL,
    ttl INTEGER GENERATED ALWAYS AS (json_extract(doc, '$.{TTL}')) VIRTUAL
);
"""
_INDEXES = """
CREATE INDEX IF NOT EXISTS in_flight ON items (scope, deadline) WHERE scope IS NOT NULL;
CREATE INDEX IF NOT EXISTS expiry ON items (ttl) WHERE ttl IS NOT NULL;
"""
# Facts about the file itself, not items of the table (which server its ids came from):
# version 3 added it, and an older file gains it empty.
_META = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
# Version 1 kept rows in key order (WITHOUT ROWID); its rows move over as they are.
_MIGRATE_FROM_1 = f"""
ALTER TABLE items RENAME TO items_v1;
DROP INDEX IF EXISTS in_flight;
DROP INDEX IF EXISTS expiry;
{_TABLE}
INSERT INTO items (pk, doc) SELECT pk, doc FROM items_v1;
DROP TABLE items_v1;
"""

_UNREPORTED_STATUSES = (LedgerStatus.RECORDED, LedgerStatus.DISPATCHED, LedgerStatus.DISPATCH_FAILED,
                        LedgerStatus.RUNNING, LedgerStatus.OUTCOME_STORED)


@functools.lru_cache(maxsize=256)
def _named_parameters(expression: str, count: int) -> str:
    """``expression`` with its ``count`` positional ``?`` as ``:p0``, ``:p1`` ..., to sit beside
    the condition's named parameters. A patch's SQL depends only on its shape, so few exist."""
    for i in range(count):
        expression = expression.replace("?", f":p{i}", 1)
    return expression


def _attr(name: str) -> str:
    """SQL for one attribute of the document (names are the store's own, never caller text)."""
    return f"json_extract(doc, '$.{name}')"


def _exists(name: str) -> str:
    return f"json_type(doc, '$.{name}') IS NOT NULL"


def _status_in(statuses: Sequence[LedgerStatus]) -> str:
    return _status_sql(tuple(statuses))


@functools.lru_cache(maxsize=32)
def _status_sql(statuses: tuple[LedgerStatus, ...]) -> str:
    """The SQL of a status condition, built once per set of statuses (every write asks)."""
    return f"{_attr('status')} IN ({', '.join(repr(s.value) for s in statuses)})"


_OWNED = f"{_attr('status')} = '{LedgerStatus.RUNNING.value}' AND {_attr('epoch')} = :epoch"
_UNREPORTED = _status_in(_UNREPORTED_STATUSES)


class _Patch:
    """An UpdateExpression as one SQL expression over ``doc``: SET, ADD, if_not_exists, REMOVE.

    Consecutive sets share one ``json_set`` call and consecutive removes one
    ``json_remove``: SQLite parses the document once per call, and a nested call per
    attribute made an update parse it five times. The order of the calls is kept, so
    ``remove(x).set(x=...)`` still sets ``x``.
    """

    def __init__(self) -> None:
        self._layers: list[tuple[str, list[str]]] = []  # (SQL function, its arguments after the document)
        self.params: list[Any] = []
        self.written: dict[str, Any] = {}

    @property
    def expression(self) -> str:
        expression = "doc"
        for function, arguments in self._layers:
            expression = f"{function}({expression}, {', '.join(arguments)})"
        return expression

    def _layer(self, function: str, *arguments: str) -> None:
        if self._layers and self._layers[-1][0] == function:
            self._layers[-1][1].extend(arguments)
        else:
            self._layers.append((function, list(arguments)))

    def remove(self, *names: str) -> _Patch:
        for name in names:
            self._layer("json_remove", "?")
            self.params.append(f"$.{name}")
        return self

    def set(self, **values: Any) -> _Patch:
        for name, value in values.items():
            if value is None:
                continue
            # Booleans as JSON booleans, as DynamoDB's BOOL (sqlite3 would bind them as 0/1).
            self._layer("json_set", "?", "json(?)" if isinstance(value, bool) else "?")
            self.params += [f"$.{name}", json.dumps(value) if isinstance(value, bool) else value]
            self.written[name] = value
        return self

    def add(self, **deltas: int) -> _Patch:
        for name, delta in deltas.items():
            self._layer("json_set", "?", "coalesce(json_extract(doc, ?), 0) + ?")
            self.params += [f"$.{name}", f"$.{name}", delta]
            self.written[name] = delta
        return self

    def set_if_missing(self, **values: Any) -> _Patch:
        for name, value in values.items():
            self._layer("json_set", "?", "coalesce(json_extract(doc, ?), ?)")
            self.params += [f"$.{name}", f"$.{name}", value]
            self.written[name] = value
        return self


class SqliteStateStore:
    """The worker's state in one SQLite file; ``path`` is created with its schema when new.

    ``clock`` and ``final_retention_seconds`` mean what they mean for the DynamoDB
    backend; ``ops`` counts statements as ``"read"`` and ``"write"``.
    """

    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time,
                 final_retention_seconds: int = FINAL_RETENTION_SECONDS, sweep_interval: float = 60.0,
                 busy_timeout_seconds: float = 30.0,
                 on_swept: Callable[[list[str]], None] | None = None) -> None:
        self.path = str(path)
        self._on_swept = on_swept
        self._clock = clock
        self._final_retention = int(final_retention_seconds)
        self._sweep_interval = sweep_interval
        self._busy_timeout = busy_timeout_seconds
        self.ops: Counter[str] = Counter()
        self._ops_lock = threading.Lock()
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._connections_lock = threading.Lock()
        # Writers in this process take turns here rather than on SQLite's file lock, whose
        # busy handler sleeps (1, 2, 5 ... 100 ms) between tries: with dozens of executor
        # threads that sleeping, not the writes, set the pace; and the writes queued while
        # one commits are committed together (group_commit.py). Other processes still meet
        # the file lock (busy_timeout).
        # Every group is committed on one connection, whichever thread leads it: a connection
        # whose pages another connection changed reads them again from the WAL, and with a
        # connection per leading thread every commit left every other one stale.
        self._writer: sqlite3.Connection | None = None
        self._writes = GroupCommit(self._writer_connection)
        self._next_sweep = 0.0
        self._create_schema(self._writer_connection())
        self.sweep()

    # -- connections -----------------------------------------------------------------
    def _connection(self) -> sqlite3.Connection:
        """The calling thread's connection, for reads (WAL lets them run beside the writer)."""
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._local.connection = self._open()
        return connection

    def _writer_connection(self) -> sqlite3.Connection:
        """The one connection every write transaction runs on (the group commit's leader
        holds it alone)."""
        if self._writer is None:
            self._writer = self._open()
        return self._writer

    def _open(self) -> sqlite3.Connection:
        try:
            connection = sqlite3.connect(self.path, timeout=self._busy_timeout, isolation_level=None,
                                         check_same_thread=False)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at checkpoints, never corrupt
        except sqlite3.Error as err:
            raise StateStoreError(f"SQLite state store {self.path}: cannot open: {err}") from err
        with self._connections_lock:
            self._connections.append(connection)
        return connection

    def _create_schema(self, db: sqlite3.Connection) -> None:
        """Create the schema, or bring a file of an earlier version to this one."""
        try:
            db.execute("BEGIN IMMEDIATE")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            old = db.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'items'").fetchone()
            if old is not None and version < _SCHEMA_VERSION and "WITHOUT ROWID" in old[0].upper():
                for statement in _MIGRATE_FROM_1.split(";"):
                    if statement.strip():
                        db.execute(statement)
            else:
                db.execute(_TABLE)
            for statement in _INDEXES.split(";"):
                if statement.strip():
                    db.execute(statement)
            db.execute(_META)
            db.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
            db.execute("COMMIT")
        except sqlite3.Error as err:
            if db.in_transaction:
                db.rollback()
            raise StateStoreError(f"SQLite state store {self.path}: cannot create the schema: {err}") from err

    def close(self) -> None:
        """Commit what is queued unwaited, then close every thread's connection (the file
        stays; a new store reopens it)."""
        try:
            self._writes.flush()
        except sqlite3.Error as err:  # closing anyway; the next start settles what was not saved
            log.warning("SQLite state store %s: queued writes not saved at close: %s", self.path, err)
        with self._connections_lock:
            for connection in self._connections:
                connection.close()
            self._connections.clear()
        self._local = threading.local()
        self._writer = None

    @property
    def commits(self) -> int:
        """Write transactions committed (fewer than ``ops["write"]`` when writes were grouped)."""
        return self._writes.commits

    def _count(self, kind: str) -> None:
        with self._ops_lock:
            self.ops[kind] += 1

    def _write(self, write: Callable[[sqlite3.Connection], _T], *, counted: bool = True) -> _T:
        """``write(connection)`` in a write transaction (``BEGIN IMMEDIATE``, so it never
        deadlocks on upgrade), committed before this returns; SQLite's errors as the store's."""
        if counted:
            self._count("write")
        try:
            result: _T = self._writes.run(write)
        except sqlite3.Error as err:
            raise StateStoreError(f"SQLite state store {self.path}: write failed: {err}") from err
        return result

    def sweep(self) -> int:
        """Delete rows past their ``ttl`` (DynamoDB's TTL, as a sweep); returns how many went."""
        now = self._clock()
        self._next_sweep = now + self._sweep_interval
        keys: list[str] = self._write(  # housekeeping, free like DynamoDB's TTL: not in ops
            lambda db: [row[0] for row in db.execute(
                "DELETE FROM items WHERE ttl IS NOT NULL AND ttl < ? RETURNING pk", (now,)).fetchall()],
            counted=False)
        if keys and self._on_swept is not None:
            self._on_swept(keys)  # the local runner forgets what it kept per swept delivery
        return len(keys)

    def _maybe_sweep(self) -> None:
        if self._clock() >= self._next_sweep:
            self.sweep()

    # -- rows ------------------------------------------------------------------------
    def _get(self, pk: str) -> dict[str, Any] | None:
        self._count("read")
        try:
            row = self._connection().execute("SELECT doc FROM items WHERE pk = ?", (pk,)).fetchone()
        except sqlite3.Error as err:
            raise StateStoreError(f"SQLite state store read of {pk} failed: {err}") from err
        return dict(json.loads(row[0])) if row else None

    @staticmethod
    def _check_size(pk: str, what: str, attributes: dict[str, Any], text: str) -> None:
        """DynamoDB's item limit. ``text`` is the item as JSON: DynamoDB's size of an item is
        at most twice its JSON's bytes, at most four per character, so a document under an
        eighth of the limit in characters (every ledger item) needs no exact count."""
        if len(text) * _BOUND_PER_CHAR <= ITEM_MAX_BYTES:
            return
        size = attributes_size(attributes)
        if size > ITEM_MAX_BYTES:
            raise ItemTooLargeError(pk, what, size, ITEM_MAX_BYTES)

    def _after(self, pk: str, what: str, row: Any) -> dict[str, Any] | None:
        """The row an update returned, checked against the item limit (rolled back when past it)."""
        if row is None:
            return None
        doc: dict[str, Any] = json.loads(row[0])
        if len(row[0]) * _BOUND_PER_CHAR > ITEM_MAX_BYTES and (size := attributes_size(doc)) > ITEM_MAX_BYTES:
            raise ItemTooLargeError(pk, what, size, ITEM_MAX_BYTES)
        return doc

    def _after_length(self, db: sqlite3.Connection, pk: str, what: str, row: Any) -> dict[str, Any] | None:
        """Like :meth:`_after` for an update that returned only the document's length: the
        document is read (and decoded) only when that length could put it past the limit."""
        if row is None:
            return None
        if row[0] * _BOUND_PER_CHAR > ITEM_MAX_BYTES:
            self._after(pk, what, db.execute("SELECT doc FROM items WHERE pk = ?", (pk,)).fetchone())
        return {}

    def _update(self, pk: str, patch: _Patch, condition: str | None, *, what: str, upsert: bool = False,
                returning: bool = True, wait: bool = True, **values: Any) -> dict[str, Any] | None:
        """Apply ``patch`` where ``condition`` holds; the new document, or ``None`` when refused.

        ``upsert`` creates the item when absent (an update without a condition does, in DynamoDB).
        Without ``returning`` an applied update gives ``{}``: most transitions need only to
        know that they applied. Without ``wait`` it is queued for the next group commit and
        gives ``{}`` at once (see ``mark_acknowledged``); a failure is logged, not raised.

        The item limit is held without asking SQLite for the new document: the update also
        requires the old one to be short enough that nothing the patch adds can take it
        near the limit (``fits``), which every ledger item is. Only when that part refuses
        does the update run again with ``RETURNING``, whose answer is then sized exactly:
        a ``RETURNING`` clause doubled an update's cost (70 against 35 µs).
        """
        self._maybe_sweep()
        attributes = {PK: pk, **patch.written}
        if attributes_size_bound(attributes) > ITEM_MAX_BYTES and \
                (written := attributes_size(attributes)) > ITEM_MAX_BYTES:
            raise ItemTooLargeError(pk, what, written, ITEM_MAX_BYTES)
        named = {f"p{i}": p for i, p in enumerate(patch.params)}
        expression = _named_parameters(patch.expression, len(patch.params))
        where = f" AND ({condition})" if condition else ""
        update = f"UPDATE items SET doc = {expression} WHERE pk = :pk{where}"
        fits = ITEM_MAX_BYTES // _BOUND_PER_CHAR - _json_growth_bound(patch.written)
        base = dumps({PK: pk, SK: sort_key_for(pk)}) if upsert else None

        def write(db: sqlite3.Connection) -> dict[str, Any] | None:
            if base is not None:
                db.execute("INSERT OR IGNORE INTO items (pk, doc) VALUES (:pk, :base)", {"pk": pk, "base": base})
            params = {"pk": pk, **named, **values}
            if db.execute(f"{update} AND length(doc) <= :fits", {**params, "fits": fits}).rowcount == 1:
                if not returning:
                    return {}
                row = db.execute("SELECT doc FROM items WHERE pk = ?", (pk,)).fetchone()
                return dict(json.loads(row[0]))
            # Refused, or a document long enough for its exact size to decide.
            row = db.execute(f"{update} RETURNING {'doc' if returning else 'length(doc)'}", params).fetchone()
            return self._after(pk, what, row) if returning else self._after_length(db, pk, what, row)

        if not wait:
            self._count("write")
            self._writes.submit(write, lambda err: log.warning(
                "SQLite state store %s: %s of %s was not saved (%s: %s); the next start settles it again",
                self.path, what, pk, type(err).__name__, err))
            return {}
        return self._write(write)

    def _put(self, pk: str, attributes: dict[str, Any], condition: str, *, what: str,
             **values: Any) -> tuple[bool, dict[str, Any]]:
        """Write the whole item when absent or ``condition`` holds; ``(written, old item)``."""
        self._maybe_sweep()
        item = {name: value for name, value in attributes.items() if value is not None}
        text = dumps(item)
        self._check_size(pk, what, item, text)

        def write(db: sqlite3.Connection) -> tuple[bool, dict[str, Any]]:
            if db.execute("INSERT INTO items (pk, doc) VALUES (?, ?) ON CONFLICT (pk) DO NOTHING",
                          (pk, text)).rowcount == 1:
                return True, {}  # the usual case, a new item: one statement
            row = db.execute("SELECT doc FROM items WHERE pk = ?", (pk,)).fetchone()
            count = db.execute(f"UPDATE items SET doc = :doc WHERE pk = :pk AND ({condition})",
                               {"pk": pk, "doc": text, **values}).rowcount
            return count == 1, dict(json.loads(row[0]))

        return self._write(write)

    # -- worker session ----------------------------------------------------------
    def load_session(self, protocol: str, instance: str) -> tuple[SessionState, int] | None:
        attrs = self._get(session_key(protocol, instance))
        if attrs is None or float(attrs["expires_at"]) <= self._clock():
            return None
        return SessionState.model_validate(json.loads(attrs["session"])), int(attrs["version"])

    def save_session(self, protocol: str, instance: str, session: SessionState,
                     expected_version: int | None) -> int:
        pk = session_key(protocol, instance)
        now = self._clock()
        patch = _Patch().set(session=dumps(session.to_record()), expires_at=session.expires_at,
                             ttl=int(session.expires_at) + EXPIRED_RETENTION_SECONDS, updated_at=now,
                             protocol=protocol, instance=instance)
        if expected_version is None:
            # None stored, or one load_session treats as absent (expired, not yet swept).
            condition = f"{_attr('expires_at')} IS NULL OR {_attr('expires_at')} <= :now"
            doc = self._update(pk, patch.add(version=1), condition, what="the session", upsert=True, now=now)
        else:
            # Optimistic concurrency: nobody saved a session since we loaded this version.
            doc = self._update(pk, patch.set(version=expected_version + 1), f"{_attr('version')} = :expected",
                               what="the session", expected=expected_version)
        if doc is None:
            raise StaleWriteError(f"session changed since version {expected_version} was loaded", key=pk)
        return int(doc["version"])

    # -- bootstrap lock ----------------------------------------------------------
    def acquire_lock(self, name: str, owner: str, ttl_seconds: float) -> bool:
        pk = lock_key(name)
        now = self._clock()
        expires_at = now + ttl_seconds
        item = {PK: pk, SK: sort_key_for(pk), "owner": owner, "expires_at": expires_at, "acquired_at": now,
                TTL: int(expires_at) + EXPIRED_RETENTION_SECONDS}
        # Free, abandoned (past its expiry), or already ours (re-entrant extend).
        condition = f"{_attr('expires_at')} <= :now OR {_attr('owner')} = :owner"
        return self._put(pk, item, condition, what="the lock", now=now, owner=owner)[0]

    def release_lock(self, name: str, owner: str) -> bool:
        pk = lock_key(name)
        # Only the holder frees it: a lock that expired and was taken by another stays theirs.
        released: bool = self._write(lambda db: db.execute(
            f"DELETE FROM items WHERE pk = :pk AND {_attr('owner')} = :owner",
            {"pk": pk, "owner": owner}).rowcount == 1)
        return released

    # -- delivery ledger: recording and dispatch -----------------------------------
    def record_delivery(self, delivery: Delivery, *, instance: str, deadline: float,
                        dispatch_mode: DispatchMode | str, again_after_hand_back: bool = False,
                        settled_before: float | None = None) -> str | None:
        now = self._clock()
        key, item = _recorded_item(delivery, instance, deadline, dispatch_mode, now)
        # A settled item past its ttl counts as gone (the sweep deletes late).
        condition = f"{_attr(TTL)} < :now"
        if again_after_hand_back:
            # Handed back (or a hand-back in progress), or reported "not found": see store.py.
            condition += (f" OR {_attr('status')} = '{LedgerStatus.HANDED_BACK.value}'"
                          f" OR ({_attr('status')} = '{LedgerStatus.RUNNING.value}'"
                          f" AND substr({_attr('epoch')}, 1, {len(HANDBACK_EPOCH_PREFIX)}) = :handback)"
                          f" OR {_attr('unknown_to_server')} = 1")
        if settled_before is not None:
            # Or settled before the pull was sent: a server that forgot it (reset) handed out new work.
            condition += (f" OR ({_status_in([LedgerStatus.ACKNOWLEDGED, LedgerStatus.DISCARDED])}"
                          f" AND {_attr('updated_at')} < :settled_before)")
        try:
            written, old = self._put(key, item, condition, what="the delivery", now=now,
                                     handback=HANDBACK_EPOCH_PREFIX, settled_before=settled_before)
        except ItemTooLargeError as err:
            raise DeliveryTooLargeError(delivery.job_id, err) from None
        if not written:
            # While in flight, note the redelivery (a "not found" report must then be sent again).
            if self._update(key, _Patch().set(redelivered=True, updated_at=now), _exists(SCOPE),
                            what="the ledger item", returning=False) is not None \
                    or not (again_after_hand_back or settled_before is not None):
                return None
            written, old = self._put(key, item, condition, what="the delivery", now=now,
                                     handback=HANDBACK_EPOCH_PREFIX, settled_before=settled_before)
            if not written:
                return None
        if old.get("unknown_to_server") and old.get("outcome") is not None:
            # A job the server forgot comes back with our outcome stored: re-report, never re-run.
            self._transition(key, _Patch().set(outcome=old["outcome"], status=LedgerStatus.OUTCOME_STORED.value,
                                               updated_at=now), _status_in([LedgerStatus.RECORDED]))
        return key

    records_in_batches = True  # see record_new

    def record_new(self, deliveries: Sequence[tuple[Delivery, DispatchMode | str]], *, instance: str,
                   deadline: float) -> list[str | None]:
        """Every delivery with no item yet, in one transaction: a pulled batch costs one
        commit and one wait, where a write per delivery cost a commit, a wait and a thread
        hand-off each (docs/contributing/performance-history.md: an eighth of the local worker's CPU a
        job on Priostack). ``None`` for the others, and for one too large to record:
        ``record_delivery`` decides (and raises) for those."""
        self._maybe_sweep()
        now = self._clock()
        rows: list[tuple[int, str, str]] = []
        for index, (delivery, mode) in enumerate(deliveries):
            try:
                key, item = _recorded_item(delivery, instance, deadline, mode, now)
                text = dumps(item)
                self._check_size(key, "the delivery", item, text)
            except (ItemTooLargeError, UnrecordableDeliveryError):
                continue
            rows.append((index, key, text))
        keys: list[str | None] = [None] * len(deliveries)
        if not rows:
            return keys
        with self._ops_lock:
            self.ops["write"] += len(rows)

        def write(db: sqlite3.Connection) -> list[bool]:
            return [db.execute("INSERT INTO items (pk, doc) VALUES (?, ?) ON CONFLICT (pk) DO NOTHING",
                               (key, text)).rowcount == 1 for _, key, text in rows]

        for (index, key, _), written in zip(rows, self._write(write, counted=False), strict=True):
            if written:
                keys[index] = key
        return keys

    def mark_dispatched(self, key: str) -> bool:
        now = self._clock()
        return self._transition(key, _Patch().set(status=LedgerStatus.DISPATCHED.value, updated_at=now,
                                                  dispatched_at=now), _status_in([LedgerStatus.RECORDED]))

    def mark_dispatch_failed(self, key: str, error: str) -> bool:
        now = self._clock()
        patch = _Patch().set(status=LedgerStatus.DISPATCH_FAILED.value, error=server_text(error), deadline=now,
                             updated_at=now)
        return self._transition(key, patch, _status_in([LedgerStatus.RECORDED, LedgerStatus.DISPATCHED]))

    # -- delivery ledger: the run ---------------------------------------------------
    def start_run(self, key: str, epoch: str, deadline: float) -> LedgerItem | None:
        parse_ledger_key(key)
        now = self._clock()
        patch = (_Patch().set(status=LedgerStatus.RUNNING.value, epoch=epoch, deadline=deadline, updated_at=now)
                 .set_if_missing(started_at=now).add(runs=1))
        unstarted = [LedgerStatus.RECORDED, LedgerStatus.DISPATCHED]
        if epoch.startswith(HANDBACK_EPOCH_PREFIX):
            unstarted.append(LedgerStatus.DISPATCH_FAILED)  # claimed only to be handed back
        doc = self._update(key, patch, f"{_status_in(unstarted)} OR ({_OWNED})", what="the run", epoch=epoch)
        return LedgerItem.from_attributes(doc) if doc is not None else None

    def take_over(self, key: str, *, old_epoch: str, new_epoch: str, deadline: float) -> bool:
        parse_ledger_key(key)
        patch = (_Patch().remove("cancel_reason", "handover_requested")
                 .set(epoch=new_epoch, deadline=deadline, updated_at=self._clock(), renewals=0).add(runs=1))
        # Compare-and-swap on the epoch: one successor wins.
        return self._update(key, patch, _OWNED, what="the run", epoch=old_epoch, returning=False) is not None

    def get(self, key: str) -> LedgerItem | None:
        parse_ledger_key(key)
        attrs = self._get(key)
        return LedgerItem.from_attributes(attrs) if attrs is not None else None

    def save_checkpoint(self, key: str, epoch: str, checkpoint: Any, deadline: float | None = None) -> None:
        self._fenced(key, epoch, _Patch().set(checkpoint=dumps(checkpoint), updated_at=self._clock(),
                                              deadline=deadline), "the checkpoint")

    def renew_deadline(self, key: str, epoch: str, deadline: float) -> int:
        doc = self._fenced(key, epoch, _Patch().set(deadline=deadline, updated_at=self._clock()).add(renewals=1),
                           "the deadline", returning=True)
        return int(doc["renewals"])

    def save_callback_token(self, key: str, epoch: str, token: str) -> None:
        self._fenced(key, epoch, _Patch().set(callback_token=token, updated_at=self._clock()), "the callback token")

    def request_cancel(self, key: str, epoch: str, reason: str) -> bool:
        return self._transition(key, _Patch().set(cancel_reason=reason, updated_at=self._clock()), _OWNED,
                                epoch=epoch)

    def request_handover(self, key: str, epoch: str) -> bool:
        return self._transition(key, _Patch().set(handover_requested=True, updated_at=self._clock()), _OWNED,
                                epoch=epoch)

    def clear_handover(self, key: str, epoch: str) -> bool:
        patch = _Patch().set(handover_requested=False, renewals=0, updated_at=self._clock())
        return self._transition(key, patch, _OWNED, epoch=epoch)

    def store_outcome(self, key: str, epoch: str, outcome: Outcome) -> None:
        now = self._clock()
        patch = _Patch().remove("checkpoint").set(outcome=compact_model(outcome),
                                                  status=LedgerStatus.OUTCOME_STORED.value, updated_at=now,
                                                  finished_at=now)
        self._fenced(key, epoch, patch, "the outcome")

    # -- delivery ledger: settling ------------------------------------------------
    def mark_reported(self, key: str, receipt: ReportReceipt) -> bool:
        now = self._clock()
        patch = _Patch().set(report=compact_model(receipt), status=LedgerStatus.REPORTED.value,
                             reported_at=now, updated_at=now)
        if in_doubt(receipt):
            patch.set(unknown_to_server=True)  # the job may come back: see record_delivery
        return self._transition(key, patch, _status_in([LedgerStatus.OUTCOME_STORED]))

    def mark_acknowledged(self, key: str, receipt: ReportReceipt | None = None, *, wait: bool = True) -> bool:
        if receipt is None:
            return self._final(key, LedgerStatus.ACKNOWLEDGED, _status_in([LedgerStatus.REPORTED]), wait=wait)
        not_found = in_doubt(receipt)
        condition = _status_in([LedgerStatus.OUTCOME_STORED, LedgerStatus.REPORTED])
        if not_found:
            condition = f"({condition}) AND NOT ({_exists('redelivered')})"
        return self._final(key, LedgerStatus.ACKNOWLEDGED, condition,
                           report=compact_model(receipt), unknown_to_server=not_found, wait=wait)

    def clear_redelivered(self, key: str) -> bool:
        return self._transition(key, _Patch().remove("redelivered").set(updated_at=self._clock()),
                                _exists("redelivered"))

    def mark_handed_back(self, key: str, reason: str, *, epoch: str | None = None) -> bool:
        return self._final(key, LedgerStatus.HANDED_BACK, _unreported(epoch), reason=reason, epoch=epoch)

    def mark_discarded(self, key: str, reason: str, *, epoch: str | None = None) -> bool:
        return self._final(key, LedgerStatus.DISCARDED, _unreported(epoch), reason=reason, epoch=epoch)

    def note_settle_failure(self, key: str, error: str, retry_at: float) -> int:
        parse_ledger_key(key)
        patch = _Patch().set(deadline=retry_at, error=server_text(error), updated_at=self._clock()).add(
            settle_failures=1)
        # Only while in flight: a final item left the index and must not be put back in it.
        doc = self._update(key, patch, _exists(SCOPE), what="the ledger item")
        return int(doc["settle_failures"]) if doc is not None else 0

    def postpone(self, key: str, deadline: float) -> bool:
        return self._transition(key, _Patch().set(deadline=deadline, updated_at=self._clock()), _exists(SCOPE))

    def mark_abandoned(self, key: str, reason: str) -> bool:
        return self._final(key, LedgerStatus.DISCARDED, _UNREPORTED, reason=reason, unknown_to_server=True)

    def ledger_documents(self, *, updated_since: float | None = None) -> list[dict[str, Any]]:
        """Every delivery item's attributes: all of them, or those in flight and those written
        at or after ``updated_since`` (one run's share of a file kept across runs). A scan,
        so not in the contract: only the local summary reads it, once, at the end."""
        self._count("read")
        where = f" AND (scope IS NOT NULL OR {_attr('updated_at')} >= :since)" if updated_since is not None else ""
        try:
            rows = self._connection().execute(
                f"SELECT doc FROM items WHERE pk >= 'delivery#' AND pk < 'delivery$'{where}",
                {"since": updated_since}).fetchall()
        except sqlite3.Error as err:
            raise StateStoreError(f"SQLite state store scan of {self.path} failed: {err}") from err
        return [dict(json.loads(row[0])) for row in rows]

    # -- the file's own facts (not in the contract: DynamoDB's table belongs to one stack) --
    def read_meta(self, name: str) -> str | None:
        """A fact about the file (``server``: which job server its ids came from), or ``None``."""
        self._count("read")
        try:
            row = self._connection().execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        except sqlite3.Error as err:
            raise StateStoreError(f"SQLite state store {self.path}: meta read failed: {err}") from err
        return str(row[0]) if row else None

    def write_meta(self, name: str, value: str) -> None:
        """Set a fact about the file (last writer wins: one process holds the file)."""
        self._write(lambda db: db.execute(
            "INSERT INTO meta (name, value) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            (name, value)))

    def forget_items(self) -> int:
        """Delete every item (ledger, sessions, counters, control): what a wholly other job
        server's ids and session meant is nothing to the next one. Returns the ledger items
        deleted. The file's meta stays."""
        keys: list[tuple[str]] = self._write(lambda db: db.execute("DELETE FROM items RETURNING pk").fetchall())
        return sum(1 for (key,) in keys if key.startswith("delivery#"))

    # -- in flight -----------------------------------------------------------------
    def _query(self, scope: str, select: str, extra: str, **values: Any) -> list[Any]:
        """Rows of the in-flight index (``scope`` set only while in flight), soonest deadline first."""
        self._count("read")
        try:
            return self._connection().execute(
                f"SELECT {select} FROM items WHERE scope = :scope{extra} ORDER BY deadline",
                {"scope": scope, **values}).fetchall()
        except sqlite3.Error as err:
            raise StateStoreError(f"SQLite state store query of {scope} failed: {err}") from err

    def _in_flight_rows(self, scope: str, extra: str, **values: Any) -> list[dict[str, Any]]:
        return [json.loads(row[0]) for row in self._query(scope, "doc", extra, **values)]

    def count_in_flight(self, protocol: str, instance: str, *, live_at: float | None = None) -> int:
        extra = " AND deadline >= :live_at" if live_at is not None else ""
        return int(self._query(scope_of(protocol, instance), "count(*)", extra, live_at=live_at)[0][0])

    def in_flight(self, protocol: str, instance: str) -> list[LedgerItem]:
        items = (LedgerItem.from_attributes(doc) for doc in self._in_flight_rows(scope_of(protocol, instance), ""))
        return [item for item in items if not item.is_final]

    def stranded(self, protocol: str, instance: str, now: float) -> list[LedgerItem]:
        docs = self._in_flight_rows(scope_of(protocol, instance), " AND deadline < :now", now=now)
        return [item for item in map(LedgerItem.from_attributes, docs) if not item.is_final]

    # -- counters and control --------------------------------------------------------
    def add_counters(self, protocol: str, instance: str, **deltas: int) -> None:
        check_counter_deltas(deltas)
        if deltas:
            # No condition: additions commute, and counters are statistics, not transitions.
            self._update(counters_key(protocol, instance), _Patch().set(updated_at=self._clock()).add(**deltas),
                         None, what="the counters", upsert=True)

    def read_counters(self, protocol: str, instance: str) -> dict[str, int]:
        attrs = self._get(counters_key(protocol, instance)) or {}
        return {name: int(value) for name, value in attrs.items() if name not in NOT_COUNTERS}

    def get_control(self, protocol: str, instance: str) -> dict[str, Any]:
        attrs = self._get(control_key(protocol, instance)) or {}
        unfit = {}
        for name, value in attrs.items():
            if name.startswith(UNFIT_PREFIX):
                record = json.loads(value)
                unfit[record["handler"]] = record["reason"]
        return {"stopped": attrs.get("stopped"), "draining": bool(attrs.get("draining", False)),
                "unfit": unfit}

    def set_unfit(self, protocol: str, instance: str, handler: str, reason: str) -> bool:
        attribute = unfit_attribute(handler)
        patch = _Patch().set(**{attribute: dumps({"handler": handler, "reason": server_text(reason, limit=1000)}),
                                "updated_at": self._clock()})
        # One attribute per handler, set once: two executors finding it at once never lose either.
        return self._update(control_key(protocol, instance), patch, f"NOT ({_exists(attribute)})",
                            what="control", upsert=True) is not None

    def clear_unfit(self, protocol: str, instance: str) -> None:
        pk = control_key(protocol, instance)
        names = [name for name in (self._get(pk) or {}) if name.startswith(UNFIT_PREFIX)]
        if names:
            self._update(pk, _Patch().remove(*names).set(updated_at=self._clock()), None, what="control")

    def set_stopped(self, protocol: str, instance: str, reason: str | None) -> None:
        patch = _Patch().set(stopped=server_text(reason, limit=1000), updated_at=self._clock()) if reason else \
            _Patch().remove("stopped").set(updated_at=self._clock())
        self._update(control_key(protocol, instance), patch, None, what="control", upsert=True)

    def set_draining(self, protocol: str, instance: str, draining: bool) -> None:
        self._update(control_key(protocol, instance), _Patch().set(draining=bool(draining), updated_at=self._clock()),
                     None, what="control", upsert=True)

    # -- internals -------------------------------------------------------------------
    def _transition(self, key: str, patch: _Patch, condition: str, *, wait: bool = True, **values: Any) -> bool:
        parse_ledger_key(key)
        return self._update(key, patch, condition, what="the ledger item", returning=False, wait=wait,
                            **values) is not None

    def _fenced(self, key: str, epoch: str, patch: _Patch, what: str, *, returning: bool = False) -> dict[str, Any]:
        """``patch`` applied by the run holding ``epoch``; the new document with ``returning``."""
        parse_ledger_key(key)
        # Only the run holding the epoch may change its item; anyone else lost it (reaped, taken over).
        doc = self._update(key, patch, _OWNED, what=what, epoch=epoch, returning=returning)
        if doc is None:
            raise StaleWriteError(f"run {epoch!r} no longer owns this delivery; {what} was not saved", key=key)
        return doc

    def _final(self, key: str, status: LedgerStatus, condition: str, *, reason: str | None = None,
               epoch: str | None = None, report: str | None = None, unknown_to_server: bool = False,
               wait: bool = True) -> bool:
        now = self._clock()
        # Leaving the index is what makes it no longer in flight; the checkpoint is dead weight now.
        patch = _Patch().remove(SCOPE, DEADLINE, "checkpoint").set(
            status=status.value, updated_at=now, ttl=int(now) + self._final_retention,
            error=server_text(reason, limit=1000) if reason is not None else None, report=report,
            unknown_to_server=True if unknown_to_server else None)
        values = {"epoch": epoch} if epoch else {}
        return self._transition(key, patch, condition, wait=wait, **values)


def _recorded_item(delivery: Delivery, instance: str, deadline: float,
                   dispatch_mode: DispatchMode | str, now: float) -> tuple[str, dict[str, Any]]:
    """A delivery's key and new ledger item, as ``record_delivery`` and ``record_new`` write it
    (an attribute that is ``None`` is left out, as ``_put`` leaves it); UnrecordableDeliveryError
    when it has none (``items.recordable``)."""
    key, record = recordable(delivery)
    packed = dumps(record)
    encoded_document(delivery.job_id, packed)  # SQLite stores UTF-8: a lone surrogate fails the whole batch
    item = recorded_attributes(key, delivery, packed_delivery=packed, instance=instance,
                               deadline=deadline, dispatch_mode=dispatch_mode, now=now)
    return key, {name: value for name, value in item.items() if value is not None}


def _json_growth_bound(written: dict[str, Any]) -> int:
    """At most how many characters setting ``written`` adds to a JSON document: each name
    quoted with its colon and comma, a string escaped (6 characters each at worst)."""
    total = 0
    for name, value in written.items():
        total += len(name) + 4
        if isinstance(value, str):
            total += 6 * len(value) + 2
        elif isinstance(value, bool | int | float):
            total += 32
        else:
            total += 6 * len(json.dumps(value)) + 2
    return total


def _unreported(epoch: str | None) -> str:
    return f"({_UNREPORTED}) AND {_attr('epoch')} = :epoch" if epoch else _UNREPORTED
