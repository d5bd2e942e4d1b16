"""CLI tier: ``serverless-worker local`` against servers that hand out one bad delivery.

One job, one fate, whatever else is in its batch: a job the ledger cannot hold (variables
nested past the serialisation depth, 1 MiB of them, a key with a lone surrogate) gets its
definite outcome, or is named as left without one, and the jobs pulled with it run; a
lease granted already past (a claim-queue ``lease.until``, a Pipelogiq ``leaseExpiresAt``)
never runs the handler and never stops the run as a configuration error.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from support.poison import incompressible, nested

pytestmark = pytest.mark.cli

CLI = Path(sys.executable).with_name("serverless-worker")
SECRET = "k3y-that-must-never-be-printed-7f3a"
SANDBOX_KEYS: dict[str, dict[str, Any]] = {
    "pipelogiq": {"api_keys": {SECRET: 12}},
    "priostack": {"api_keys": [SECRET]},
    "claimqueue": {"tokens": [SECRET]},
}

HANDLERS = '''
from serverless_worker import handler


@handler("work", timeout=10)
def work(job):
    return {"n": job.input.get("n")}
'''


@pytest.fixture
def handler_file(tmp_path: Path) -> Path:
    path = tmp_path / "poison_handlers.py"
    path.write_text(HANDLERS)
    return path


def local(protocol: str, url: str, handler_file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SW_")}
    env["TEST_KEY"] = SECRET
    return subprocess.run([str(CLI), "local", "--protocol", protocol, "--url", url, "--api-key-env", "TEST_KEY",
                           "--handler-module", str(handler_file), "--handlers", "work", "--concurrency", "8",
                           "--until-idle", "4", *args],
                          cwd=handler_file.parent, env=env, capture_output=True, text=True, timeout=120)


def row(output: str, label: str) -> int:
    match = re.search(rf"^\s*{re.escape(label)}\s+(\d+)\b", output, re.MULTILINE)
    assert match, f"no {label!r} row in:\n{output}"
    return int(match.group(1))



def test_poisoned_priostack_jobs_fail_with_their_reason_and_the_rest_of_the_batch_completes(
        sandbox: Callable[..., Any], handler_file: Path) -> None:
    # given six jobs activated in one batch: two poisoned (nested 300 deep, 1 MiB of variables)
    server, admin = sandbox("priostack")
    blob = incompressible(1 << 20)  # 1 MiB of text
    keys = admin.seed({"jobs": [{"type": "work", "variables": {"n": 0}, "retries": 3},
                                {"type": "work", "variables": nested(300), "retries": 3},
                                {"type": "work", "variables": {"n": 2}, "retries": 3},
                                {"type": "work", "variables": {"blob": blob}, "retries": 3},
                                {"type": "work", "variables": {"n": 4}, "retries": 3},
                                {"type": "work", "variables": {"n": 5}, "retries": 3}]})

    result = local("priostack", server.url, handler_file)

    # then the four good jobs completed; each poisoned one failed with retries 0 and its reason
    out = result.stdout + result.stderr
    jobs = {job["key"]: job for job in admin.jobs()}
    assert [jobs[key]["state"] for key in keys] == ["completed", "incident", "completed", "incident",
                                                    "completed", "completed"], out
    deep, big = jobs[keys[1]], jobs[keys[3]]
    assert deep["retries_history"][-1] == 0 and big["retries_history"][-1] == 0
    assert deep["error_message"].startswith("VALIDATION_ERROR: the worker cannot record this job")
    assert "nests too deep" in deep["error_message"], deep["error_message"]
    assert "item limit" in big["error_message"], big["error_message"]
    assert [call["action"] for call in deep["calls"]] == ["fail"]  # once: never run, never retried
    # and every delivery has its outcome, so the run ends 0 with nothing left in flight
    assert result.returncode == 0, out
    assert row(result.stdout, "handler runs") == 4 and row(result.stdout, "still in flight") == 0
    assert SECRET not in out


def test_a_job_key_no_request_can_name_is_reported_unsettled_and_the_run_ends_nonzero(
        sandbox: Callable[..., Any], handler_file: Path) -> None:
    # given five jobs, one keyed with a lone surrogate ("\ud800" in the JSON)
    server, admin = sandbox("priostack")
    admin.seed({"jobs": [{"type": "work", "variables": {"n": n}, "retries": 3} for n in range(2)]
                + [{"type": "work", "key": "\ud800", "retries": 3}]
                + [{"type": "work", "variables": {"n": n}, "retries": 3} for n in range(3, 5)]})

    result = local("priostack", server.url, handler_file)

    # then the four others completed, and the run says the fifth was left without an outcome
    out = result.stdout + result.stderr
    states = sorted(job["state"] for job in admin.jobs())
    assert states == ["active", "completed", "completed", "completed", "completed"], out
    assert result.returncode == 1, out
    said = " ".join(result.stdout.split())  # the summary wraps long lines
    assert "without a definite outcome on the server (1)" in said, result.stdout
    assert "\\ud800" in said and "not valid Unicode" in said, result.stdout
    assert "no request can name it" in said, result.stdout
    assert "1 delivery left without a definite outcome" in said


def test_a_claim_queue_item_granted_a_lease_already_past_lapses_and_the_others_run(
        sandbox: Callable[..., Any], handler_file: Path) -> None:
    # given five items, the first claim granting a lease whose until is already past
    server, admin = sandbox("claimqueue", lease_seconds=30)
    ids = admin.seed({"queue": "work", "items": [{"n": n} for n in range(5)]})
    admin.faults([{"kind": "expired_lease", "endpoint": "claim", "count": 1}])

    result = local("claimqueue", server.url, handler_file)

    # then the run is no configuration error: that item was not run under its lapsed lease,
    # was claimed again with a live one, and every item finished, each handler run once
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "configuration refused" not in out and "cannot fit" not in out
    assert admin.stats()["faults_fired"] == 1
    jobs = {job["id"]: job for job in admin.jobs()}
    assert all(jobs[i]["status"] == "finished" for i in ids), jobs
    assert jobs[ids[0]]["attempts"] == 2 and all(jobs[i]["attempts"] == 1 for i in ids[1:]), jobs
    assert row(result.stdout, "handler runs") == 5
    assert "lease granted already expired" in out


def test_a_pipelogiq_lease_granted_already_expired_never_runs_the_handler(
        sandbox: Callable[..., Any], handler_file: Path) -> None:
    # given three stages, the first lease acquired granted with leaseExpiresAt already past
    server, admin = sandbox("pipelogiq", lease_seconds=30, poll_interval=0.05)
    admin.seed({"handler": "work", "inputs": [{"n": n} for n in range(3)]})
    admin.faults([{"kind": "expired_lease", "endpoint": "lease.acquire", "count": 1}])

    result = local("pipelogiq", server.url, handler_file)

    # then the handler never ran under it: that execution got no result, the server's lease
    # recovery made a new one, which ran; every stage completed with one run each
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert admin.stats()["faults_fired"] == 1
    jobs = admin.jobs()
    assert all(job["status"] == "Completed" for job in jobs), jobs
    recovered = [job for job in jobs if len(job["executions"]) == 2]
    assert len(recovered) == 1, jobs
    first, second = recovered[0]["executions"]
    assert not first["resultApplied"] and second["cause"] == "recovery" and second["resultApplied"]
    assert not [h for h in recovered[0]["history"]
                if h["event"].startswith("result") and h.get("executionId") == first["executionId"]]
    assert row(result.stdout, "handler runs") == 3
    assert "lease granted already expired" in out
