"""CLI tier: ``serverless-worker local`` against servers that bend one rule, counted on the
sandbox (docs/protocols.md, "Pacing empty pulls and refusals").

A server that answers an empty pull at once whatever wait was asked (the sandbox's
``ignore_wait``: Pipelogiq answers ``204`` at once, as its older release does; Priostack
and the claim queue answer at once by their documents) gets a handful of pulls while the
worker idles, not hundreds a second. A server that refuses every lease (``401 worker
session expired`` on each acquire; a lease whose ``leaseExpiresAt`` has no time zone)
gets a bounded number of bootstraps and acquires over a bounded run, not a loop of pull,
hand back, pull again and re-bootstrap at full speed.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_local_cli import CLI, SANDBOX_KEYS, SECRET, clean_env, held, local, row, seed  # noqa: F401

from support.waiting import wait_for

pytestmark = pytest.mark.cli

PROTOCOLS = ("pipelogiq", "priostack", "claimqueue")
PULL_LABEL = {"pipelogiq": "pull", "priostack": "activate", "claimqueue": "claim"}
IDLE_SECONDS = 4
# How long a refusal loop is left to run once it has begun.
LOOP_SECONDS = 8.0

HANDLERS = '''
from serverless_worker import handler


@handler("double")
def double(job):
    return {"value": job.input["n"] * 2}
'''


@pytest.fixture
def handler_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_handlers.py"
    path.write_text(HANDLERS)
    return path


def _worker(server: Any, protocol: str, handler_file: Path, *extra: str) -> list[str]:
    return ["--protocol", protocol, "--url", server.url, "--api-key-env", "TEST_KEY",
            "--handler-module", str(handler_file), "--handlers", "double", "--concurrency", "2", *extra]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_idle_worker_pulls_a_server_without_a_long_poll_a_few_times_a_second_at_most(
        protocol: str, sandbox: Callable[..., Any], handler_file: Path) -> None:
    # given a server that answers every empty pull at once, whatever wait was asked, and two jobs
    server, admin = sandbox(protocol)
    admin.faults([{"kind": "ignore_wait", "endpoint": PULL_LABEL[protocol]}])
    seed(admin, protocol, "double", [{"n": 1}, {"n": 2}])

    # when the worker takes them, then idles until it stops by itself
    result = local(*_worker(server, protocol, handler_file, "--until-idle", str(IDLE_SECONDS)),
                   env=clean_env(TEST_KEY=SECRET), cwd=handler_file.parent)

    # then the jobs are done and the idle seconds cost a handful of pulls (back-off waits of
    # 0.1-0.2 s doubling up to the protocol's 2 or 5 s): not one pull per round trip
    out = result.stdout
    assert result.returncode == 0, f"stdout:\n{out}\nstderr:\n{result.stderr}"
    assert row(out, "done") == 2
    pulls = admin.stats()["calls"][PULL_LABEL[protocol]]
    assert pulls <= 6 * IDLE_SECONDS, f"{pulls} pulls\nstdout:\n{out}\nstderr:\n{result.stderr}"
    if protocol == "pipelogiq":
        assert {p["status"] for p in admin.overview()["pulls"]} == {200, 204}


def _run_loop(server: Any, admin: Any, handler_file: Path) -> tuple[str, str, int]:
    """The worker against ``server`` until the refusal loop has run ``LOOP_SECONDS``; then
    SIGTERM. Returns stdout, stderr and the exit status."""
    proc = subprocess.Popen([str(CLI), "local", *_worker(server, "pipelogiq", handler_file)],
                            cwd=handler_file.parent, env=clean_env(TEST_KEY=SECRET), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: proc.poll() is not None or admin.stats()["calls"].get("lease.acquire", 0) >= 2,
                 60, "the first refused leases", interval=0.1)
        assert proc.poll() is None, "the worker exited before the loop began"
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=LOOP_SECONDS)  # the bounded run the counts are bounded over
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=90)  # it drains and exits: no hang
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return out, err, proc.returncode


def test_a_server_expiring_the_session_on_every_lease_acquire_gets_paced_bootstraps(
        sandbox: Callable[..., Any], handler_file: Path) -> None:
    # given a Pipelogiq server that answers every lease acquire with 401 worker session expired
    server, admin = sandbox("pipelogiq")
    admin.faults([{"kind": "expire_session", "endpoint": "lease.acquire"}])
    seed(admin, "pipelogiq", "double", [{"n": 1}, {"n": 2}])

    # when the worker runs against it for a while
    out, err, _ = _run_loop(server, admin, handler_file)

    # then bootstraps and acquires stay bounded: sessions are replaced at most every 0.5-30 s
    # (doubling) and each job waits 0.25-10 s (doubling) before its next lease. Going round
    # at full speed made about 50 bootstraps and 90 acquires a second.
    calls = admin.stats()["calls"]
    assert calls["bootstrap"] <= 10, (calls, err)
    assert calls["lease.acquire"] <= 40, (calls, err)
    # and nothing ran, nothing is held: every job is back in the queue
    assert row(out, "handler runs") == 0
    assert not [job for job in admin.jobs() if held("pipelogiq", job)]
    assert SECRET not in out and SECRET not in err


def test_a_lease_without_a_time_zone_is_refused_with_its_value_and_paced(
        sandbox: Callable[..., Any], handler_file: Path) -> None:
    # given a Pipelogiq server that grants leases with a leaseExpiresAt without a time zone
    # (short leases: its recovery publishes a new execution within seconds)
    server, admin = sandbox("pipelogiq", lease_seconds=2)
    admin.faults([{"kind": "naive_lease_time", "endpoint": "lease.acquire"}])
    seed(admin, "pipelogiq", "double", [{"n": 1}, {"n": 2}])

    # when the worker runs against it for a while
    out, err, _ = _run_loop(server, admin, handler_file)

    # then no handler ran on a lease whose end it cannot know, the log names the value, and
    # the acquires stay bounded (each job: a refused lease, a hand-back, a paced retry)
    assert row(out, "handler runs") == 0
    assert "without a time zone" in err and "leaseExpiresAt '20" in err
    calls = admin.stats()["calls"]
    assert calls["lease.acquire"] <= 30, (calls, err)
    assert calls["bootstrap"] <= 3, (calls, err)
