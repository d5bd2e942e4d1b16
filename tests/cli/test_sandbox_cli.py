"""CLI tier: ``serverless-worker sandbox`` run as a real subprocess, for every protocol.

Each server listens on ``--port 0`` (the OS picks a free port, so xdist workers never
collide) and the test reads the URL from the one line the command prints.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest
import requests

from serverless_worker import __version__
from serverless_worker.cli.sandbox_command import DEMO_SEEDS
from serverless_worker.sandbox import SANDBOXES
from serverless_worker.sandbox.admin import SandboxAdmin
from support.waiting import wait_for

pytestmark = pytest.mark.cli

PROTOCOLS = sorted(SANDBOXES)
# The console script installed next to this interpreter: the real entry point, not main().
CLI = Path(sys.executable).with_name("serverless-worker")

# One authenticated call per protocol, to prove the printed credential is the one the
# sandbox accepts: (path, JSON body, headers for a credential).
AUTH_PROBES: dict[str, tuple[str, dict[str, object], Callable[[str], dict[str, str]]]] = {
    "pipelogiq": ("/workers/bootstrap", {"workerName": "cli-test"}, lambda key: {"X-API-Key": key}),
    "priostack": ("/api/v1/jobs/activate", {"type": "echo", "maxJobsToActivate": 1},
                  lambda key: {"X-API-Key": key}),
    "claimqueue": ("/resize/claim", {"worker": "cli-test"},
                   lambda token: {"Authorization": f"Bearer {token}"}),
}


@dataclass
class RunningSandbox:
    proc: subprocess.Popen[str]
    banner: str
    url: str
    stderr_path: Path

    @property
    def credentials(self) -> dict[str, str]:
        pairs = dict(re.findall(r"(\w+)=(\S+)", self.banner))
        return {k: v for k, v in pairs.items() if k not in ("url", "admin", "seeded")}

    def stderr(self) -> str:
        return self.stderr_path.read_text()


def _first_line(stream: IO[str], timeout: float) -> str:
    """Read one line without hanging the test if the process never prints."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return lines[0] if lines else ""


def _wait_for_admin(url: str, timeout: float = 15.0) -> None:
    def answers() -> bool:
        try:
            return requests.get(f"{url}/_admin/jobs", timeout=2).ok
        except requests.ConnectionError:
            return False

    wait_for(answers, timeout, f"the admin API at {url} to answer")


def _cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CLI), *args], capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture
def start_sandbox(tmp_path: Path) -> Iterator[Callable[..., RunningSandbox]]:
    """``start_sandbox("pipelogiq", "--demo")`` -> a running CLI sandbox, killed at teardown."""
    procs: list[subprocess.Popen[str]] = []

    def _start(protocol: str, *args: str) -> RunningSandbox:
        assert CLI.exists(), f"console script missing at {CLI}: pip install -e .[dev]"
        stderr_path = tmp_path / f"stderr-{len(procs)}.txt"
        with stderr_path.open("w") as stderr:
            proc = subprocess.Popen([str(CLI), "sandbox", protocol, "--port", "0", *args],
                                    stdout=subprocess.PIPE, stderr=stderr, text=True)
        procs.append(proc)
        assert proc.stdout is not None
        banner = _first_line(proc.stdout, timeout=30)
        match = re.search(r"\burl=(\S+)", banner)
        assert match, f"no URL in the banner {banner!r}; stderr: {stderr_path.read_text()}"
        url = match.group(1)
        assert f"admin={url}/_admin" in banner
        _wait_for_admin(url)
        return RunningSandbox(proc, banner, url, stderr_path)

    yield _start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout:
            proc.stdout.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_sandbox_serves_admin_api_and_exits_0_on_sigterm(protocol: str, start_sandbox) -> None:
    # given a sandbox started from the command line, with no jobs
    sandbox = start_sandbox(protocol)
    admin = SandboxAdmin(sandbox.url)
    assert admin.jobs() == []

    # when jobs are seeded through the admin API
    created = admin.seed(DEMO_SEEDS[protocol][0])

    # then they are listed, and SIGTERM stops the server cleanly
    assert created
    assert len(admin.jobs()) >= 1
    admin.close()
    sandbox.proc.send_signal(signal.SIGTERM)
    assert sandbox.proc.wait(timeout=15) == 0
    assert "Traceback" not in sandbox.stderr()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_demo_seeds_before_serving_and_sigint_exits_0(protocol: str, start_sandbox) -> None:
    sandbox = start_sandbox(protocol, "--demo")

    seeded = re.search(r"\bseeded=(\d+)\b", sandbox.banner)
    assert seeded, sandbox.banner
    admin = SandboxAdmin(sandbox.url)
    assert len(admin.jobs()) == int(seeded.group(1)) >= 1
    admin.close()
    sandbox.proc.send_signal(signal.SIGINT)
    assert sandbox.proc.wait(timeout=15) == 0
    assert "Traceback" not in sandbox.stderr()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_printed_credential_is_accepted_and_a_wrong_one_is_not(protocol: str, start_sandbox) -> None:
    sandbox = start_sandbox(protocol, "--demo")
    assert sandbox.credentials, f"no credential in the banner {sandbox.banner!r}"
    credential = next(iter(sandbox.credentials.values())).split(",")[0]
    path, body, headers = AUTH_PROBES[protocol]

    good = requests.post(sandbox.url + path, json=body, headers=headers(credential), timeout=10)
    bad = requests.post(sandbox.url + path, json=body, headers=headers("not-" + credential), timeout=10)

    assert good.status_code == 200, good.text
    assert bad.status_code == 401, bad.text


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_seed_file_with_a_list_of_bodies_seeds_each(protocol: str, start_sandbox, tmp_path: Path) -> None:
    # given a file holding the demo bodies twice
    seed_file = tmp_path / "seed.json"
    seed_file.write_text(json.dumps(DEMO_SEEDS[protocol] * 2))

    # when the sandbox starts with it
    sandbox = start_sandbox(protocol, "--seed", str(seed_file))

    # then both copies were seeded before it served
    once = start_sandbox(protocol, "--demo")
    twice_jobs = SandboxAdmin(sandbox.url).jobs()
    once_jobs = SandboxAdmin(once.url).jobs()
    assert len(once_jobs) >= 1
    assert len(twice_jobs) == 2 * len(once_jobs)


