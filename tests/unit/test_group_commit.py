"""GroupCommit: writes queued while one commits share the next transaction, and each
still behaves as its own transaction to its caller (result, error, rollback, durability)."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from serverless_worker.state import SqliteStateStore, StateStoreError
from serverless_worker.state.group_commit import GroupCommit
from support.waiting import HANG_SECONDS, wait_for


class _Connections:
    """One connection per thread on one file, as the SQLite store has them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = threading.local()
        self.all: list[sqlite3.Connection] = []
        self().execute("CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER NOT NULL)")

    def __call__(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA foreign_keys=ON")
            self._local.db = db
            self.all.append(db)
        return db

    def committed(self) -> dict[str, int]:
        """What another connection reads: only what was committed."""
        with sqlite3.connect(self.path) as db:
            return dict(db.execute("SELECT k, v FROM t").fetchall())


@pytest.fixture
def connections(tmp_path: Path) -> Iterator[_Connections]:
    made = _Connections(tmp_path / "g.db")
    yield made
    for db in made.all:
        db.close()


def _insert(key: str, value: int):  # type: ignore[no-untyped-def]
    return lambda db: db.execute("INSERT INTO t (k, v) VALUES (?, ?)", (key, value)).rowcount


def _held_group(commits: GroupCommit, first: object) -> tuple[threading.Event, threading.Event]:
    """Start a write that holds the turn until released, so later writes queue behind it."""
    inside, release = threading.Event(), threading.Event()

    def hold(db: sqlite3.Connection) -> object:
        inside.set()
        release.wait(HANG_SECONDS)  # the turn is held until the test releases it
        return first

    threading.Thread(target=commits.run, args=(hold,), daemon=True).start()
    assert inside.wait(HANG_SECONDS)
    return inside, release


def _wait_queued(commits: GroupCommit, count: int) -> None:
    wait_for(lambda: commits.queued >= count, what=f"{count} writes queued", interval=0.001)


def test_a_write_returns_its_result_once_committed(connections: _Connections) -> None:
    commits = GroupCommit(connections)
    assert commits.run(_insert("a", 1)) == 1
    assert connections.committed() == {"a": 1}
    assert commits.commits == 1


def test_writes_queued_while_one_commits_are_committed_together(connections: _Connections) -> None:
    commits = GroupCommit(connections)
    _, release = _held_group(commits, "held")
    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(commits.run, _insert(f"k{i}", i)) for i in range(6)]
        _wait_queued(commits, 6)
        release.set()
        assert [f.result(HANG_SECONDS) for f in futures] == [1] * 6
    assert commits.commits == 2  # the held write's group, then one for all six
    assert connections.committed() == {f"k{i}": i for i in range(6)}


def test_a_write_that_raises_is_rolled_back_alone_and_raises_in_its_own_thread(connections: _Connections) -> None:
    commits = GroupCommit(connections)

    def half_then_fail(db: sqlite3.Connection) -> None:
        db.execute("INSERT INTO t (k, v) VALUES ('half', 0)")
        raise ValueError("too large")

    _, release = _held_group(commits, None)
    with ThreadPoolExecutor(3) as pool:
        before = pool.submit(commits.run, _insert("before", 1))
        failing = pool.submit(commits.run, half_then_fail)
        after = pool.submit(commits.run, _insert("after", 2))
        _wait_queued(commits, 3)
        release.set()
        assert before.result(HANG_SECONDS) == 1 and after.result(HANG_SECONDS) == 1
        with pytest.raises(ValueError, match="too large"):
            failing.result(HANG_SECONDS)
    assert commits.commits == 2
    assert connections.committed() == {"before": 1, "after": 2}


def test_each_write_sees_the_writes_before_it_in_its_group(connections: _Connections) -> None:
    commits = GroupCommit(connections)
    _, release = _held_group(commits, None)

    def bump(db: sqlite3.Connection) -> int:
        db.execute("INSERT INTO t (k, v) VALUES ('n', 1) ON CONFLICT (k) DO UPDATE SET v = v + 1")
        return int(db.execute("SELECT v FROM t WHERE k = 'n'").fetchone()[0])

    with ThreadPoolExecutor(5) as pool:
        futures = [pool.submit(commits.run, bump) for _ in range(5)]
        _wait_queued(commits, 5)
        release.set()
        assert sorted(f.result(HANG_SECONDS) for f in futures) == [1, 2, 3, 4, 5]
    assert connections.committed() == {"n": 5}


