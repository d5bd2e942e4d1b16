"""The SQLite state file's schema: a file written by an earlier version (rows kept in key
order, ``WITHOUT ROWID``) is brought to the current one when a store opens it, and what
it held, a delivery in flight included, is settled as before."""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import closing
from pathlib import Path

from serverless_worker.model import Delivery, LedgerStatus, Outcome, OutcomeKind, ReportReceipt
from serverless_worker.state import SqliteStateStore

# The version-1 schema exactly as that release created it.
_VERSION_1 = """
CREATE TABLE IF NOT EXISTS items (
    pk TEXT PRIMARY KEY,
    doc TEXT NOT NULL,
    scope TEXT GENERATED ALWAYS AS (json_extract(doc, '$.scope')) VIRTUAL,
    deadline REAL GENERATED ALWAYS AS (json_extract(doc, '$.deadline')) VIRTUAL,
    ttl INTEGER GENERATED ALWAYS AS (json_extract(doc, '$.ttl')) VIRTUAL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS in_flight ON items (scope, deadline) WHERE scope IS NOT NULL;
CREATE INDEX IF NOT EXISTS expiry ON items (ttl) WHERE ttl IS NOT NULL;
"""


def _version_1_file(path: Path, delivery: Delivery) -> str:
    """A version-1 file holding ``delivery`` recorded (as that release's store wrote it)."""
    with closing(SqliteStateStore(path.with_name("scratch.sqlite3"))) as scratch:
        key = scratch.record_delivery(delivery, instance="i-1", deadline=time.time() + 60, dispatch_mode="invoke")
        assert key is not None
        doc = sqlite3.connect(scratch.path).execute("SELECT doc FROM items WHERE pk = ?", (key,)).fetchone()[0]
    with sqlite3.connect(path) as db:
        db.executescript(_VERSION_1)
        db.execute("INSERT INTO items (pk, doc) VALUES (?, ?)", (key, doc))
    return key


def test_a_version_1_file_is_migrated_and_its_delivery_settles(tmp_path: Path) -> None:
    # given a state file of the first schema with a delivery recorded and not yet run
    delivery = Delivery(protocol="priostack", handler="echo", job_id="j-1", ledger_id="j-1:r3",
                        payload={"n": 1}, wire={"key": "j-1"})
    path = tmp_path / "state.sqlite3"
    key = _version_1_file(path, delivery)

    # when a store opens it
    with closing(SqliteStateStore(path)) as store:
        # then the rows are in the current schema, and the delivery is in flight as it was
        with sqlite3.connect(path) as db:
            table = db.execute("SELECT sql FROM sqlite_master WHERE name = 'items'").fetchone()[0]
            assert "WITHOUT ROWID" not in table.upper()
            assert db.execute("PRAGMA user_version").fetchone()[0] == 3
            assert {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")} >= {
                "in_flight", "expiry"}
        assert [item.key for item in store.in_flight("priostack", "i-1")] == [key]

        # and it runs and settles through the same transitions
        item = store.start_run(key, epoch="run-1", deadline=time.time() + 60)
        assert item is not None and item.delivery.job_id == "j-1"
        store.store_outcome(key, "run-1", Outcome(kind=OutcomeKind.SUCCESS, value={"ok": True}))
        assert store.mark_acknowledged(key, ReportReceipt(accepted=True))
        settled = store.get(key)
        assert settled is not None and settled.status is LedgerStatus.ACKNOWLEDGED
        assert store.in_flight("priostack", "i-1") == []

        # and a duplicate of it is still refused (the unique key moved with the rows)
        assert store.record_delivery(delivery, instance="i-1", deadline=time.time() + 60,
                                     dispatch_mode="invoke") is None


def test_a_current_file_opens_again_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    delivery = Delivery(protocol="claimqueue", handler="resize", job_id="a", ledger_id="a:1",
                        payload={}, wire={"id": "a"})
    with closing(SqliteStateStore(path)) as store:
        key = store.record_delivery(delivery, instance="i-1", deadline=time.time() + 60, dispatch_mode="invoke")
    with closing(SqliteStateStore(path)) as store:
        item = store.get(key or "")
        assert item is not None and json.loads(json.dumps(item.delivery.wire)) == {"id": "a"}
        assert [i.key for i in store.in_flight("claimqueue", "i-1")] == [key]


def test_a_version_2_file_gains_the_meta_table_and_keeps_its_items(tmp_path: Path) -> None:
    # given a file of version 2: the current items table, no meta table
    path = tmp_path / "state.sqlite3"
    delivery = Delivery(protocol="priostack", handler="echo", job_id="j-2", ledger_id="j-2:r3", payload={})
    with closing(SqliteStateStore(path)) as store:
        key = store.record_delivery(delivery, instance="i-1", deadline=time.time() + 60, dispatch_mode="invoke")
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE meta")
        db.execute("PRAGMA user_version = 2")

    # when a store opens it
    with closing(SqliteStateStore(path)) as store:
        # then it is version 3, the meta table works, and the delivery is still in flight
        assert store.read_meta("server") is None
        store.write_meta("server", "priostack http://127.0.0.1:8081")
        assert store.read_meta("server") == "priostack http://127.0.0.1:8081"
        assert [item.key for item in store.in_flight("priostack", "i-1")] == [key]
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 3
