"""CLI tier: a server that echoes the request (credential included) and control characters
in its error texts. ``serverless-worker local`` must keep the key out of its output and its
state file, and write no raw control character to either (``logsafety.server_text``, used
by every protocol client and by the state store)."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cli.test_local_cli import CLI, HANDLERS, clean_env, seed
from serverless_worker.sandbox._server import ECHO_CONTROLS
from support.waiting import wait_for

pytestmark = pytest.mark.cli

SECRET = "k3y-echoed-by-the-server-5d1c"
SANDBOX_KEYS: dict[str, dict[str, Any]] = {
    "pipelogiq": {"api_keys": {SECRET: 12}},
    "priostack": {"api_keys": [SECRET]},
    "claimqueue": {"tokens": [SECRET]},
}
REPORT = {"pipelogiq": "result", "priostack": "complete", "claimqueue": "result"}
RAW_CONTROLS = ("\x1b", "\r", "\x00", "\x9b")


def _strings(value: Any) -> Iterator[str]:
    """Every string in ``value``, a JSON document's decoded (JSON would hide a raw control
    character behind its own escape)."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except ValueError:
            yield value
            return
        if isinstance(decoded, str):
            yield decoded
        elif isinstance(decoded, dict | list):
            yield from _strings(decoded)
        else:
            yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _state_text(path: Path) -> str:
    """Every string of every row of every table of the SQLite state file."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        tables = [name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        rows = [row for table in tables for row in db.execute(f'SELECT * FROM "{table}"')]
    return "\n".join(text for row in rows for value in row for text in _strings(value))


@pytest.mark.parametrize("protocol", ["pipelogiq", "priostack", "claimqueue"])
def test_an_error_echoing_the_key_and_controls_reaches_neither_output_nor_state(
        protocol: str, sandbox: Callable[..., Any], tmp_path: Path) -> None:
    # given a server whose report endpoint refuses every report with the request echoed back
    server, admin = sandbox(protocol)
    seed(admin, protocol, "double", [{"n": 1}])
    admin.faults([{"kind": "echo_request", "endpoint": REPORT[protocol], "status": 400}])
    handler_file = tmp_path / "my_handlers.py"
    handler_file.write_text(HANDLERS)
    state = tmp_path / ".serverless-worker" / "state.sqlite3"
    proc = subprocess.Popen(
        [str(CLI), "local", "--protocol", protocol, "--url", server.url, "--api-key-env", "TEST_KEY",
         "--handler-module", str(handler_file), "--handlers", "double"],
        # a short drain: the refused report is never settled, and that is not what this test is about
        cwd=tmp_path, env=clean_env(TEST_KEY=SECRET, SW_DRAIN_GRACE_SECONDS="2"), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        # when the refusal has been recorded on the delivery (the settle failure the reaper retries)
        wait_for(lambda: proc.poll() is not None or (state.exists() and "cannot handle" in _state_text(state)),
                 90, "the refusal to be recorded in the state file", interval=0.2)
        assert proc.poll() is None, "the worker exited early"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    # then the server's text is there, redacted and escaped, in the log and in the state file
    stored = _state_text(state)
    assert admin.stats()["calls"][REPORT[protocol]] >= 1
    for text, where in ((err, "stderr"), (stored, "state file")):
        assert "cannot handle POST" in text, where
        assert "[redacted]" in text, where
        assert r"\r\nX-Injected: yes\x00\x9b31m" in text, where  # escaped, so visible
        assert SECRET not in text, where
        for control in RAW_CONTROLS:
            assert control not in text, (where, control)
    assert ECHO_CONTROLS not in out + err
    assert SECRET not in out
    for control in RAW_CONTROLS:
        assert control not in out


@pytest.mark.parametrize("suffix", ["\r\nX-Injected: yes", "\x00"], ids=["crlf-header", "nul"])
def test_a_session_token_that_cannot_be_a_header_ends_the_run_naming_it(
        suffix: str, sandbox: Callable[..., Any], tmp_path: Path) -> None:
    # given a Pipelogiq server whose bootstrap hands out a token that would inject a header
    server, admin = sandbox("pipelogiq", session_token_suffix=suffix)
    seed(admin, "pipelogiq", "double", [{"n": 1}])
    handler_file = tmp_path / "my_handlers.py"
    handler_file.write_text(HANDLERS)

    # when the worker runs against it
    result = subprocess.run(
        [str(CLI), "local", "--protocol", "pipelogiq", "--url", server.url, "--api-key-env", "TEST_KEY",
         "--handler-module", str(handler_file), "--handlers", "double", "--until-idle", "5"],
        cwd=tmp_path, env=clean_env(TEST_KEY=SECRET), capture_output=True, text=True, timeout=120)

    # then each tick ends on the refused bootstrap (backed off, no crash), the run ends non-zero
    # saying why, and the token was never sent: the server saw bootstraps and nothing else
    assert result.returncode != 0, result.stdout
    assert "workerSessionToken is empty or holds whitespace or control characters" in result.stderr
    assert "nothing was taken" in result.stderr
    assert "Traceback" not in result.stderr
    calls = admin.stats()["calls"]
    assert set(calls) == {"bootstrap"} and 1 <= calls["bootstrap"] <= 5, calls
    [job] = admin.jobs()
    assert job["status"] == "Pending"  # never taken, so nothing is stranded
    for control in RAW_CONTROLS:
        assert control not in result.stdout + result.stderr
