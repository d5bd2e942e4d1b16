"""CLI tier: ``serverless-worker local`` run as a real subprocess.

The demo (its own sandbox, the example handlers, the real state machine) must finish by
itself with every job settled; pointed at a sandbox this test starts, with faults on and
a handler module written here, it must settle every job; SIGTERM must drain, leaving
nothing held on the server; a bad setting must exit 2 naming it; and the API key must
never reach the output.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from serverless_worker.sandbox.admin import SandboxAdmin
from serverless_worker.settings import Settings
from support.waiting import wait_for

pytestmark = pytest.mark.cli

PROTOCOLS = ("pipelogiq", "priostack", "claimqueue")
CLI = Path(sys.executable).with_name("serverless-worker")
ROOT = Path(__file__).resolve().parents[2]
SECRET = "k3y-that-must-never-be-printed-7f3a"

# Each sandbox accepting only SECRET.
SANDBOX_KEYS: dict[str, dict[str, Any]] = {
    "pipelogiq": {"api_keys": {SECRET: 12}},
    "priostack": {"api_keys": [SECRET]},
    "claimqueue": {"tokens": [SECRET]},
}
# Faults on the calls a worker makes per job: 5xx, 429 and lost answers (the effect applied).
FAULTS: dict[str, list[dict[str, Any]]] = {
    "pipelogiq": [{"kind": "error_5xx", "endpoint": "result", "probability": 0.3},
                  {"kind": "rate_limit", "endpoint": "pull", "probability": 0.2, "retry_after": 0.1},
                  {"kind": "drop_response", "endpoint": "ack", "probability": 0.3},
                  {"kind": "drop_response", "endpoint": "result", "probability": 0.2}],
    "priostack": [{"kind": "error_5xx", "endpoint": "complete", "probability": 0.3},
                  {"kind": "rate_limit", "endpoint": "activate", "probability": 0.2, "retry_after": 0.1},
                  {"kind": "drop_response", "endpoint": "complete", "probability": 0.3}],
    "claimqueue": [{"kind": "error_5xx", "endpoint": "result", "probability": 0.3},
                   {"kind": "rate_limit", "endpoint": "claim", "probability": 0.1, "retry_after": 0.1},
                   {"kind": "drop_response", "endpoint": "result", "probability": 0.3}],
}

HANDLERS = '''
from serverless_worker import handler


@handler("double")
def double(job):
    return {"value": job.input["n"] * 2}


@handler("nap")
def nap(job):
    if job.wait(job.input["seconds"]):
        job.raise_if_cancelled()
    return {"slept": job.input["seconds"]}
'''


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any SW_* setting, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SW_")}
    env.update(extra)
    return env


def local(*args: str, env: dict[str, str] | None = None, timeout: float = 120,
          cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """The command in ``cwd``: a worker for a server keeps its state file there
    (``.serverless-worker/state.sqlite3``), so those runs get a directory of their own."""
    return subprocess.run([str(CLI), "local", *args], cwd=cwd, env=env or clean_env(), capture_output=True,
                          text=True, timeout=timeout)


def seed(admin: SandboxAdmin, protocol: str, handler: str, inputs: list[dict[str, Any]]) -> None:
    if protocol == "pipelogiq":
        admin.seed({"handler": handler, "inputs": inputs})
    elif protocol == "priostack":
        admin.seed({"jobs": [{"type": handler, "variables": v, "retries": 3} for v in inputs]})
    else:
        admin.seed({"queue": handler, "items": inputs})


def row(output: str, label: str) -> int:
    """The number in a summary row such as ``  taken   7   ...``."""
    match = re.search(rf"^\s*{re.escape(label)}\s+(\d+)\b", output, re.MULTILINE)
    assert match, f"no {label!r} row in:\n{output}"
    return int(match.group(1))


def settled(protocol: str, job: dict[str, Any]) -> bool:
    """The job's final state on the server: a result is in (or, for Priostack, an incident)."""
    if protocol == "pipelogiq":
        return job["status"] in ("Completed", "Failed")
    if protocol == "priostack":
        return job["state"] in ("completed", "incident")
    return job["status"] in ("finished", "failed")


