"""CLI tier: ``serverless-worker sandbox jobs`` reads a job's result from a running sandbox.

A worker run against a sandbox reports results the summary only counts; this command is
how a user reads them (the README's "Your first handler" uses it): one line per job on
every sandbox, the whole result with a job id, and one line with exit 2 when there is
no sandbox to read.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_local_cli import CLI, SECRET, clean_env, local, seed
from test_local_cli import SANDBOX_KEYS as SANDBOX_KEYS  # the sandbox fixture reads it

from serverless_worker.sandbox.admin import job_id

pytestmark = pytest.mark.cli

HANDLERS = '''
from serverless_worker import BusinessError, handler


@handler("double")
def double(job):
    if job.input["n"] < 0:
        raise BusinessError("NEGATIVE", "n must not be negative", {"given": job.input["n"]})
    if job.input["n"] == 0:
        raise ValueError("zero cannot be doubled\\nsee the handler's docs")
    job.log(f"doubling {job.input['n']}")
    return {"value": job.input["n"] * 2, "note": "x" * 300}
'''


def jobs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CLI), "sandbox", "jobs", *args], capture_output=True, text=True, timeout=30,
                          env=clean_env())


@pytest.mark.parametrize("protocol", ["pipelogiq", "priostack", "claimqueue"])
def test_a_jobs_result_is_read_with_sandbox_jobs(protocol: str, sandbox: Callable[..., Any],
                                                 tmp_path: Path) -> None:
    # given a sandbox whose three jobs a worker has worked: one doubled, one refused, one that
    # raised (Priostack retries it until its retries run out; the others take its error at once)
    server, admin = sandbox(protocol)
    seed(admin, protocol, "double", [{"n": 21}, {"n": -1}, {"n": 0}])
    (tmp_path / "handlers.py").write_text(HANDLERS)
    worked = local("--protocol", protocol, "--url", server.url, "--api-key-env", "TEST_KEY",
                   "--handler-module", "handlers.py", "--until-idle", "1", env=clean_env(TEST_KEY=SECRET),
                   cwd=tmp_path)
    assert worked.returncode == 0, worked.stdout + worked.stderr
    # (the handler's job.log line was shown with its job id)
    ids = [job_id(protocol, job) for job in admin.jobs()]
    assert any(f"job {i} double: doubling 21" in worked.stderr for i in ids), worked.stderr

    # when the user lists the sandbox's jobs
    listed = jobs("--url", server.url)

    # then one line per job: id, handler, state on the server, the result (clipped), the
    # error's code and message, and the attempts
    assert listed.returncode == 0, listed
    lines = listed.stdout.splitlines()
    assert len(lines) == 3, listed.stdout
    doubled = next(line for line in lines if '"value": 42' in line)
    assert re.match(r"^\S+  double  (completed|finished)  result \{.*\.\.\.  \(1 attempt\)$", doubled), doubled
    refused = next(line for line in lines if "NEGATIVE" in line)
    assert "error NEGATIVE: n must not be negative" in refused, refused
    # and with the job's id, the whole result
    doubled_id = doubled.split()[0]
    one = jobs("--url", server.url, doubled_id)
    assert one.returncode == 0, one
    assert one.stdout.startswith(f"{doubled_id}  double  ") and "  attempts  1\n" in one.stdout, one.stdout
    assert '"note": "' + "x" * 300 + '"' in one.stdout
    # a business error's code, whole message and details
    rejected = jobs("--url", server.url, refused.split()[0]).stdout
    assert "  error     NEGATIVE: n must not be negative\n" in rejected, rejected
    assert '  details   {"given": -1}' in rejected, rejected
    # an exception's type once, its message whole (every line), and every attempt counted
    raised_id = next(line for line in lines if "ValueError" in line).split()[0]
    raised = jobs("--url", server.url, raised_id).stdout
    assert "  error     ValueError: zero cannot be doubled\n            see the handler's docs\n" in raised, raised
    assert "ValueError: ValueError" not in raised
    assert f"  attempts  {3 if protocol == 'priostack' else 1}\n" in raised, raised
    # --json gives the admin API's record
    raw = jobs("--url", server.url, doubled_id, "--json")
    assert job_id(protocol, json.loads(raw.stdout)[0]) == doubled_id


def test_no_sandbox_or_no_such_job_is_one_line_and_exit_2(sandbox: Callable[..., Any]) -> None:
    # given a port where nothing listens, and a sandbox without the job asked for
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    server, _ = sandbox("claimqueue")

    nothing = jobs("--url", closed)
    missing = jobs("--url", server.url, "no-such-job")

    # then each says why in one line, exit 2, no traceback
    assert nothing.returncode == 2 and missing.returncode == 2
    assert nothing.stderr.count("\n") == 1 and f"at {closed} (--url): nothing answers there" in nothing.stderr
    assert "no job no-such-job on the sandbox" in missing.stderr and "Traceback" not in missing.stderr
