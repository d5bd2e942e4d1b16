"""CLI tier: a developer's loop. ``serverless-worker local`` works a server's jobs, the server
is re-created (a fresh development server hands out the ids of the last one again), and the
same command in the same directory works the new jobs: every one gets a definite outcome on
the new server, and the run says so only when it is so.

Also: a wholly other server in the same directory is noticed (one line, its ids new), and a
run that leaves a delivery without a definite outcome, or gets answers it cannot use, exits
1 and lists them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_local_cli import SANDBOX_KEYS as SANDBOX_KEYS  # the sandbox fixture reads it
from test_local_cli import SECRET, clean_env, local, row, seed, settled

from serverless_worker.sandbox.admin import SandboxAdmin, job_id

pytestmark = pytest.mark.cli

HANDLERS = '''
from serverless_worker import handler


@handler("double")
def double(job):
    return {"value": job.input["n"] * 2}
'''
# Each sandbox made to reuse its ids after a reset, as a re-created development server does
# (Pipelogiq numbers its stages from 1001 again; its execution ids are new UUIDs).
REUSING_IDS: dict[str, dict[str, Any]] = {
    "pipelogiq": {}, "priostack": {"sequential_keys": True}, "claimqueue": {"sequential_ids": True}}
JOBS = 40
DEFINITE = "none: every delivery has a definite outcome"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A directory of the developer's: the handler module, and the state file once a run made it."""
    (tmp_path / "my_handlers.py").write_text(HANDLERS)
    return tmp_path


def work(protocol: str, url: str, project: Path, idle: float = 4, **env: str) -> Any:
    # idle: longer than a claim-queue back-off after an empty claim (2 s)
    return local("--protocol", protocol, "--url", url, "--api-key-env", "TEST_KEY",
                 "--handler-module", str(project / "my_handlers.py"), "--handlers", "double",
                 "--concurrency", "4", "--until-idle", str(idle), env=clean_env(TEST_KEY=SECRET, **env),
                 cwd=project)


def seeded(admin: SandboxAdmin, protocol: str) -> list[str]:
    seed(admin, protocol, "double", [{"n": n} for n in range(JOBS)])
    return sorted(job_id(protocol, job) for job in admin.jobs())


def all_settled(protocol: str, admin: SandboxAdmin, out: str) -> None:
    jobs = admin.jobs()
    unsettled = [job_id(protocol, job) for job in jobs if not settled(protocol, job)]
    assert len(jobs) == JOBS and not unsettled, f"{len(unsettled)} not settled: {unsettled[:5]}\n{out}"


@pytest.mark.parametrize("protocol", list(REUSING_IDS))
def test_a_recreated_server_handing_out_the_same_ids_gets_every_job_worked(
        protocol: str, sandbox: Callable[..., Any], project: Path) -> None:
    # given a server whose 40 jobs a run worked, its ledger kept in the project's state file
    server, admin = sandbox(protocol, **REUSING_IDS[protocol])
    first_ids = seeded(admin, protocol)
    first = work(protocol, server.url, project)
    assert first.returncode == 0, f"stdout:\n{first.stdout}\nstderr:\n{first.stderr}"
    all_settled(protocol, admin, first.stdout)

    # when the server is re-created with 40 new jobs, under the ids of the last ones
    admin.reset()
    again_ids = seeded(admin, protocol)
    if protocol != "pipelogiq":
        assert again_ids == first_ids
    second = work(protocol, server.url, project)

    # then every new job got a definite outcome on the new server, and the run says so: exit 0
    out = second.stdout
    assert second.returncode == 0, f"stdout:\n{out}\nstderr:\n{second.stderr}"
    all_settled(protocol, admin, out)
    assert row(out, "taken") == JOBS and row(out, "done") == JOBS
    assert row(out, "still in flight") == 0 and DEFINITE in out
    assert "another server" not in out  # the same URL: the file cannot tell, the ledger rule did it


def test_a_wholly_other_server_in_the_same_directory_is_named_and_its_ids_are_new(
        sandbox: Callable[..., Any], project: Path) -> None:
    # given a directory whose state file served one Priostack server
    old, old_admin = sandbox("priostack", sequential_keys=True)
    first_ids = seeded(old_admin, "priostack")
    assert work("priostack", old.url, project).returncode == 0

    # when the same command points at another server handing out the same keys
    new, new_admin = sandbox("priostack", sequential_keys=True)
    assert seeded(new_admin, "priostack") == first_ids
    result = work("priostack", new.url, project)

    # then one line names the old server, and every job of the new one is worked
    out = result.stdout
    assert result.returncode == 0, f"stdout:\n{out}\nstderr:\n{result.stderr}"
    lines = [line for line in out.splitlines() if "this is another server" in line]
    assert len(lines) == 1 and f"priostack server at {old.url}" in lines[0]
    assert f"{JOBS} settled deliveries are forgotten" in lines[0]
    all_settled("priostack", new_admin, out)


def test_a_report_the_server_never_confirms_exits_1_listing_the_job(
        sandbox: Callable[..., Any], project: Path) -> None:
    # given a server that answers every complete with 503
    server, admin = sandbox("priostack")
    [key] = admin.seed({"jobs": [{"type": "double", "variables": {"n": 1}, "retries": 3}]})
    admin.faults([{"kind": "error_5xx", "endpoint": "complete"}])

    # when the worker runs until idle
    result = work("priostack", server.url, project, SW_DRAIN_GRACE_SECONDS="2")

    # then the run ends 1, listing the job and why; it does not claim a definite outcome
    out = result.stdout
    assert result.returncode == 1, f"stdout:\n{out}\nstderr:\n{result.stderr}"
    assert DEFINITE not in out
    assert f"{key}  outcome stored, report not confirmed" in out
    assert "1 delivery left without a definite outcome on the server" in out
    assert [job["state"] for job in admin.jobs()] == ["active"]


def test_answers_the_worker_cannot_use_exit_1_though_every_job_is_done(
        sandbox: Callable[..., Any], project: Path) -> None:
    # given a server whose first two activations answer 200 with a body that is no activation
    server, admin = sandbox("priostack")
    admin.seed({"jobs": [{"type": "double", "variables": {"n": n}, "retries": 3} for n in range(3)]})
    admin.faults([{"kind": "error_5xx", "endpoint": "activate", "status": 200, "count": 2}])

    # when the worker runs until idle (longer than the two back-offs of 2 s after an unusable pull)
    result = work("priostack", server.url, project, idle=8)

    # then every job is done, yet the run ends 1 and lists the unusable answers
    out = result.stdout
    assert result.returncode == 1, f"stdout:\n{out}\nstderr:\n{result.stderr}"
    all_jobs = admin.jobs()
    assert [job["state"] for job in all_jobs] == ["completed"] * 3
    assert "answers from the server the worker could not use (2):" in out
    assert "the server sent 2 answers the worker could not use" in out
    assert SECRET not in out and SECRET not in result.stderr
