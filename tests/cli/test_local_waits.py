"""CLI tier: no wait of ``serverless-worker local`` outlasts what it can afford, whatever
``Retry-After`` the server sends (a day, an HTTP date a year ahead), every protocol.

A report so answered is not waited on: the outcome stays stored, the log says so in one line,
and the job is reported once the server relents (by the reaper, or the drain's last try);
if it never does, the run exits 1 naming the job. A report that met an outage instead is
still worked on: idleness waits for the reaper's next tries. A pull so answered pauses, never storms,
and SIGTERM ends the run at once, not after the drain's grace (600 s here, far past the
``communicate`` timeout that bounds a hang: nothing below reads the clock).
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pytest
from test_local_cli import SANDBOX_KEYS, row, settled
from test_local_crash import RESULT_ENDPOINT, _input, _ledger, _seed
from test_local_stuck import PULL_ENDPOINT, _command, worker

from serverless_worker.model import LedgerStatus
from serverless_worker.protocols.transport import RetryPolicy
from support.waiting import wait_for

pytestmark = pytest.mark.cli

__all__ = ["SANDBOX_KEYS"]  # read by the `sandbox` fixture

PROTOCOLS = ("pipelogiq", "priostack", "claimqueue")
HINTS = {"a day": lambda: "86400", "a year ahead": lambda: formatdate(time.time() + 365 * 86400, usegmt=True)}
GRACE = "600"       # a drain that waited for it would fail the timeout below
EXIT_WITHIN = 90
REPORT_ATTEMPTS = RetryPolicy().attempts  # a report's, all within its retry budget


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=EXIT_WITHIN)


@pytest.mark.parametrize("hint", HINTS)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_report_told_to_wait_a_day_is_reported_once_the_server_relents(
        protocol: str, hint: str, sandbox: Callable[..., Any], tmp_path: Path) -> None:
    # given a server that answers the first report 429 with a Retry-After a day or a year away
    server, admin = sandbox(protocol)
    label = RESULT_ENDPOINT[protocol]
    admin.faults([{"kind": "rate_limit", "endpoint": label, "retry_after": HINTS[hint](), "count": 1}])
    command, env, state, _ = _command(protocol, server.url, tmp_path, grace=GRACE)
    _seed(admin, protocol, [{"n": 0}])

    # when the worker runs until idle
    done = _run([*command, "--until-idle-seconds", "2"], tmp_path, env)
    out = done.stdout + done.stderr

    # then the report was not waited on: the log says so in one line, naming the limit
    assert "the server asked to wait" in out and "so it was not waited" in out, out
    assert "left to the reaper and the next run" in out, out
    # and once the server relented the job was reported (a second call, none in between)
    assert done.returncode == 0, out
    assert admin.stats()["calls"][label] == 2, out
    (job,) = admin.jobs()
    assert settled(protocol, job), job
    (items,) = _ledger(state).values()
    assert [item.status for item in items] == [LedgerStatus.ACKNOWLEDGED], items


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_server_that_never_relents_ends_the_run_with_the_job_named(
        protocol: str, sandbox: Callable[..., Any], tmp_path: Path) -> None:
    # given a server answering every report 429 Retry-After: a year ahead
    server, admin = sandbox(protocol)
    label = RESULT_ENDPOINT[protocol]
    admin.faults([{"kind": "rate_limit", "endpoint": label, "retry_after": HINTS["a year ahead"]()}])
    command, env, state, _ = _command(protocol, server.url, tmp_path, grace=GRACE)
    _seed(admin, protocol, [{"n": 0}])

    # when the worker runs until idle (its drain's grace 600 s)
    done = _run([*command, "--until-idle-seconds", "2"], tmp_path, env)
    out = done.stdout + done.stderr

    # then it ended by itself without waiting the grace, exit 1, the job named in the summary
    assert done.returncode == 1, out
    (job,) = admin.jobs()
    (items,) = _ledger(state).values()
    assert [item.status for item in items] == [LedgerStatus.OUTCOME_STORED], items
    assert f"{items[0].delivery.job_id}  outcome stored, report not confirmed" in out, out
    assert row(out, "still in flight") == 1, out
    # and the server saw the report when the job ran and at the drain's last try, no more
    assert admin.stats()["calls"][label] == 2, out
    assert not settled(protocol, job) and _input(protocol, job)["n"] == 0, job


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_report_that_met_an_outage_is_reported_by_the_reaper_before_the_run_ends(
        protocol: str, sandbox: Callable[..., Any], tmp_path: Path) -> None:
    # given a server that answers a report 503 one time more than the client's attempts:
    # the executor's call and the reaper's first try fail, the reaper's second gets through
    server, admin = sandbox(protocol)
    label = RESULT_ENDPOINT[protocol]
    admin.faults([{"kind": "error_5xx", "endpoint": label, "count": REPORT_ATTEMPTS + 1}])
    command, env, state, _ = _command(protocol, server.url, tmp_path, grace=GRACE)
    _seed(admin, protocol, [{"n": 0}])

    # when the worker runs until idle, its ticks (and so its reaper) 3 s apart
    done = _run([*command, "--until-idle-seconds", "2", "--poll-window-seconds", "3"], tmp_path, env)
    out = done.stdout + done.stderr

    # then idleness waited for the reaper (an outage is not a server's word to wait): the job
    # was reported, exit 0, and the drain had nothing left to try
    assert done.returncode == 0, out
    (job,) = admin.jobs()
    assert settled(protocol, job), job
    (items,) = _ledger(state).values()
    assert [item.status for item in items] == [LedgerStatus.ACKNOWLEDGED], items
    assert admin.stats()["calls"][label] == REPORT_ATTEMPTS + 2, out


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_sigterm_ends_a_run_whose_pulls_are_told_to_wait_a_day(
        protocol: str, sandbox: Callable[..., Any], tmp_path: Path) -> None:
    # given a server answering every pull 429 Retry-After: 86400
    server, admin = sandbox(protocol)
    label = PULL_ENDPOINT[protocol]
    admin.faults([{"kind": "rate_limit", "endpoint": label, "retry_after": "86400"}])
    command, env, _, _ = _command(protocol, server.url, tmp_path, grace=GRACE)
    with worker(command, tmp_path, env) as process:
        # when the first pull was refused, and SIGTERM comes a moment later
        wait_for(lambda: process.poll() is not None or admin.stats()["calls"].get(label, 0) >= 1, 60,
                 "the first pull", interval=0.1)
        time.sleep(1.0)  # the tick's pause: a storm would send many pulls meanwhile
        pulls = admin.stats()["calls"][label]
        assert process.poll() is None
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=EXIT_WITHIN)

    # then the pulls were paced (one per pause, not one per answer) and the run ended by itself
    assert pulls <= 2, (pulls, out)
    assert "draining (SIGTERM)" in out, out
    assert process.returncode is not None, out
    assert admin.stats()["calls"][label] <= pulls + 1, out
