"""The local worker's state: one SQLite file (``SqliteStateStore``), held by one process.

A local run keeps its ledger, session and counters in a file (``--state PATH``, by
default ``.serverless-worker/state.sqlite3`` under the working directory), so a run that
was killed leaves its deliveries where the next run with the same file finds and settles
them (``local/recovery.py``). That recovery treats every delivery in flight as left by a
dead process, so two live processes must never share the file: an exclusive ``flock`` on
``PATH.lock`` says who holds it. The kernel drops the lock when its process dies, even by
SIGKILL, so a crash never leaves the file locked. Unset, the state is a temporary file
removed at the end (the built-in demo, whose sandbox dies with the run too).

The file also says which job server its ids came from (``claim_server``): pointed at a
wholly other server, a run says so in one line and starts the file afresh, since the
other server's ids, settled or not, mean nothing to this one; unless the old server's
deliveries are still in flight, which only that server can settle (then it stops, exit 2).

Example::

    state = LocalState.open(".serverless-worker/state.sqlite3", final_retention_seconds=600)
    ...
    state.close()
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

from ..errors import ConfigurationError
from ..model import FINAL_STATUSES, LedgerStatus
from ..state.sqlite_store import SqliteStateStore

__all__ = ["LocalState"]

_SERVER = "server"  # the meta fact: "{protocol} {url}" of the job server the file's ids came from


class LocalState:
    """The open store, the file it lives in, and the lock that makes this process its only user."""

    def __init__(self, store: SqliteStateStore, path: Path, lock: IO[str] | None, temporary: Path | None) -> None:
        self.store = store
        self.path = path
        self.temporary = temporary is not None
        self._lock = lock
        self._temporary = temporary

    @classmethod
    def open(cls, path: str | os.PathLike[str] | None, *, final_retention_seconds: int,
             sweep_interval: float = 60.0,
             on_swept: Callable[[list[str]], None] | None = None) -> LocalState:
        """Lock and open the state file at ``path`` (created with its directory when new), or a
        temporary one; ``ConfigurationError`` when another process holds it or it cannot be made."""
        temporary = Path(tempfile.mkdtemp(prefix="serverless-worker-")) if path is None else None
        file = (temporary / "state.sqlite3") if temporary is not None else Path(path).expanduser()  # type: ignore[arg-type]
        lock: IO[str] | None = None
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
            lock = _lock(file)
            _owner_only(file)
            store = SqliteStateStore(file, final_retention_seconds=final_retention_seconds,
                                     sweep_interval=sweep_interval, on_swept=on_swept)
        except OSError as err:
            _release(lock)
            if temporary is not None:
                shutil.rmtree(temporary, ignore_errors=True)
            raise ConfigurationError(f"state file {file}: {err.strerror or err}") from None
        except BaseException:
            _release(lock)
            if temporary is not None:
                shutil.rmtree(temporary, ignore_errors=True)
            raise
        return cls(store, file, lock, temporary)

    def claim_server(self, protocol: str, url: str) -> str | None:
        """Note that this file now serves the ``protocol`` server at ``url`` (shown without
        credentials). When it served another one, forget that server's items and return the
        line that says so; ``ConfigurationError`` when that server's deliveries are still in
        flight (reporting them here would reach the wrong server, or strand them there)."""
        server = f"{protocol} {url.rstrip('/')}"
        before = self.store.read_meta(_SERVER)
        if before is not None and before != server:
            left = [doc for doc in self.store.ledger_documents()
                    if LedgerStatus(doc["status"]) not in FINAL_STATUSES]
            if left:
                raise ConfigurationError(
                    f"state file {self.path} holds {len(left)} deliver{'y' if len(left) == 1 else 'ies'} "
                    "still in flight from the "
                    f"{_described(before)}; run against that server once to settle them, or give "
                    f"the {_described(server)} its own file with --state PATH")
            forgotten = self.store.forget_items()
            self.store.write_meta(_SERVER, server)
            return (f"state file {self.path} was used with the {_described(before)}; this is another server: "
                    f"its {forgotten} settled deliveries are forgotten and every job id is new here")
        if before is None:
            self.store.write_meta(_SERVER, server)
        return None

    def close(self) -> None:
        """Close the store's connections, then let the file go (a temporary one is deleted)."""
        self.store.close()
        _release(self._lock)
        self._lock = None
        if self._temporary is not None:
            shutil.rmtree(self._temporary, ignore_errors=True)


def _owner_only(file: Path) -> None:
    """Create ``file`` if new, and make it and its companions owner-only (0600).

    The file holds delivery tokens and the worker session, as the stack's table does. The
    mode given at creation does not change a file that already exists (one copied in, or
    made by an older release, with 0666), so it is set again each time. SQLite gives its
    -wal and -shm files the database file's mode only when it creates them.
    """
    descriptor = os.open(file, os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        os.fchmod(descriptor, 0o600)
    finally:
        os.close(descriptor)
    for companion in (f"{file}-wal", f"{file}-shm", f"{file}.lock"):
        if os.path.exists(companion):
            os.chmod(companion, 0o600)


def _lock(file: Path) -> IO[str] | None:
    """Hold ``file.lock`` exclusively for as long as this process runs (or until released)."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): one process per file is then up to the user
        return None
    handle = os.fdopen(os.open(f"{file}.lock", os.O_CREAT | os.O_RDWR, 0o600), "r+", encoding="utf-8")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip()
        handle.close()
        raise ConfigurationError(
            f"state file {file} is in use by another serverless-worker local"
            f"{f' (pid {holder})' if holder.isdigit() else ''}; stop it, or run this one as a second worker "
            "with its own file and name: --state PATH --instance-id ID (two workers under one instance id "
            "take each other's session)") from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def _release(handle: IO[str] | None) -> None:
    if handle is not None:
        handle.close()  # closing the descriptor drops the flock


def _described(server: str) -> str:
    protocol, _, url = server.partition(" ")
    return f"{protocol} server at {url}"
