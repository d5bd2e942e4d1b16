"""The state store on one SQLite file (standard library ``sqlite3``, WAL mode).

The same store as the DynamoDB backend (``state/base.py`` owns every rule, docs/ledger.md), for a
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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from .base import Returns, StateStore
from .conditions import All, AnyOf, Compare, Condition, Exists, Missing, OneOf, Param, StartsWith, Update
from .errors import ItemTooLargeError, StateStoreError
from .group_commit import GroupCommit
from .items import attributes_size, attributes_size_bound, dumps, encoded_document
from .keys import DEADLINE, ITEM_MAX_BYTES, PK, SCOPE, SK, TTL, sort_key_for
from .rules import FINAL_RETENTION_SECONDS

__all__ = ["SqliteStateStore", "read_ledger_documents"]

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

@functools.lru_cache(maxsize=256)
def _named_parameters(expression: str, count: int) -> str:
    """``expression`` with its ``count`` positional ``?`` as ``:p0``, ``:p1`` ..., to sit beside
    the condition's named parameters. A patch's SQL depends only on its shape, so few exist."""
    for i in range(count):
        expression = expression.replace("?", f":p{i}", 1)
    return expression


def read_ledger_documents(path: str | Path) -> list[dict[str, Any]]:
    """Every delivery item of the state file at ``path``, opened read-only: nothing is
    created, migrated or swept, so it can be read while a worker runs on it
    (``serverless-worker ledger``); StateStoreError when it cannot be read."""
    try:
        connection = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True, timeout=30.0)
    except sqlite3.Error as err:
        raise StateStoreError(f"SQLite state file {path}: cannot open: {err}") from err
    try:
        return _ledger_scan(connection, str(path), None)
    finally:
        connection.close()


def _ledger_scan(connection: sqlite3.Connection, path: str, updated_since: float | None) -> list[dict[str, Any]]:
    where = f" AND (scope IS NOT NULL OR {_attr('updated_at')} >= :since)" if updated_since is not None else ""
    try:
        rows = connection.execute(f"SELECT doc FROM items WHERE pk >= 'delivery#' AND pk < 'delivery$'{where}",
                                  {"since": updated_since}).fetchall()
    except sqlite3.Error as err:
        raise StateStoreError(f"SQLite state store scan of {path} failed: {err}") from err
    return [dict(json.loads(row[0])) for row in rows]


def _attr(name: str) -> str:
    """SQL for one attribute of the document (names are the store's own, never caller text)."""
    return f"json_extract(doc, '$.{name}')"


_Where = tuple[str, dict[str, Any], tuple[str, ...]]
# The rulebook's conditions are module constants: found by identity, without hashing the tree.
_BY_IDENTITY: dict[int, tuple[Condition, _Where]] = {}


def _where(condition: Condition) -> _Where:
    """A neutral condition as SQL over the row's document: the text, its literals' parameters
    (``:c0``...), and the names of the call's ``Param`` values it binds. Built once per
    condition (every write asks)."""
    hit = _BY_IDENTITY.get(id(condition))
    if hit is not None and hit[0] is condition:
        return hit[1]
    where = _translate(condition)
    if len(_BY_IDENTITY) < 256:
        _BY_IDENTITY[id(condition)] = (condition, where)  # held, so its id is never reused
    return where


@functools.lru_cache(maxsize=256)
def _translate(condition: Condition) -> _Where:
    literals: dict[str, Any] = {}
    params: list[str] = []

    def operand(value: Any) -> str:
        if isinstance(value, Param):
            params.append(value.name)
            return f":{value.name}"
        name = f"c{len(literals)}"
        literals[name] = getattr(value, "value", value)  # a status as its stored name
        return f":{name}"

    def text(c: Condition, nested: bool = False) -> str:
        match c:
            case Compare(attribute, op, value):
                return f"{_attr(attribute)} {op} {operand(value)}"
            case OneOf(attribute, values):
                return f"{_attr(attribute)} IN ({', '.join(operand(v) for v in values)})"
            case Exists(attribute):
                return f"json_type(doc, '$.{attribute}') IS NOT NULL"
            case Missing(attribute):
                return f"json_type(doc, '$.{attribute}') IS NULL"
            case StartsWith(attribute, prefix):
                placeholder = operand(prefix)
                return f"substr({_attr(attribute)}, 1, length({placeholder})) = {placeholder}"
            case All(parts) | AnyOf(parts):
                joined = (" AND " if isinstance(c, All) else " OR ").join(text(p, True) for p in parts)
                return f"({joined})" if nested else joined
        raise TypeError(f"not a condition: {c!r}")

    return text(condition), literals, tuple(params)


def _bound(condition: Condition | None, values: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    if condition is None:
        return None, {}
    sql, literals, params = _where(condition)
    return sql, {**literals, **{name: values[name] for name in params}}


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


    @classmethod
    def of(cls, update: Update) -> _Patch:
        """The neutral update as a patch (the deadline is the one ``deadline``: no index here costs a write)."""
        patch = cls()
        if update.removes:
            patch.remove(*update.removes)
        patch.set(**update.sets)
        if update.deadline is not None:
            patch.set(deadline=update.deadline)
        if update.defaults:
            patch.set_if_missing(**update.defaults)
        if update.adds:
            patch.add(**update.adds)
        return patch


class SqliteStateStore(StateStore):
    """The worker's state in one SQLite file; ``path`` is created with its schema when new.

    ``clock`` and ``final_retention_seconds`` mean what they mean for the DynamoDB
    backend; ``ops`` counts statements as ``"read"`` and ``"write"``.
    """

    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time,
                 final_retention_seconds: int = FINAL_RETENTION_SECONDS, sweep_interval: float = 60.0,
                 busy_timeout_seconds: float = 30.0,
                 on_swept: Callable[[list[str]], None] | None = None) -> None:
        super().__init__(clock=clock, final_retention_seconds=final_retention_seconds)
        self.path = str(path)
        self._on_swept = on_swept
        self._sweep_interval = sweep_interval
        self._busy_timeout = busy_timeout_seconds
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
                "SQLite state store %s: %s of %s was not saved (%s: %s); the next start on this file settles "
                "that delivery again from what was saved: nothing is lost",
                self.path, what, pk, type(err).__name__, err))
            return {}
        return self._write(write)

    def _put(self, pk: str, attributes: dict[str, Any], condition: str | None, *, what: str,
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
            if condition is None:
                return False, dict(json.loads(row[0]))
            count = db.execute(f"UPDATE items SET doc = :doc WHERE pk = :pk AND ({condition})",
                               {"pk": pk, "doc": text, **values}).rowcount
            return count == 1, dict(json.loads(row[0]))

        return self._write(write)

    # -- the base store's primitives ---------------------------------------------------
    def _get_record(self, pk: str) -> dict[str, Any] | None:
        return self._get(pk)

    def _put_record(self, pk: str, attributes: dict[str, Any], replace_if: Condition | None,
                    values: dict[str, Any], *, what: str, return_old: bool = False) -> dict[str, Any] | None:
        where, params = _bound(replace_if, values)
        written, old = self._put(pk, attributes, where, what=what, **params)
        return (old if return_old else {}) if written else None

    def _update_record(self, pk: str, update: Update, condition: Condition | None, values: dict[str, Any], *,
                       what: str, returns: Returns = "none", create: bool = False,
                       wait: bool = True) -> dict[str, Any] | None:
        where, params = _bound(condition, values)
        return self._update(pk, _Patch.of(update), where, what=what, upsert=create, returning=returns != "none",
                            wait=wait, **params)

    def _delete_record(self, pk: str, condition: Condition, values: dict[str, Any]) -> bool:
        where, params = _bound(condition, values)
        deleted: bool = self._write(lambda db: db.execute(
            f"DELETE FROM items WHERE pk = :pk AND ({where})", {"pk": pk, **params}).rowcount == 1)
        return deleted

    def _in_flight_records(self, scope: str, *, before: float | None = None) -> list[dict[str, Any]]:
        extra = " AND deadline < :before" if before is not None else ""
        return [json.loads(row[0]) for row in self._query(scope, "doc", extra, before=before)]

    def _count_in_flight_records(self, scope: str, *, live_at: float | None = None) -> int:
        extra = " AND deadline >= :live_at" if live_at is not None else ""
        return int(self._query(scope, "count(*)", extra, live_at=live_at)[0][0])

    def _pack_delivery(self, record: dict[str, Any], job_id: str) -> Any:
        packed = dumps(record)
        encoded_document(job_id, packed)  # SQLite stores UTF-8: a lone surrogate fails the whole batch
        return packed

    records_in_batches = True  # see _put_new_records

    def _put_new_records(self, rows: Sequence[tuple[str, dict[str, Any]]]) -> list[bool]:
        """Every item with no row yet, in one transaction: a pulled batch costs one commit and
        one wait, where a write per delivery cost a commit, a wait and a thread hand-off each
        (docs/contributing/performance-history.md: an eighth of the local worker's CPU a job on
        Priostack). One too large to record is left out (``record_delivery`` raises it)."""
        self._maybe_sweep()
        texts: list[tuple[int, str, str]] = []
        for index, (key, item) in enumerate(rows):
            text = dumps(item)
            try:
                self._check_size(key, "the delivery", item, text)
            except ItemTooLargeError:
                continue
            texts.append((index, key, text))
        written = [False] * len(rows)
        if not texts:
            return written
        self._count("write", len(texts))

        def write(db: sqlite3.Connection) -> list[bool]:
            return [db.execute("INSERT INTO items (pk, doc) VALUES (?, ?) ON CONFLICT (pk) DO NOTHING",
                               (key, text)).rowcount == 1 for _, key, text in texts]

        for (index, _, _), done in zip(texts, self._write(write, counted=False), strict=True):
            written[index] = done
        return written

    def ledger_documents(self, *, updated_since: float | None = None) -> list[dict[str, Any]]:
        """Every delivery item's attributes: all of them, or those in flight and those written
        at or after ``updated_since`` (one run's share of a file kept across runs). A scan,
        so not in the contract: only the local summary reads it, once, at the end."""
        self._count("read")
        return _ledger_scan(self._connection(), self.path, updated_since)

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