def held(protocol: str, job: dict[str, Any]) -> bool:
    """A worker still holds the job: leased, active, or being processed."""
    if protocol == "pipelogiq":
        return job["status"] == "Running" or any(e["lease"] for e in job["executions"] if e["current"])
    if protocol == "priostack":
        return job["state"] == "active"
    return job["status"] == "processing"



@pytest.fixture
def handler_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_handlers.py"
    path.write_text(HANDLERS)
    return path


# -- the demo ---------------------------------------------------------------------------------

@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_demo_finishes_by_itself_with_every_job_settled(protocol: str) -> None:
    # given the built-in demo: its own sandbox, the example handlers, the real state machine
    # when it runs with no other argument than the protocol
    result = local("--protocol", protocol)

    # then it ends by itself, exit 0, with the summary: every demo job taken and settled
    out = result.stdout
    assert result.returncode == 0, f"stdout:\n{out}\nstderr:\n{result.stderr}"
    assert f"{protocol} sandbox (built in)" in out
    # its state dies with its sandbox: a temporary file; the long-running report needs moto
    assert "state: SQLite a temporary file · the real state machine in embedded Step Functions" in out
    assert row(out, "taken") == 7
    assert row(out, "done") == 5                    # echo x2, a charge, the nap, the 3-page report
    assert row(out, "failed") == 2                  # the declined card and the bad input
    assert "bad input 1, business rejection 1" in out
    assert row(out, "still in flight") == 0
    assert row(out, "handler runs") == 8            # the report ran as 3 continuation slices
    assert "created → handler start" in out and "sandbox admin history (7)" in out
    # the two failures are listed, job id, handler, code and message, each labelled as the
    # demo's deliberate one
    assert "all on purpose (the demo's), listed below" in out
    declined = re.search(r"^\s+(\S+)\s+payment-processor\s+CARD_DECLINED: the card was declined\s+"
                         r"\[the demo's declined card, on purpose\]", out, re.MULTILINE)
    invalid = re.search(r"^\s+(\S+)\s+payment-processor\s+VALIDATION_ERROR: payload does not match Payment",
                        out, re.MULTILINE)
    assert declined and invalid, out
    assert "[the demo's invalid payment, on purpose]" in out
    # the handler's job.log line is shown by default, with its job's id
    assert re.search(r"INFO serverless_worker.job: job \S+ payment-processor: charged 25.00 EUR for order "
                     r"A-1001$", result.stderr, re.MULTILINE), result.stderr
    # the benchmark tables wait for --stats
    assert "HTTP calls per job" not in out and "state store" not in out


def test_stats_adds_the_http_call_and_state_store_tables() -> None:
    # given the demo, asked for its statistics
    result = local("--protocol", "claimqueue", "--stats")

    # then the summary ends with the calls per endpoint (client, per job, sandbox) and the store's
    assert result.returncode == 0, result
    out = result.stdout
    assert "HTTP calls per job, by endpoint" in out
    assert re.search(r"^\s*total\s+\d+\s+\d+\.\d\d\s+\d+", out, re.MULTILINE)  # client, per job, sandbox
    assert re.search(r"state store \(SQLite file\): \d+\.\d reads and \d+\.\d writes per job", out)


