"""The local state file holds delivery tokens and the worker session: it is owner-only
(0600) whatever mode it had before, and so are its SQLite and lock companions."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from serverless_worker.local.state_file import LocalState


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_an_existing_world_readable_state_file_is_made_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite3"
    LocalState.open(path, final_retention_seconds=600).close()  # a real database file
    companions = [Path(f"{path}-wal"), Path(f"{path}-shm"), Path(f"{path}.lock")]
    for file in [path, *companions]:
        file.touch()
        os.chmod(file, 0o666)
        assert _mode(file) == 0o666  # the umask does not apply to chmod
    state = LocalState.open(path, final_retention_seconds=600)
    try:
        for file in [path, *companions]:
            assert _mode(file) == 0o600, file.name
    finally:
        state.close()


def test_a_new_state_file_is_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "new" / "state.sqlite3"
    old = os.umask(0)  # a permissive umask must not widen it
    try:
        state = LocalState.open(path, final_retention_seconds=600)
    finally:
        os.umask(old)
    try:
        assert _mode(path) == 0o600
    finally:
        state.close()
