"""CLI tier: ``serverless-worker local`` against a server it can never work with.

Nothing listening at the URL, a refused credential, a queue that does not exist or a
token not allowed on it: each must end the run within seconds with one line on stderr
naming the URL and the cause, exit status 2, no summary, and (when a server was there)
no call beyond the first bootstrap or pull, so no heartbeat, drain or shutdown against
a server that never let the worker in.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.cli

PROTOCOLS = ("pipelogiq", "priostack", "claimqueue")
CLI = Path(sys.executable).with_name("serverless-worker")
SECRET = "first-contact-k3y-never-printed-91c2"
IDLE = 60  # the run's idle limit: a fail-fast run ends far below it
FAST = 20  # seconds: loose, for a slow shared machine; the old behaviour took 60-85 s

SANDBOX_KEYS: dict[str, dict[str, Any]] = {
    "pipelogiq": {"api_keys": {SECRET: 12}},
    "priostack": {"api_keys": [SECRET]},
    "claimqueue": {"tokens": [SECRET]},
}
# The only call a refused worker may have made: its first bootstrap or pull.
FIRST_CALL = {"pipelogiq": "bootstrap", "priostack": "activate", "claimqueue": "claim"}
SEED = {
    "pipelogiq": {"handler": "double", "inputs": [{"n": 1}]},
    "priostack": {"jobs": [{"type": "double", "variables": {"n": 1}, "retries": 3}]},
    "claimqueue": {"queue": "double", "items": [{"n": 1}]},
}

HANDLERS = '''
from serverless_worker import handler


@handler("double")
def double(job):
    return {"value": job.input["n"] * 2}
'''


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SW_")}
    env.update(extra)
    return env


def local(protocol: str, url: str, handler_file: Path, key: str, *extra: str) -> tuple[subprocess.CompletedProcess[str],
                                                                                      float]:
    started = time.monotonic()
    result = subprocess.run(
        [str(CLI), "local", "--protocol", protocol, "--url", url, "--api-key-env", "TEST_KEY",
         "--handler-module", str(handler_file), "--handlers", "double", "--until-idle", str(IDLE), *extra],
        # In the handler's (temporary) directory: the run's state file goes there, not into the
        # repository, where a test on another xdist worker would find it locked.
        cwd=handler_file.parent, env=clean_env(TEST_KEY=key), capture_output=True, text=True, timeout=IDLE + 60)
    return result, time.monotonic() - started


def one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{stderr}"
    assert lines[0].startswith("serverless-worker: error: "), lines[0]
    return lines[0]


@pytest.fixture
def handler_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_handlers.py"
    path.write_text(HANDLERS)
    return path


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port bound by this test but not listening: connecting is refused, and no
    other process can take the port while the test runs."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    yield sock.getsockname()[1]
    sock.close()



@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_nothing_listening_ends_at_once_naming_the_url(protocol: str, closed_port: int,
                                                       handler_file: Path) -> None:
    # given a URL where nothing listens
    url = f"http://127.0.0.1:{closed_port}"

    # when the worker starts against it
    result, elapsed = local(protocol, url, handler_file, SECRET)

    # then one line names the URL, the setting and the cause; exit 2, quickly, no summary
    assert result.returncode == 2, result
    line = one_line(result.stderr)
    assert url in line and "--url" in line and "connection refused" in line, line
    assert elapsed < FAST, f"took {elapsed:.1f} s"
    assert result.stdout == ""
    assert SECRET not in line


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_refused_key_ends_at_once_without_calls_beyond_the_first(protocol: str, sandbox: Callable[..., Any],
                                                                   handler_file: Path) -> None:
    # given a server that is up, has a job, and does not accept the worker's key
    server, admin = sandbox(protocol)
    admin.seed(SEED[protocol])

    # when the worker runs with another key
    result, elapsed = local(protocol, server.url, handler_file, "wrong-key-also-never-printed")

    # then one line names the URL and the refused credential; exit 2, quickly, no summary
    assert result.returncode == 2, result
    line = one_line(result.stderr)
    assert server.url in line and "refused the credential" in line and "HTTP 401" in line, line
    assert "--api-key-env" in line
    assert elapsed < FAST, f"took {elapsed:.1f} s"
    # instead of the banner, not after it; the call's own text once, without the tick's step
    assert result.stdout == "", result.stdout
    assert "pull: pull:" not in line and "session: bootstrap:" not in line, line
    # and the server saw the first bootstrap or pull only: no heartbeat, drain or shutdown
    calls = {label: n for label, n in admin.stats()["calls"].items() if n}
    assert set(calls) == {FIRST_CALL[protocol]}, calls
    assert "wrong-key-also-never-printed" not in result.stdout + result.stderr


@pytest.mark.parametrize(("config", "cause"), [
    ({"known_queues": ["resize"]}, "HTTP 404"),
    ({"queues": {"double": {"tokens": ["another-token"]}}}, "HTTP 403"),
], ids=["unknown-queue", "token-not-allowed-on-queue"])
def test_a_misconfigured_queue_ends_at_once_naming_the_handler(config: dict[str, Any], cause: str,
                                                               sandbox: Callable[..., Any],
                                                               handler_file: Path) -> None:
    # given a claim-queue server that accepts the token but not for the queue "double"
    server, admin = sandbox("claimqueue", **config)

    # when the worker works the queue "double"
    result, elapsed = local("claimqueue", server.url, handler_file, SECRET)

    # then one line names the URL, the handler and the server's refusal; exit 2, no summary
    assert result.returncode == 2, result
    line = one_line(result.stderr)
    assert server.url in line and "handlers double" in line and cause in line, line
    assert "--handlers" in line
    assert elapsed < FAST, f"took {elapsed:.1f} s"
    assert "taken" not in result.stdout
    calls = {label: n for label, n in admin.stats()["calls"].items() if n}
    assert set(calls) == {"claim"}, calls
    assert SECRET not in result.stdout + result.stderr


def test_a_host_that_does_not_resolve_ends_at_once_naming_it(handler_file: Path) -> None:
    # given a URL whose host name cannot resolve (.invalid never does, RFC 2606)
    url = "https://no-such-job-server.invalid"

    # when the worker starts against it
    result, elapsed = local("priostack", url, handler_file, SECRET)

    # then one line says so, with exit 2
    assert result.returncode == 2, result
    line = one_line(result.stderr)
    assert url in line and "does not resolve" in line, line
    assert elapsed < FAST and result.stdout == ""


def test_a_server_that_answers_only_5xx_is_retried_then_left_without_a_drain(sandbox: Callable[..., Any],
                                                                             handler_file: Path) -> None:
    # given a Pipelogiq server that answers every bootstrap with 503 (reached, but transiently failing)
    server, admin = sandbox("pipelogiq")
    admin.faults([{"kind": "error_5xx", "endpoint": "bootstrap"}], seed=1)

    # when the worker runs until idle
    started = time.monotonic()
    result = subprocess.run(
        [str(CLI), "local", "--protocol", "pipelogiq", "--url", server.url, "--api-key-env", "TEST_KEY",
         "--handler-module", str(handler_file), "--until-idle", "1"],
        cwd=handler_file.parent, env=clean_env(TEST_KEY=SECRET), capture_output=True, text=True, timeout=120)

    # then the bootstrap was retried (the existing retries: the server was reached), each retried
    # call logged once, not once per attempt
    retries = [line for line in result.stderr.splitlines() if "retrying bootstrap" in line]
    calls = {label: n for label, n in admin.stats()["calls"].items() if n}
    assert calls.keys() == {"bootstrap"} and calls["bootstrap"] > len(retries) >= 1, (calls, result.stderr)
    assert server.url in retries[0] and "HTTP 503" in retries[0]
    assert "stamina" not in result.stderr
    # and it ended without a drain (no heartbeat, events or shutdown: only bootstraps, above) and
    # without a summary of zeros, saying in one line that nothing got through; exit 1
    assert result.returncode == 1, result
    last = result.stderr.splitlines()[-1]
    assert last.startswith(f"serverless-worker: error: the job server at {server.url} never answered"), last
    assert "HTTP 503" in last and "nothing was taken" in last
    assert "taken " not in result.stdout and "open_session" not in result.stdout + result.stderr
    assert time.monotonic() - started < 60


def test_a_refused_key_with_a_kept_session_names_the_call_once(sandbox: Callable[..., Any],
                                                               handler_file: Path) -> None:
    # given a Pipelogiq worker that ran once with its key, leaving its state file
    server, _ = sandbox("pipelogiq")
    first, _ = local("pipelogiq", server.url, handler_file, SECRET, "--until-idle", "1")
    assert first.returncode == 0, first

    # when it runs again on that file with a wrong key (its first call is then a pull)
    result, _ = local("pipelogiq", server.url, handler_file, "a-wrong-key-never-printed")

    # then one line, no banner, the call named once: "pull: API key rejected", not "pull: pull:"
    assert result.returncode == 2, result
    line = one_line(result.stderr)
    assert "refused the credential" in line and "HTTP 401" in line, line
    assert "pull: pull:" not in line and line.count("pull:") <= 1, line
    assert result.stdout == ""


@pytest.mark.parametrize(("client", "server_protocol"), [("priostack", "pipelogiq"), ("pipelogiq", "claimqueue"),
                                                         ("claimqueue", "priostack")])
def test_a_server_of_another_protocol_is_told_to_check_protocol(client: str, server_protocol: str,
                                                                sandbox: Callable[..., Any],
                                                                handler_file: Path) -> None:
    # given a server of one protocol, its own key
    server, _ = sandbox(server_protocol)
    key = SECRET

    # when the worker speaks another protocol to it
    result, elapsed = local(client, server.url, handler_file, key)

    # then one line asks whether it is a server of that protocol and names --protocol; exit 2
    assert result.returncode == 2, result
    line = one_line(result.stderr)
    assert f"is it a {client} server? check --protocol" in line, line
    assert elapsed < FAST and result.stdout == ""
