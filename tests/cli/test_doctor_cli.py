"""CLI tier: ``serverless-worker doctor`` against real sandboxes, as a subprocess.

It must pass a good setup, fail a refused credential or an unreachable server on the
check that names it, take no job while checking, and (Pipelogiq ``--smoke``) work a
two-stage pipeline whose first stage is retried once, as the server's smoke script does.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from serverless_worker.sandbox.admin import SandboxAdmin

pytestmark = pytest.mark.cli

PROTOCOLS = ("pipelogiq", "priostack", "claimqueue")
CLI = Path(sys.executable).with_name("serverless-worker")
ROOT = Path(__file__).resolve().parents[2]
SECRET = "doctor-k3y-never-printed-51c2"
SANDBOX_KEYS: dict[str, dict[str, Any]] = {
    "pipelogiq": {"api_keys": {SECRET: 12}},
    "priostack": {"api_keys": [SECRET]},
    "claimqueue": {"tokens": [SECRET]},
}
SEEDS: dict[str, dict[str, Any]] = {
    "pipelogiq": {"handler": "greet", "inputs": [{"name": "Ada"}]},
    "priostack": {"jobs": [{"type": "greet", "variables": {"name": "Ada"}, "retries": 3}]},
    "claimqueue": {"queue": "greet", "items": [{"name": "Ada"}]},
}
HANDLERS = '''
from serverless_worker import handler


@handler("greet")
def greet(job):
    return {"message": "hello " + job.input["name"]}
'''


def doctor(tmp_path: Path, protocol: str, url: str, *args: str, key: str = SECRET) -> subprocess.CompletedProcess[str]:
    (tmp_path / "doctor_handlers.py").write_text(HANDLERS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SW_")}
    env["DOCTOR_KEY"] = key
    return subprocess.run([str(CLI), "doctor", "--protocol", protocol, "--url", url, "--api-key-env", "DOCTOR_KEY",
                           "--handler-module", "doctor_handlers.py", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)


def untaken(protocol: str, job: dict[str, Any]) -> bool:
    """Nobody has been handed the job: no delivery, activation or claim."""
    if protocol == "pipelogiq":
        return job["status"] == "Pending" and [e["event"] for e in job["history"]] == ["execution_created"]
    if protocol == "priostack":
        return job["state"] == "waiting" and job["activations"] == []
    return job["status"] == "pending" and job["attempts"] == 0


def lines(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """``{check name: its line}`` from the report."""
    found = {}
    for line in result.stdout.splitlines()[1:]:
        verdict, name, *_ = line.split()
        found[name] = line
        assert verdict in ("OK", "WARN", "FAIL"), line
    return found


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_good_setup_passes_and_no_job_is_taken(tmp_path: Path, serve: Any, protocol: str) -> None:
    server = serve(protocol, **SANDBOX_KEYS[protocol])
    admin = SandboxAdmin(server.url)
    admin.seed(SEEDS[protocol])

    result = doctor(tmp_path, protocol, server.url)

    assert result.returncode == 0, result.stdout + result.stderr
    report = lines(result)
    assert report["handlers"].split()[0] == "OK" and "greet" in report["handlers"]
    assert report["server"].split()[0] == "OK" and "accepted" in report["server"]
    # a good setup has nothing to act on: no WARN line
    assert not [line for line in result.stdout.splitlines() if line.split()[0] == "WARN"], result.stdout
    assert [job for job in admin.jobs() if not untaken(protocol, job)] == []
    assert SECRET not in result.stdout + result.stderr


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_refused_credential_fails_the_server_check(tmp_path: Path, serve: Any, protocol: str) -> None:
    server = serve(protocol, **SANDBOX_KEYS[protocol])

    result = doctor(tmp_path, protocol, server.url, key="not-the-key")

    # then, as local says it: the URL, the refused credential, the settings that give the
    # key; one line per check, no exception class; exit 2 as local's
    assert result.returncode == 2, result
    server_line = lines(result)["server"]
    assert server_line.split()[0] == "FAIL"
    assert f"the job server at {server.url} refused the credential; check the key (--api-key-env NAME" \
        in server_line, server_line
    assert "HTTP 401" in server_line
    assert not re.search(r"\b[A-Z][A-Za-z]+Error\b", result.stdout + result.stderr), result.stdout
    assert len(result.stdout.splitlines()) == 1 + len(lines(result))     # the header, then a line per check
    assert result.stderr == "serverless-worker: error: the server check failed (above)\n"
    assert "not-the-key" not in result.stdout + result.stderr


def test_an_unreachable_server_fails_the_server_check(tmp_path: Path) -> None:
    with socket.socket() as bound:  # bound, not listening: a connection is refused
        bound.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{bound.getsockname()[1]}"
        result = doctor(tmp_path, "priostack", url)

    assert result.returncode == 2, result
    line = lines(result)["server"]
    assert f"cannot reach the job server at {url} (--url, SW_BASE_URL): connection refused" in line, line
    assert "Error" not in line and "retry_scheduled" not in result.stderr


def test_a_server_of_another_protocol_names_protocol(tmp_path: Path, serve: Any) -> None:
    server = serve("pipelogiq", **SANDBOX_KEYS["pipelogiq"])

    result = doctor(tmp_path, "priostack", server.url)

    assert result.returncode == 2, result
    assert "is it a priostack server? check --protocol" in lines(result)["server"]


def test_doctor_help_lists_only_its_own_flags() -> None:
    result = subprocess.run([str(CLI), "doctor", "--help"], capture_output=True, text=True, timeout=60,
                            check=False, env={**os.environ, "COLUMNS": "200"})

    assert result.returncode == 0
    for flag in ("--url", "--protocol", "--api-key-env", "--queue", "--handler-module", "--handlers",
                 "--instance-id", "--smoke", "--connect-timeout"):
        assert flag in result.stdout, flag
    for local_only in ("--concurrency", "--until-idle", "--state-path", "--batch-size", "--transport",
                       "--drain-grace-seconds", "--log-level", "--stats"):
        assert local_only not in result.stdout, local_only


def test_the_pipelogiq_smoke_works_two_stages_and_retries_the_first(tmp_path: Path, serve: Any) -> None:
    server = serve("pipelogiq", **SANDBOX_KEYS["pipelogiq"])
    admin = SandboxAdmin(server.url)
    admin.seed(SEEDS["pipelogiq"])

    result = doctor(tmp_path, "pipelogiq", server.url, "--smoke")

    assert result.returncode == 0, result.stdout + result.stderr
    assert lines(result)["smoke"].startswith("  OK    smoke       PASS: two-stage pipeline")
    smoke = [job for job in admin.jobs() if job["handler"] == "serverless-worker-smoke"]
    assert {job["stageName"]: job["status"] for job in smoke} == {"first": "Completed", "second": "Completed"}
    assert {job["stageName"]: len(job["executions"]) for job in smoke} == {"first": 2, "second": 1}
    assert [job for job in admin.jobs() if job["handler"] == "greet" and not untaken("pipelogiq", job)] == []


def test_the_smoke_is_refused_where_there_is_no_pipeline(tmp_path: Path, serve: Any) -> None:
    server = serve("priostack", **SANDBOX_KEYS["priostack"])

    result = doctor(tmp_path, "priostack", server.url, "--smoke")

    # a usage error, as local's: one line, exit 2, nothing checked
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--smoke works a Pipelogiq pipeline" in result.stderr
    assert result.stdout == ""


def test_without_a_server_it_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "doctor_handlers.py").write_text(HANDLERS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SW_")}
    result = subprocess.run([str(CLI), "doctor", "--handler-module", "doctor_handlers.py"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60, check=False)

    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--url" in result.stderr, result.stderr


def test_json_prints_every_finding_with_its_level_and_nothing_else(tmp_path: Path, serve: Any) -> None:
    # given a refused credential (one failed finding after the handlers')
    server = serve("priostack", **SANDBOX_KEYS["priostack"])

    result = doctor(tmp_path, "priostack", server.url, "--json", key="not-the-key")

    # then stdout is one JSON document of the findings, in order, and the exit status is the same
    assert result.returncode == 2, result
    report = json.loads(result.stdout)
    assert (report["protocol"], report["url"], report["passed"]) == ("priostack", server.url, False)
    assert [(f["level"], f["name"]) for f in report["findings"]] == [("OK", "handlers"), ("FAIL", "server")]
    assert "refused the credential" in report["findings"][1]["text"]
    assert result.stderr == "serverless-worker: error: the server check failed (above)\n"


def test_the_demo_handlers_are_a_warning_to_act_on(serve: Any) -> None:
    # given the built-in demo's handlers (this repository's examples) checked against a server
    server = serve("pipelogiq", **SANDBOX_KEYS["pipelogiq"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("SW_")} | {"DOCTOR_KEY": SECRET}

    result = subprocess.run([str(CLI), "doctor", "--url", server.url, "--api-key-env", "DOCTOR_KEY", "--json"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)

    # then the check passes, with one WARN saying `local` runs them there only when asked
    assert result.returncode == 0, result.stdout + result.stderr
    warned = [f for f in json.loads(result.stdout)["findings"] if f["level"] == "WARN"]
    assert len(warned) == 1 and warned[0]["name"] == "handlers", warned
    assert "built-in demo's handlers" in warned[0]["text"] and "--demo-handlers" in warned[0]["text"]