def test_unknown_protocol_exits_2_with_a_clear_message() -> None:
    result = _cli("sandbox", "nosuch", "--port", "0")

    assert result.returncode == 2
    assert "invalid choice: 'nosuch'" in result.stderr
    assert "Traceback" not in result.stderr


def test_non_loopback_host_is_refused_without_allow_remote() -> None:
    result = _cli("sandbox", "priostack", "--host", "0.0.0.0", "--port", "0")

    assert result.returncode == 2
    assert "not a loopback address" in result.stderr
    assert "--allow-remote" in result.stderr
    assert "Traceback" not in result.stderr


def test_port_in_use_exits_2_with_a_clear_message() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        result = _cli("sandbox", "pipelogiq", "--port", str(port))

    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_misspelt_setting_exits_2_naming_it(protocol: str) -> None:
    result = _cli("sandbox", protocol, "--port", "0", "--set", "no_such_setting=3")

    assert result.returncode == 2
    assert "unknown --set no_such_setting" in result.stderr
    assert "Traceback" not in result.stderr


def test_fault_flags_set_faults_that_always_fire(start_sandbox) -> None:
    # given a Pipelogiq sandbox started with two faults on the command line
    sandbox = start_sandbox("pipelogiq", "--fault", "ignore_wait@pull", "--fault", "naive_lease_time")

    # then the admin API shows them as rules that always fire, on one endpoint or all
    rules = requests.get(f"{sandbox.url}/_admin/faults", timeout=5).json()["plan"]["rules"]
    assert [(r["kind"], r["endpoint"], r["probability"], r["count"]) for r in rules] == [
        ("ignore_wait", "pull", 1.0, None), ("naive_lease_time", "*", 1.0, None)]
    # and an empty long poll of 20 s is answered at once (within the 5 s timeout) with a 204
    key = sandbox.credentials["api_keys"]
    answer = requests.post(f"{sandbox.url}/jobs/pull", json={"queue": "app_12_echo_StageNext", "waitSeconds": 20},
                           headers={"X-API-Key": key}, timeout=5)
    assert answer.status_code == 204 and answer.content == b""


@pytest.mark.parametrize(("args", "message"), [
    (["--seed", "/nonexistent/seed.json"], "cannot read --seed /nonexistent/seed.json"),
    (["--set", "=3"], "expected KEY=VALUE"),
    (["--port", "70000"], "70000 is not a TCP port"),
    (["--port", "http"], "http is not a TCP port"),
    (["--fault", "ignore_waits@pull"], "unknown fault kind 'ignore_waits'"),
])
def test_bad_arguments_exit_2_without_traceback(args: list[str], message: str) -> None:
    result = _cli("sandbox", "pipelogiq", *args)

    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_seed_body_exits_2_without_traceback(tmp_path: Path) -> None:
    seed_file = tmp_path / "seed.json"
    seed_file.write_text(json.dumps({"not": "a seed body"}))

    result = _cli("sandbox", "priostack", "--port", "0", "--seed", str(seed_file))

    assert result.returncode == 2
    assert "bad seed body for the priostack sandbox" in result.stderr
    assert "Traceback" not in result.stderr


def test_version_and_missing_subcommand() -> None:
    version = _cli("--version")
    bare = _cli()

    assert version.returncode == 0
    assert version.stdout.strip() == f"serverless-worker {__version__}"
    assert bare.returncode == 2
    assert "sandbox" in bare.stderr


def test_the_pipelogiq_sandbox_serves_the_older_release_with_set_legacy(start_sandbox) -> None:
    # given the Pipelogiq sandbox started as the older public release, with its demo jobs
    sandbox = start_sandbox("pipelogiq", "--demo", "--set", "legacy=true")
    key = {"X-API-Key": sandbox.credentials["api_keys"]}
    queue = "app_12_echo_StageNext"

    # when a worker pulls, asking to wait far longer than the call's timeout allows
    pulled = requests.post(f"{sandbox.url}/jobs/pull", json={"queue": queue, "waitSeconds": 20}, headers=key,
                           timeout=5)
    payload = pulled.json()["payload"]

    # then the delivery has no execution identity, the lease API is absent, and once the
    # queue is empty a pull answers 204 at once (the timeout above would fail a waiting one)
    assert "executionId" not in payload and "attempt" not in payload
    lease = requests.post(f"{sandbox.url}/stages/{payload['stageId']}/lease/acquire", json={}, headers=key, timeout=5)
    assert lease.status_code == 404
    requests.post(f"{sandbox.url}/jobs/pull", json={"queue": queue}, headers=key, timeout=5).raise_for_status()
    assert requests.post(f"{sandbox.url}/jobs/pull", json={"queue": queue, "waitSeconds": 20}, headers=key,
                         timeout=5).status_code == 204
