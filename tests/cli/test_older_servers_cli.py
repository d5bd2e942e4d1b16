"""CLI tier: ``serverless-worker local`` against servers whose deliveries it cannot address
(docs/protocols.md, "Older Pipelogiq servers"): nothing is acknowledged away.

An older Pipelogiq release (the sandbox's ``legacy`` mode) hands out deliveries without an
``executionId``: the run stops in one line naming what the server lacks, exit 2, and the
jobs are back on the server's queue. One broken delivery among good ones is only that:
the good ones run, and the broken one is left to the visibility timeout (then worked
once the server sends it whole), never acked with ``requeue:false``. On Priostack and the
claim queue a delivery whose key or id is usable but another field is not gets its
definite outcome with the reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from support.waiting import wait_for

pytestmark = pytest.mark.cli

CLI = Path(sys.executable).with_name("serverless-worker")
SECRET = "older-server-k3y-never-printed-7d1e"
SANDBOX_KEYS: dict[str, dict[str, Any]] = {
    "pipelogiq": {"api_keys": {SECRET: 12}},
    "priostack": {"api_keys": [SECRET]},
    "claimqueue": {"tokens": [SECRET]},
}
HANDLERS = '''
from serverless_worker import handler


@handler("double")
def double(job):
    return {"value": job.input["n"] * 2}
'''
LEGACY_LINE = ("deliveries carry no executionId: this server speaks a Pipelogiq worker protocol older "
               "than the lease API")


def local(protocol: str, url: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "my_handlers.py").write_text(HANDLERS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SW_")}
    env["TEST_KEY"] = SECRET
    return subprocess.run(
        [str(CLI), "local", "--protocol", protocol, "--url", url, "--api-key-env", "TEST_KEY",
         "--handler-module", "my_handlers.py", "--handlers", "double", *extra],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)


def test_an_older_pipelogiq_server_ends_the_run_in_one_line_and_keeps_its_jobs(
        sandbox: Callable[..., Any], tmp_path: Path) -> None:
    # given the older public Pipelogiq release with three jobs waiting
    server, admin = sandbox("pipelogiq", legacy=True)
    job_ids = admin.seed({"handler": "double", "inputs": [{"n": 1}, {"n": 2}, {"n": 3}]})["jobIds"]

    # when the worker runs against it
    result = local("pipelogiq", server.url, tmp_path, "--until-idle", "60")

    # then one line names what the server lacks; exit 2, no summary
    assert result.returncode == 2, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("serverless-worker: error: "), result.stderr
    assert server.url in lines[0] and LEGACY_LINE in lines[0], lines[0]
    assert "jobs taken" not in result.stdout and SECRET not in result.stdout + result.stderr
    # and every job is still on the server, queued again: handed back, never acknowledged away
    for job in admin.jobs():
        events = [h["event"] for h in job["history"]]
        assert "ack" not in events and events[-1] == "requeue", (job["job_id"], events)
    overview = admin.overview()
    assert overview["queues"]["app_12_double_StageNext"] == len(job_ids) and overview["inFlight"] == 0
    calls = admin.stats()["calls"]
    assert calls.get("lease.acquire", 0) == 0 and calls.get("result", 0) == 0


def test_one_delivery_without_execution_id_among_good_ones_is_never_acked_away(
        sandbox: Callable[..., Any], tmp_path: Path) -> None:
    # given a current Pipelogiq server whose first delivery comes without its executionId
    server, admin = sandbox("pipelogiq", visibility_timeout=1)
    first, *others = admin.seed({"handler": "double", "inputs": [{"n": 1}, {"n": 2}, {"n": 3}]})["jobIds"]
    admin.faults([{"kind": "corrupt_delivery", "endpoint": "pull", "field": "payload.executionId", "count": 1}])

    # when the worker runs until idle
    result = local("pipelogiq", server.url, tmp_path, "--until-idle", "4")

    # then the good ones ran and completed; the broken delivery was left unacknowledged, came
    # back with the visibility timeout, whole this time, and was worked once; the run says the
    # server sent an answer it could not use, and so does its exit status
    assert result.returncode == 1, result
    said = " ".join(result.stdout.split())
    assert "a delivery with no executionId, left to the server's own return path" in said, result.stdout
    jobs = {job["job_id"]: job for job in admin.jobs()}
    assert {jobs[job_id]["status"] for job_id in others} == {"Completed"}
    events = [h["event"] for h in jobs[first]["history"]]
    assert events[:3] == ["execution_created", "delivered", "visibility_requeue"], events
    assert events.count("ack") == 1 and jobs[first]["status"] == "Completed", events
    assert "cannot be addressed" in result.stderr and "not acknowledged" in result.stderr


CLAIMS = {"queue": "double", "items": [{"n": 1}, {"n": 2}]}


@pytest.mark.parametrize(("protocol", "seed", "fault", "transport"), [
    ("priostack", {"jobs": [{"type": "double", "variables": {"n": n}, "retries": 3} for n in (1, 2)]},
     {"endpoint": "activate", "field": "retries", "value": "three"}, "http"),
    ("claimqueue", CLAIMS, {"endpoint": "claim", "field": "attempts", "value": 0}, "http"),
    ("claimqueue", CLAIMS, {"endpoint": "claim", "field": "lease", "value": "soon"}, "socket"),
], ids=["priostack-retries", "claimqueue-attempts", "claimqueue-socket-lease"])
def test_a_delivery_with_an_unusable_field_gets_its_definite_outcome_with_the_reason(
        protocol: str, seed: dict[str, Any], fault: dict[str, Any], transport: str,
        sandbox: Callable[..., Any], tmp_path: Path) -> None:
    # given a server whose first delivery carries one unusable field, its key or id intact
    server, admin = sandbox(protocol)
    admin.seed(seed)
    admin.faults([{"kind": "corrupt_delivery", "count": 1, **fault}])

    # when the worker runs until idle
    result = local(protocol, server.url, tmp_path, "--until-idle", "2", "--transport", transport)

    # then the good job ran, and the broken one got the protocol's definite outcome naming the field
    jobs = admin.jobs()
    if protocol == "priostack":
        [broken] = [job for job in jobs if job["state"] == "incident"]
        assert broken["retries_history"][-1] == 0  # failed with retries 0: an incident, never re-run
        assert "invalid delivery" in broken["error_message"] and fault["field"] in broken["error_message"]
        assert [job["state"] for job in jobs].count("completed") == 1
    else:
        [broken] = [job for job in jobs if "error" in (job["result"] or {})]
        assert broken["status"] == "finished" and broken["result"]["errorCode"] == "VALIDATION_ERROR"
        assert fault["field"] in broken["result"]["error"]
        [other] = [job for job in jobs if job is not broken]
        assert other["status"] == "finished" and other["result"] == {"value": other["item"]["n"] * 2}
    assert result.returncode == 0, result


def doctor(url: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    """``serverless-worker doctor`` against ``url``; its report as ``{check name: line}``."""
    (tmp_path / "my_handlers.py").write_text(HANDLERS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SW_")}
    env["TEST_KEY"] = SECRET
    result = subprocess.run([str(CLI), "doctor", "--protocol", "pipelogiq", "--url", url, "--api-key-env",
                             "TEST_KEY", "--handler-module", "my_handlers.py"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    report = {line.split()[1]: line for line in result.stdout.splitlines()[1:]}
    return result, report


def test_doctor_names_an_older_pipelogiq_server_one_line_per_finding(sandbox: Callable[..., Any],
                                                                      tmp_path: Path) -> None:
    # given the older public release, with a job waiting
    server, admin = sandbox("pipelogiq", legacy=True)
    admin.seed({"handler": "double", "inputs": [{"n": 1}]})

    # when doctor checks it
    result, report = doctor(server.url, tmp_path)

    # then the key is accepted, and each missing part of the 0.5.0 protocol is its own failed
    # line; exit 2, as local's for the same server
    assert result.returncode == 2, result
    assert report["server"].split()[0] == "OK"
    assert report["lease"].split()[0] == "FAIL" and "answered 404" in report["lease"], report
    assert "no lease API" in report["lease"]
    assert report["long-poll"].split()[0] == "FAIL" and "ignores waitSeconds" in report["long-poll"], report
    # and it took nothing: the job was never delivered
    [job] = admin.jobs()
    assert [h["event"] for h in job["history"]] == ["execution_created"]


def test_doctor_finds_the_lease_api_and_the_long_poll_on_a_current_server(sandbox: Callable[..., Any],
                                                                          tmp_path: Path) -> None:
    server, _admin = sandbox("pipelogiq")

    result, report = doctor(server.url, tmp_path)

    assert result.returncode == 0, result
    assert report["lease"].split()[0] == "OK" and "answered 400" in report["lease"], report
    assert report["long-poll"].split()[0] == "OK", report


def test_an_older_server_whose_jobs_arrive_after_empty_pulls_still_ends_the_run_with_exit_2(
        sandbox: Callable[..., Any], tmp_path: Path) -> None:
    # given the older release with an empty queue, so the worker's first pulls go through
    server, admin = sandbox("pipelogiq", legacy=True)
    (tmp_path / "my_handlers.py").write_text(HANDLERS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SW_")}
    env["TEST_KEY"] = SECRET
    proc = subprocess.Popen(
        [str(CLI), "local", "--protocol", "pipelogiq", "--url", server.url, "--api-key-env", "TEST_KEY",
         "--handler-module", "my_handlers.py", "--handlers", "double", "--until-idle", "60"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: server.sandbox.calls["pull"] >= 1, 60, "the worker's first pull")

        # when jobs arrive
        admin.seed({"handler": "double", "inputs": [{"n": 1}, {"n": 2}]})
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()

    # then the run drains and ends with exit 2 and the line naming what the server lacks
    assert proc.returncode == 2, stdout + stderr
    said = " ".join(stdout.split())  # the console wraps long lines
    assert f"serverless-worker: error: the job server cannot be worked: {LEGACY_LINE}" in said, stdout + stderr
    # and the jobs are queued on the server again, never acknowledged away
    for job in admin.jobs():
        events = [h["event"] for h in job["history"]]
        assert "ack" not in events and events[-1] == "requeue", events
    assert admin.overview()["inFlight"] == 0
