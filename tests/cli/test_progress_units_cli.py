"""CLI tier: the live status line of ``serverless-worker local`` and its summary count the
same unit, jobs: a job that failed once and succeeded on its retry is one job taken and
done, on the status line as in the summary, though the server delivered it twice.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from serverless_worker.sandbox import create_sandbox
from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin

pytestmark = pytest.mark.cli

CLI = Path(sys.executable).with_name("serverless-worker")
KEY = "progress-units-k3y"

# Fails on a job's first delivery (3 retries left), succeeds on its retry.
HANDLERS = '''
from serverless_worker import handler


@handler("flaky")
def flaky(job):
    if job.retries_left == 3:
        raise RuntimeError("first delivery fails")
    return {"ok": True}
'''


def row(output: str, label: str) -> int:
    match = re.search(rf"^\s*{re.escape(label)}\s+(\d+)\b", output, re.MULTILINE)
    assert match, f"no {label!r} row in:\n{output}"
    return int(match.group(1))


def test_the_status_line_and_the_summary_count_jobs_not_deliveries(tmp_path: Path) -> None:
    # given four Priostack jobs whose first delivery fails and whose retry succeeds
    server = SandboxServer(create_sandbox("priostack", api_keys=[KEY])).start()
    admin = SandboxAdmin(server.url)
    handlers = tmp_path / "flaky_handlers.py"
    handlers.write_text(HANDLERS)
    try:
        admin.seed({"jobs": [{"type": "flaky", "variables": {"n": n}, "retries": 3} for n in range(4)]})

        # when the local worker runs until idle (not a terminal: plain status lines)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SW_")} | {"TEST_KEY": KEY}
        result = subprocess.run(
            [str(CLI), "local", "--protocol", "priostack", "--url", server.url, "--api-key-env", "TEST_KEY",
             "--handler-module", str(handlers), "--concurrency", "2", "--until-idle", "4"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        jobs = admin.jobs()
    finally:
        admin.close()
        server.stop()

    # then the server saw each job delivered twice and completed
    out = result.stdout
    assert result.returncode == 0, f"stdout:\n{out}\nstderr:\n{result.stderr}"
    assert [job["state"] for job in jobs] == ["completed"] * 4
    # and the summary counts four jobs, all done, with the four extra deliveries as retries
    assert (row(out, "taken"), row(out, "done"), row(out, "failed"), row(out, "retried")) == (4, 4, 0, 4)
    # and the last status line says the same: four jobs taken, four done, none failed
    lines = re.findall(r"^\w+: jobs taken=(\d+) running=(\d+) done=(\d+) failed=(\d+) handed_back=(\d+)$",
                       out, re.MULTILINE)
    assert lines, out
    assert tuple(map(int, lines[-1])) == (4, 0, 4, 0, 0), lines
    # and no status line ever counted more jobs than there are
    assert max(int(line[0]) for line in lines) == 4
