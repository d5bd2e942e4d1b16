"""Writes from many threads to one SQLite file, committed together.

Dozens of executor threads each write a few small transactions per job. Taken one at a
time, they hand SQLite's write lock, and with it the GIL, from thread to thread at every
transaction: the ledger's four writes cost 0.56 ms of CPU a job among 8 threads against
0.26 ms in one (``python -m benchmarks.state_file_writes``). Here the thread whose turn
it is runs every write queued by then, each in a savepoint of one transaction, and
commits once; the others wait for that commit and return with their own result. In the
whole local worker that took the throughput from 0.43 to 0.52 of a minimal worker's on
Priostack (docs/local-development.md).

Nothing a caller sees changes: a write returns only once it is committed, each write sees
every earlier one, a write that raises is rolled back alone (its savepoint) and raises in
its own thread, and a commit that fails fails every write in it.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["GroupCommit"]

Write = Callable[[sqlite3.Connection], Any]


class _Pending:
    __slots__ = ("done", "error", "result", "write")

    def __init__(self, write: Write) -> None:
        self.write = write
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None


class GroupCommit:
    """``run(write)``: ``write(connection)`` inside a committed transaction, shared with
    whatever other threads queued meanwhile; returns its result or raises its error.

    ``connection()`` gives the calling thread's connection (the committing thread's is
    used for the whole group). A write that itself writes raises :class:`RuntimeError`
    rather than deadlock on the turn its own thread holds.
    """

    def __init__(self, connection: Callable[[], sqlite3.Connection]) -> None:
        self._connection = connection
        self._queue: list[_Pending] = []
        self._queue_lock = threading.Lock()
        self._turn = threading.Lock()
        self._committer: int | None = None  # the thread committing a group, while it does
        self.commits = 0  # transactions committed (fewer than writes when they were grouped)

    @property
    def queued(self) -> int:
        """Writes waiting for a turn (not those in the group being committed)."""
        with self._queue_lock:
            return len(self._queue)

    def run(self, write: Write) -> Any:
        if self._committer == threading.get_ident():
            raise RuntimeError("a state-store write cannot write again inside itself")
        pending = _Pending(write)
        with self._queue_lock:
            self._queue.append(pending)
        with self._turn:
            if not pending.done:  # no earlier group took it: this thread commits the next one
                with self._queue_lock:
                    group, self._queue = self._queue, []
                self._committer = threading.get_ident()
                try:
                    self._commit(group)
                finally:
                    self._committer = None
        if pending.error is not None:
            raise pending.error
        return pending.result

    def _commit(self, group: list[_Pending]) -> None:
        db = self._connection()
        try:
            db.execute("BEGIN IMMEDIATE")
            for pending in group:
                db.execute("SAVEPOINT write")
                try:
                    pending.result = pending.write(db)
                except BaseException as err:  # raised again in the writer's own thread
                    db.execute("ROLLBACK TO write")
                    pending.error = err
                db.execute("RELEASE write")
            db.execute("COMMIT")
            self.commits += 1
        except sqlite3.Error as err:
            # BEGIN, a savepoint or the COMMIT failed: nothing in the group was committed.
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):  # the error that brought us here is the one to report
                    db.execute("ROLLBACK")
            for pending in group:
                pending.result, pending.error = None, pending.error or err
        finally:
            for pending in group:
                pending.done = True