def test_json_prints_the_summary_alone_on_stdout() -> None:
    # given the demo, asked for its summary as JSON
    result = local("--protocol", "priostack", "--json")

    # then stdout is one JSON document: the counts, each failure's code and whole message,
    # each result, the exit status; the banner and the status lines went to stderr
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["taken"], summary["done"], summary["failed_total"]) == (7, 5, 2)
    assert (summary["exit_status"], summary["verdict"], summary["definite"]) == (0, None, True)
    declined = next(job for job in summary["failed_jobs"] if job["code"] == "CARD_DECLINED")
    assert declined["message"] == "the card was declined" and declined["deliberate"]
    assert {"job_id", "handler", "result"} <= set(summary["done_jobs"][0])
    assert summary["latency_seconds"]["created_to_result_reported"]["n"] == 7
    assert "priostack sandbox (built in)" in result.stderr


def test_a_log_level_given_rules_job_lines_too(tmp_path: Path) -> None:
    # given the demo with the log level set to WARNING explicitly
    result = local("--protocol", "pipelogiq", "--log-level", "WARNING", "--handlers", "payment-processor")

    # then the job.log lines stay hidden, the warnings (with their job id) still show
    assert result.returncode == 0, result
    assert "charged 25.00 EUR" not in result.stderr
    assert re.search(r"WARNING serverless_worker.handler_runner: job \S+ payment-processor: bad input",
                     result.stderr), result.stderr


# -- a worker for a real server ------------------------------------------------------------------

@pytest.mark.parametrize(("protocol", "extra"), [
    ("pipelogiq", []), ("priostack", []), ("claimqueue", []), ("claimqueue", ["--transport", "socket"]),
], ids=["pipelogiq", "priostack", "claimqueue", "claimqueue-socket"])
def test_url_worker_settles_every_job_through_faults(protocol: str, extra: list[str],
                                                     sandbox: Callable[..., Any], handler_file: Path) -> None:
    # given a separately started sandbox with 12 jobs and faults on its hot endpoints
    server, admin = sandbox(protocol)
    seed(admin, protocol, "double", [{"n": n} for n in range(12)])
    admin.faults(FAULTS[protocol], seed=7)

    # when the local worker runs against it with the test's handler module
    result = local("--protocol", protocol, "--url", server.url, "--api-key-env", "TEST_KEY",
                   "--handler-module", str(handler_file), "--handlers", "double", "--concurrency", "4",
                   # idle: longer than a few claim-queue back-offs (2 s after an empty or 429 claim)
                   # and than the runner's back-off after failed ticks (at most 10 s)
                   "--until-idle", "12", *extra, env=clean_env(TEST_KEY=SECRET), cwd=handler_file.parent)

    # then every job reached its final state on the server, and the run says so with exit 0
    out = result.stdout
    assert result.returncode == 0, f"stdout:\n{out}\nstderr:\n{result.stderr}"
    jobs = admin.jobs()
    unsettled = [job for job in jobs if not settled(protocol, job)]
    assert len(jobs) == 12 and not unsettled, f"{unsettled}\nstdout:\n{out}\nstderr:\n{result.stderr}"
    assert row(out, "done") == 12 and row(out, "still in flight") == 0
    assert f"{protocol} server at {server.url}" in out
    assert ("socket transport" in out) == bool(extra)
    # and its state is the SQLite file under the working directory, named in the banner
    state = handler_file.parent / ".serverless-worker" / "state.sqlite3"
    assert state.is_file() and f"state: SQLite {state.relative_to(handler_file.parent)}" in out
    assert "no long-running handler, no state machine" in out
    assert "pull time (" in out or "Delivery.created_at (" in out  # not our sandbox: no admin history
    assert admin.stats()["faults_fired"] > 0
    # and the key never reached the output
    assert SECRET not in out and SECRET not in result.stderr


# -- draining on SIGTERM ---------------------------------------------------------------------------

