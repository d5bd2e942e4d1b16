"""CLI tier: Ctrl-C ends ``serverless-worker local`` within its drain's grace even when a
report or a handler is stuck, and after it nothing new starts (docs/local-development.md).

A server that answers every report ``429 Retry-After: 999999999`` used to put the
executor thread to sleep for that many seconds, and after Ctrl-C the summary printed
but the process never exited; a handler that never returns held it the same way. Now
the run gives up on what is still stuck when the grace ends: the process exits by
itself, not 0, and the delivery stays unsettled in the state file (not final), for the
next run to settle. Every wait below is for observable state; a hang fails on the
``communicate`` timeout, never on elapsed time.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from test_local_cli import CLI, SANDBOX_KEYS, SECRET, clean_env, held, settled
from test_local_crash import RESULT_ENDPOINT, _input, _ledger, _seed

from serverless_worker.model import LedgerStatus
from support.waiting import wait_for

pytestmark = pytest.mark.cli

__all__ = ["SANDBOX_KEYS"]  # read by the `sandbox` fixture

PROTOCOLS = ("pipelogiq", "priostack", "claimqueue")
GRACE = "3"          # the drain's grace, seconds
# The claim queue's lease: long enough for the handler to run (at least a second once the
# worker's two-second lease margin is off), short enough to lapse within the drain's grace.
CLAIM_LEASE_SECONDS = 4
CLAIM_GRACE = "7"
EXIT_WITHIN = 60     # a process that has not exited by then hangs
PULL_ENDPOINT = {"pipelogiq": "pull", "priostack": "activate", "claimqueue": "claim"}

HANDLERS = '''
import os
import pathlib

from serverless_worker import handler

MARKS = pathlib.Path(os.environ["STUCK_MARKS"])


@handler("crash.work")
def work(job):
    (MARKS / f"{job.input['n']}.started").touch()
    while job.input.get("forever"):  # never returns, and ignores cancellation
        pathlib.Path(os.devnull).exists()
    while job.input.get("hold") and (MARKS / "hold").exists():
        job.wait(0.05)
    return {"n": job.input["n"]}
'''


@contextmanager
def worker(command: list[str], cwd: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def _command(protocol: str, url: str, tmp_path: Path, *,
             grace: str = GRACE) -> tuple[list[str], dict[str, str], Path, Path]:
    marks = tmp_path / "marks"
    marks.mkdir()
    module = tmp_path / "stuck_handlers.py"
    module.write_text(HANDLERS)
    state = tmp_path / "worker.sqlite3"
    command = [str(CLI), "local", "--protocol", protocol, "--url", url, "--api-key-env", "TEST_KEY",
               "--handler-module", str(module), "--state", str(state), "--drain-grace-seconds", grace]
    return command, clean_env(TEST_KEY=SECRET, STUCK_MARKS=str(marks)), state, marks


def _interrupt_and_wait(process: subprocess.Popen[str]) -> str:
    """SIGINT once, then wait for the process to end by itself; a hang fails here."""
    assert process.poll() is None, process.communicate()[0]
    process.send_signal(signal.SIGINT)
    try:
        out, _ = process.communicate(timeout=EXIT_WITHIN)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
        pytest.fail(f"the worker did not exit within {EXIT_WITHIN} s of SIGINT:\n{out}")
    return out


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_ctrl_c_ends_the_run_while_a_report_waits_on_a_huge_retry_after(
        protocol: str, sandbox: Callable[..., Any], tmp_path: Path) -> None:
    # given a server answering every report 429 Retry-After: 999999999 (on the claim queue
    # with a lease that lapses during the drain, so the item is up for claiming again)
    claim_queue = protocol == "claimqueue"
    server, admin = sandbox(protocol, **({"lease_seconds": CLAIM_LEASE_SECONDS} if claim_queue else {}))
    label = RESULT_ENDPOINT[protocol]
    admin.faults([{"kind": "rate_limit", "endpoint": label, "retry_after": "999999999"}])
    command, env, state, _ = _command(protocol, server.url, tmp_path, grace=CLAIM_GRACE if claim_queue else GRACE)
    _seed(admin, protocol, [{"n": 0}])
    with worker(command, tmp_path, env) as process:
        # when the job ran and its report was refused, and Ctrl-C comes while it waits to retry
        wait_for(lambda: process.poll() is not None or admin.stats()["calls"].get(label, 0) >= 1,
                 60, "the report to be refused", interval=0.1)
        out = _interrupt_and_wait(process)

    # then the process ended by itself, not 0, and said what it left
    assert process.returncode not in (0, None), out
    assert "draining (SIGINT)" in out
    assert "asked to wait 999999999 s (Retry-After)" in out
    # and the delivery is unsettled in the state file: its outcome stored, not reported
    (items,) = _ledger(state).values()
    assert [item.status for item in items] == [LedgerStatus.OUTCOME_STORED], items
    assert not items[0].is_final
    # and it was never waited for (the wait the server asked for is beyond any limit): the
    # server saw the report when the job ran and once more at the drain's last try
    assert admin.stats()["calls"][label] == 2
    (job,) = admin.jobs()
    assert _input(protocol, job)["n"] == 0
    if claim_queue:
        # and the item, its lease lapsed, was not claimed again into the same hang
        wait_for(lambda: any(h["event"] == "lapse" for h in admin.jobs()[0]["history"]), what="the lease to lapse")
        events = [h["event"] for h in admin.jobs()[0]["history"]]
        assert events.count("claim") == 1 and "result" not in events, events


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_ctrl_c_ends_the_run_while_a_handler_never_returns(
        protocol: str, sandbox: Callable[..., Any], tmp_path: Path) -> None:
    # given a handler that never returns and ignores cancellation
    server, admin = sandbox(protocol)
    command, env, state, marks = _command(protocol, server.url, tmp_path)
    _seed(admin, protocol, [{"n": 0, "forever": True}])
    with worker(command, tmp_path, env) as process:
        # when Ctrl-C comes while it runs
        wait_for(lambda: process.poll() is not None or (marks / "0.started").exists(), 60,
                 "the handler to start", interval=0.1)
        out = _interrupt_and_wait(process)

    # then the process ended by itself once the grace was over, not 0
    assert process.returncode not in (0, None), out
    assert "draining (SIGINT)" in out
    # and the delivery is unsettled in the state file: still running there, for the next run
    (items,) = _ledger(state).values()
    assert [item.status for item in items] == [LedgerStatus.RUNNING], items
    # and the server got no result for it
    (job,) = admin.jobs()
    assert admin.stats()["calls"].get(RESULT_ENDPOINT[protocol], 0) == 0, job


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_delivery_pulled_after_ctrl_c_is_handed_back_unstarted(
        protocol: str, sandbox: Callable[..., Any], tmp_path: Path) -> None:
    # given a worker running one job at a time, busy with a job that holds until released
    server, admin = sandbox(protocol)
    command, env, state, marks = _command(protocol, server.url, tmp_path)
    (marks / "hold").touch()
    _seed(admin, protocol, [{"n": 0, "hold": True}])
    with worker([*command, "--concurrency", "1"], tmp_path, env) as process:
        wait_for(lambda: process.poll() is not None or (marks / "0.started").exists(), 60,
                 "the first job to start", interval=0.1)
        # and a second job waiting, behind a pull the server will hold for a while
        label = PULL_ENDPOINT[protocol]
        admin.faults([{"kind": "latency", "endpoint": label, "latency_ms": 8000, "count": 1}])
        _seed(admin, protocol, [{"n": 1}])
        # when the first job ends, the worker pulls the second, and Ctrl-C comes during that pull
        (marks / "hold").unlink()
        wait_for(lambda: process.poll() is not None or admin.stats()["faults_fired"] >= 1, 60,
                 "the next pull to arrive", interval=0.05)
        out = _interrupt_and_wait(process)

    # then the job the pull brought back after Ctrl-C never started, and went back unstarted
    assert process.returncode == 0, out
    assert not (marks / "1.started").exists(), out
    ledger = _ledger(state)
    assert [item.status for item in ledger[0]] == [LedgerStatus.ACKNOWLEDGED], ledger
    assert [item.status for item in ledger[1]] == [LedgerStatus.HANDED_BACK], ledger
    # and on the server it has no result, and is not held (a claim-queue item has no release
    # call over HTTP: its lease lapses)
    second = next(job for job in admin.jobs() if _input(protocol, job)["n"] == 1)
    assert not settled(protocol, second), second
    assert protocol == "claimqueue" or not held(protocol, second), second