def test_a_failed_commit_fails_every_write_in_the_group(connections: _Connections) -> None:
    commits = GroupCommit(connections)
    # A deferred foreign key is checked at COMMIT: the group's commit fails, so none of it lands.
    connections().execute("CREATE TABLE child (k TEXT REFERENCES t (k) DEFERRABLE INITIALLY DEFERRED)")

    def orphan(db: sqlite3.Connection) -> int:
        return db.execute("INSERT INTO child (k) VALUES ('nobody')").rowcount

    _, release = _held_group(commits, None)
    with ThreadPoolExecutor(2) as pool:
        good = pool.submit(commits.run, _insert("good", 1))
        bad = pool.submit(commits.run, orphan)
        _wait_queued(commits, 2)
        release.set()
        for future in (good, bad):
            with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
                future.result(HANG_SECONDS)
    assert connections.committed() == {}
    assert commits.run(_insert("later", 3)) == 1  # the next group starts clean
    assert connections.committed() == {"later": 3}


def test_a_write_that_writes_again_fails_loudly_instead_of_deadlocking(connections: _Connections) -> None:
    commits = GroupCommit(connections)

    def nested(db: sqlite3.Connection) -> None:
        _insert("outer", 1)(db)
        commits.run(_insert("inner", 2))

    with pytest.raises(RuntimeError, match="cannot write again inside itself"):
        commits.run(nested)
    assert connections.committed() == {}  # the outer write was rolled back with it
    assert commits.run(_insert("after", 3)) == 1
    assert connections.committed() == {"after": 3}


def test_the_store_groups_writes_from_many_threads_and_keeps_every_one(tmp_path: Path) -> None:
    store = SqliteStateStore(tmp_path / "s.db")
    try:
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i: store.add_counters("p", "i", jobs=1), range(400)))
        assert store.read_counters("p", "i")["jobs"] == 400
    finally:
        store.close()


def test_the_store_reports_a_failed_write_as_its_own_error(tmp_path: Path) -> None:
    store = SqliteStateStore(tmp_path / "s.db")
    try:
        store._connection().execute("DROP TABLE items")
        with pytest.raises(StateStoreError, match="write failed: no such table"):
            store.add_counters("p", "i", jobs=1)
    finally:
        store.close()


def test_a_thread_interrupted_while_it_waits_never_strands_the_writes_after_it(
        connections: _Connections, monkeypatch: pytest.MonkeyPatch) -> None:
    """The oldest queued write's thread is handed the next group; were it interrupted
    (Ctrl-C) while waiting, and the group left with it, every later write would wait for
    ever. It commits that group before it leaves; a write still queued goes unwritten."""
    commits = GroupCommit(connections)
    interrupted = threading.Event()
    wait = GroupCommit._wait

    def interruptible(pending: object) -> None:
        if threading.current_thread().name == "interrupted":
            wait(pending)  # handed the next group (the first queued after the held one)...
            interrupted.set()
            raise KeyboardInterrupt  # ...and interrupted before leading it
        wait(pending)

    monkeypatch.setattr(GroupCommit, "_wait", staticmethod(interruptible))
    _, release = _held_group(commits, None)
    raised: list[BaseException] = []

    def first() -> None:
        try:
            commits.run(_insert("first", 1))
        except KeyboardInterrupt as err:
            raised.append(err)

    thread = threading.Thread(target=first, name="interrupted", daemon=True)
    thread.start()
    _wait_queued(commits, 1)
    results: list[object] = []
    later = threading.Thread(target=lambda: results.append(commits.run(_insert("later", 2))), daemon=True)
    later.start()
    _wait_queued(commits, 2)
    release.set()
    later.join(HANG_SECONDS)
    assert results == [1], "the write queued after the interrupted thread's was stranded"
    thread.join(HANG_SECONDS)
    assert interrupted.is_set() and raised
    assert connections.committed() == {"first": 1, "later": 2}