@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_sigterm_drains_leaving_nothing_held(protocol: str, sandbox: Callable[..., Any],
                                             handler_file: Path) -> None:
    # given more one-second naps than the worker runs at once
    server, admin = sandbox(protocol)
    seed(admin, protocol, "nap", [{"seconds": 1.0}] * 12)
    proc = subprocess.Popen(
        [str(CLI), "local", "--protocol", protocol, "--url", server.url, "--api-key-env", "TEST_KEY",
         "--handler-module", str(handler_file), "--handlers", "nap", "--concurrency", "3"],
        cwd=handler_file.parent, env=clean_env(TEST_KEY=SECRET), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        # when SIGTERM arrives while jobs run
        wait_for(lambda: proc.poll() is not None or any(held(protocol, job) for job in admin.jobs()),
                 90, "a job to start", interval=0.1)
        assert proc.poll() is None, "the worker exited before any job started"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    # then it drained: exit 0, the summary printed, nothing left in flight
    assert proc.returncode == 0, f"stdout:\n{out}\nstderr:\n{err}"
    assert "draining (SIGTERM)" in out
    assert row(out, "still in flight") == 0
    # and on the server every job is finished or back in the queue; none is held by the worker
    jobs = admin.jobs()
    assert not [job for job in jobs if held(protocol, job)], jobs
    if protocol == "pipelogiq":  # no delivery outstanding either (pulled, never acknowledged)
        assert admin.overview()["inFlight"] == 0
    finished = [job for job in jobs if settled(protocol, job)]
    assert 0 < len(finished) < 12            # it stopped mid-run, yet everything it took is settled
    assert row(out, "done") == len(finished)
    assert SECRET not in out and SECRET not in err


# -- configuration -------------------------------------------------------------------------------

def test_bad_settings_exit_2_naming_each_setting() -> None:
    # given a bad flag, a bad environment variable and two settings that do not go together
    env = clean_env(SW_MAX_IN_FLIGHT="lots")

    # when the worker starts
    result = local("--batch-size", "0", "--protocol", "priostack", "--transport", "socket", env=env,
                   timeout=30)

    # then it exits 2 before starting anything, naming each setting by variable and flag
    assert result.returncode == 2, result
    err = result.stderr
    assert "SW_BATCH_SIZE (--batch-size)" in err
    assert "SW_MAX_IN_FLIGHT (--max-in-flight)" in err
    assert "SW_TRANSPORT (--transport)" in err
    assert result.stdout == ""


def test_url_without_a_key_is_a_configuration_error() -> None:
    result = local("--url", "https://jobs.example.com", "--api-key-env", "NOT_SET_ANYWHERE", timeout=30)

    assert result.returncode == 2
    assert "--api-key-env NOT_SET_ANYWHERE" in result.stderr


def test_a_rejected_key_stops_the_worker_with_exit_2(sandbox: Callable[..., Any], handler_file: Path) -> None:
    # given a server that does not accept the key
    server, _ = sandbox("priostack")

    # when the worker runs with another key
    result = local("--protocol", "priostack", "--url", server.url, "--api-key-env", "TEST_KEY",
                   "--handler-module", str(handler_file), env=clean_env(TEST_KEY="wrong-key"),
                   cwd=handler_file.parent)

    # then it stops at once and says the credential was refused (tests/cli/test_first_contact_cli.py
    # holds every protocol to the one line and the calls it may make)
    assert result.returncode == 2, result
    assert "refused the credential" in result.stderr
    assert "wrong-key" not in result.stdout + result.stderr


def test_config_markdown_lists_every_setting() -> None:
    result = subprocess.run([str(CLI), "config", "--markdown"], cwd=ROOT, env=clean_env(),
                            capture_output=True, text=True, timeout=30)

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("| setting | environment variable | local flag | template parameter |")
    for name in Settings.model_fields:
        assert any(line.startswith(f"| `{name}` | `SW_{name.upper()}` |") for line in lines), name
    batch = next(line for line in lines if line.startswith("| `batch_size`"))
    assert "`--batch-size`" in batch and "`BatchSize`" in batch and "`10`" in batch
    assert "`StateTable` (resource)" in next(line for line in lines if line.startswith("| `table_name`"))


# -- a handler that can never fit --------------------------------------------------------------------

UNFIT_HANDLERS = '''
from serverless_worker import handler


@handler("resize", timeout=30)
def resize(job):
    return {"ok": True}
'''


def test_a_timeout_longer_than_the_lease_stops_the_run_with_exit_2(sandbox: Callable[..., Any],
                                                                   tmp_path: Path) -> None:
    # given a claim queue whose lease is 20 s and a handler declared with timeout=30
    server, admin = sandbox("claimqueue", lease_seconds=20)
    seed(admin, "claimqueue", "resize", [{"n": n} for n in range(3)])
    module = tmp_path / "unfit_handlers.py"
    module.write_text(UNFIT_HANDLERS)

    # when the local worker runs until idle
    result = local("--protocol", "claimqueue", "--url", server.url, "--api-key-env", "TEST_KEY",
                   "--handler-module", str(module), "--until-idle", "3", env=clean_env(TEST_KEY=SECRET),
                   cwd=tmp_path)

    # then it stops as a configuration error, naming the handler, its timeout and the lease,
    # in one error line, and nothing ran
    out = result.stdout + result.stderr
    assert result.returncode == 2, out
    errors = [line for line in out.splitlines() if " ERROR " in line and "resize" in line]
    assert len(errors) == 1, out
    assert "timeout=30s" in errors[0] and "lease" in errors[0] and "20s" in errors[0], errors
    assert "configuration refused" in result.stdout
    assert row(result.stdout, "handler runs") == 0
    # every item it took was claimed once: the worker stopped pulling for the handler
    assert all(job["attempts"] <= 1 for job in admin.jobs()), admin.jobs()


OPT_IN_HANDLERS = '''
from serverless_worker import handler


@handler("resize", timeout=30, run_past_lease=True)
def resize(job):
    return {"ok": True}
'''


def test_run_past_lease_lets_a_claim_queue_handler_run_for_its_whole_timeout(sandbox: Callable[..., Any],
                                                                             tmp_path: Path) -> None:
    # given the same lease and timeout, with the documented opt-in (the queue accepts a late result)
    server, admin = sandbox("claimqueue", lease_seconds=20)
    seed(admin, "claimqueue", "resize", [{"n": n} for n in range(3)])
    module = tmp_path / "late_handlers.py"
    module.write_text(OPT_IN_HANDLERS)

    result = local("--protocol", "claimqueue", "--url", server.url, "--api-key-env", "TEST_KEY",
                   "--handler-module", str(module), "--until-idle", "3", env=clean_env(TEST_KEY=SECRET),
                   cwd=tmp_path)

    # then every item ran and finished with its result
    assert result.returncode == 0, result.stdout + result.stderr
    assert row(result.stdout, "handler runs") == 3
    assert all(job["status"] == "finished" for job in admin.jobs()), admin.jobs()


def test_a_second_worker_on_the_same_state_file_is_told_state_and_instance_id(sandbox: Callable[..., Any],
                                                                             handler_file: Path) -> None:
    # given a worker running against a server with the default state file of its directory
    server, admin = sandbox("claimqueue")
    args = ["--protocol", "claimqueue", "--url", server.url, "--api-key-env", "TEST_KEY",
            "--handler-module", str(handler_file), "--handlers", "double"]
    first = subprocess.Popen([str(CLI), "local", *args], cwd=handler_file.parent, env=clean_env(TEST_KEY=SECRET),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: admin.stats()["calls"].get("claim", 0) > 0, timeout=60, what="the first worker's claim")

        # when a second one starts in the same directory
        second = local(*args, "--until-idle", "1", env=clean_env(TEST_KEY=SECRET), cwd=handler_file.parent,
                       timeout=60)
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=60)

    # then it exits 2 in one line: a second worker needs its own file and its own instance id
    assert second.returncode == 2, second
    err = second.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert "in use by another serverless-worker local" in err
    assert "--state PATH --instance-id ID" in err
