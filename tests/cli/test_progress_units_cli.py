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


# Reports progress, then waits until the test lets it finish (a file appears).
GATED = '''
import os
import time

from serverless_worker import handler


@handler("gated")
def gated(job):
    job.progress({"step": 1, "of": 2})
    while not os.path.exists(os.environ["GATE"]):
        if job.wait(0.05):
            job.raise_if_cancelled()
    job.progress({"step": 2, "of": 2})
    return {"ok": True}
'''


def test_piped_output_shows_jobs_running_and_their_progress_while_they_run(tmp_path: Path) -> None:
    # given two jobs whose handler reports progress and then waits for the test's word
    server = SandboxServer(create_sandbox("claimqueue", tokens=[KEY])).start()
    admin = SandboxAdmin(server.url)
    handlers = tmp_path / "gated_handlers.py"
    handlers.write_text(GATED)
    gate = tmp_path / "gate"
    admin.seed({"queue": "gated", "items": [{"n": 1}, {"n": 2}]})
    env = {k: v for k, v in os.environ.items() if not k.startswith("SW_")} | {"TEST_KEY": KEY, "GATE": str(gate)}
    worker = subprocess.Popen(
        [str(CLI), "local", "--protocol", "claimqueue", "--url", server.url, "--api-key-env", "TEST_KEY",
         "--handler-module", str(handlers), "--until-idle", "1"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: list[str] = []
    try:
        # when its output (not a terminal) is read while both jobs are still running
        assert worker.stdout is not None
        for line in worker.stdout:
            seen.append(line.rstrip("\n"))
            running = any("running=2 " in said for said in seen)
            progressed = sum('progress {"step":1,"of":2}' in said for said in seen)
            if running and progressed == 2:
                break
        # then a plain status line counted them running, and each job's progress was logged
        # with its job id and handler
        assert any(re.search(r"^working: jobs taken=2 running=2 done=0 ", said) for said in seen), seen
        assert all(re.search(r"job \S+ gated: progress ", said) for said in seen if "progress {" in said), seen
        gate.write_text("go")
        rest, _ = worker.communicate(timeout=120)
    finally:
        worker.kill()
        admin.close()
        server.stop()
    out = "\n".join(seen) + rest
    assert worker.returncode == 0, out
    assert out.count('progress {"step":2,"of":2}') == 2, out
    assert re.search(r"^\w+: jobs taken=2 running=0 done=2 ", out, re.MULTILINE), out