def _waited_behind(commits: GroupCommit, release: threading.Event, write: Callable[[sqlite3.Connection], object],
                   *, queued: int) -> object:
    """``write`` run (and waited for) behind the held group, once ``queued`` writes wait."""
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(commits.run, write)
        _wait_queued(commits, queued)
        release.set()
        return waiting.result(HANG_SECONDS)


def test_a_write_submitted_without_waiting_is_carried_by_the_next_group(connections: _Connections) -> None:
    """While another write commits, ``submit`` returns at once; the waiting write queued
    after it is handed the lead (not the unwaited one, whose thread is gone) and commits
    both."""
    commits = GroupCommit(connections)
    errors: list[BaseException] = []
    _, release = _held_group(commits, None)
    commits.submit(_insert("unwaited", 1), errors.append)  # returns while the held group commits
    assert commits.queued == 1 and connections.committed() == {}
    assert _waited_behind(commits, release, _insert("waiting", 2), queued=2) == 1
    assert connections.committed() == {"unwaited": 1, "waiting": 2}
    assert commits.commits == 2 and errors == []


def test_with_only_unwaited_writes_queued_the_leader_commits_them_before_it_stops(
        connections: _Connections) -> None:
    commits = GroupCommit(connections)
    _, release = _held_group(commits, None)
    for i in range(3):
        commits.submit(_insert(f"u{i}", i), lambda err: None)
    release.set()
    wait_for(lambda: connections.committed() == {"u0": 0, "u1": 1, "u2": 2},
             what="the unwaited writes committed (not stranded)", interval=0.005)
    assert commits.run(_insert("after", 9)) == 1  # nobody is left leading by mistake


def test_an_unwaited_write_that_fails_is_told_and_rolled_back_alone(connections: _Connections) -> None:
    commits = GroupCommit(connections)
    errors: list[BaseException] = []
    _, release = _held_group(commits, None)
    commits.submit(_insert("dup", 1), errors.append)
    commits.submit(_insert("dup", 2), errors.append)  # the primary key refuses it
    assert _waited_behind(commits, release, _insert("waiting", 3), queued=3) == 1
    assert connections.committed() == {"dup": 1, "waiting": 3}
    assert len(errors) == 1 and isinstance(errors[0], sqlite3.IntegrityError)


def test_an_acknowledgement_recorded_without_waiting_is_in_the_file_once_the_store_closed(tmp_path: Path) -> None:
    from serverless_worker.model import Delivery, Outcome, OutcomeKind, ReportReceipt

    store = SqliteStateStore(tmp_path / "s.db")
    delivery = Delivery(protocol="priostack", handler="h", job_id="j1", ledger_id="j1:r0", payload={},
                        wire={"key": "j1"})
    key = store.record_delivery(delivery, instance="i", deadline=time.time() + 60, dispatch_mode="invoke")
    assert key is not None and store.start_run(key, epoch="e", deadline=time.time() + 60) is not None
    store.store_outcome(key, "e", Outcome(kind=OutcomeKind.SUCCESS, value={"ok": True}))
    commits = store._writes
    _, release = _held_group(commits, None)  # so the unwaited write only queues
    assert store.mark_acknowledged(key, ReportReceipt(accepted=True), wait=False) is True
    assert commits.queued == 1
    release.set()
    store.close()
    reopened = SqliteStateStore(tmp_path / "s.db")
    try:
        item = reopened.get(key)
        assert item is not None and str(item.status).endswith("ACKNOWLEDGED")
    finally:
        reopened.close()


def test_flush_commits_the_unwaited_writes_an_interrupted_leader_left(connections: _Connections) -> None:
    """A leader stopped by Ctrl-C mid-commit leaves what queued meanwhile to the next
    write; when only unwaited writes queued, nothing else would come: closing flushes."""
    commits = GroupCommit(connections)
    commit = commits._commit
    interrupted: list[bool] = []

    def interrupted_once(group: list) -> None:  # type: ignore[type-arg]
        if not interrupted:
            interrupted.append(True)
            other = threading.Thread(target=commits.submit, args=(_insert("queued", 1), lambda err: None))
            other.start()
            other.join(HANG_SECONDS)
            raise KeyboardInterrupt
        commit(group)

    commits._commit = interrupted_once  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        commits.run(_insert("first", 0))
    assert connections.committed() == {} and commits.queued == 1
    commits.flush()
    assert connections.committed() == {"queued": 1}
