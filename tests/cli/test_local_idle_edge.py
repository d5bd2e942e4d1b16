"""CLI tier: ``serverless-worker local --until-idle-seconds N`` ends only when no pull is in
flight, and a delivery that arrives at the idle edge is run, not handed back, every protocol.

The sandbox holds the worker's first pull (a ``latency`` fault) past the idle window; the job
is seeded while that pull is held, so the pull brings it back after the window has closed.
The run used to end the moment the window closed and hand the job back unrun.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_local_cli import SANDBOX_KEYS, settled
from test_local_crash import _ledger, _seed
from test_local_stuck import PULL_ENDPOINT, _command, worker

from serverless_worker.model import LedgerStatus
from support.waiting import wait_for

pytestmark = pytest.mark.cli

__all__ = ["SANDBOX_KEYS"]  # read by the `sandbox` fixture

PROTOCOLS = ("pipelogiq", "priostack", "claimqueue")
IDLE = "2"
HELD_MS = 5000  # the first pull is held this long: well past the idle window
EXIT_WITHIN = 90


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_job_that_arrives_at_the_idle_edge_is_run(
        protocol: str, sandbox: Callable[..., Any], tmp_path: Path) -> None:
    # given a server that holds the worker's first pull past its idle window
    server, admin = sandbox(protocol)
    label = PULL_ENDPOINT[protocol]
    admin.faults([{"kind": "latency", "endpoint": label, "latency_ms": HELD_MS, "count": 1}])
    command, env, state, marks = _command(protocol, server.url, tmp_path)
    with worker([*command, "--until-idle-seconds", IDLE], tmp_path, env) as process:
        # when a job is seeded while that pull is held (it brings the job back after the window closed)
        wait_for(lambda: process.poll() is not None or admin.stats()["faults_fired"] >= 1, 60,
                 "the first pull to be held", interval=0.05)
        _seed(admin, protocol, [{"n": 0}])
        try:
            out, _ = process.communicate(timeout=EXIT_WITHIN)
        except subprocess.TimeoutExpired:
            pytest.fail("the worker did not end by itself once idle")

    # then the job the edge's pull brought was run and reported, and the run ended cleanly
    assert process.returncode == 0, out
    assert (marks / "0.started").exists(), out
    (items,) = _ledger(state).values()
    assert [item.status for item in items] == [LedgerStatus.ACKNOWLEDGED], items
    (job,) = admin.jobs()
    assert settled(protocol, job), job
    assert "no job for 2 s" in out, out
