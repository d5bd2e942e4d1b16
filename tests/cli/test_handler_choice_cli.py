"""CLI tier: only the user's handlers run against the user's server.

The handler module comes from ``--handler-module``, ``SW_HANDLER_MODULE`` or the project's
``template.yaml``; with none of them a run for a server is refused in one line saying how to
name one. The built-in demo's handlers (this repository's examples) run against the built-in
sandbox; against any other server only with ``--demo-handlers``. Each refusal happens before
any call to the server: it is never pulled from.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_local_cli import CLI, ROOT, SECRET, clean_env

from serverless_worker.sandbox.admin import SandboxAdmin

pytestmark = pytest.mark.cli

KEY = {"api_keys": {SECRET: 12}}


def local(cwd: Path, state: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The command in ``cwd`` (this repository, or a directory that is no project), its state
    file in ``state``, the test's temporary directory: never in the checkout."""
    return subprocess.run([str(CLI), "local", "--url", url, "--api-key-env", "TEST_KEY", "--until-idle", "1",
                           "--state", str(state / "state.sqlite3"), *args], cwd=cwd,
                          env=clean_env(TEST_KEY=SECRET), capture_output=True, text=True, timeout=120)


def untouched(admin: SandboxAdmin) -> bool:
    """No job was handed out: the server was never pulled from."""
    return admin.stats()["calls"].get("pull", 0) == 0 and all(job["status"] != "Completed" for job in admin.jobs())


@pytest.fixture
def echo_server(serve: Callable[..., Any]) -> tuple[Any, SandboxAdmin]:
    """A user's server (a sandbox this test started, not the run's own), with an echo job."""
    server = serve("pipelogiq", **KEY)
    admin = SandboxAdmin(server.url)
    admin.seed({"handler": "echo", "inputs": [{"message": "mine"}]})
    return server, admin


@pytest.mark.parametrize("named", [(), ("--handler-module", "functions/handlers")],
                         ids=["the project's template", "named by flag"])
def test_the_demo_handlers_never_run_against_another_server_by_default(
        echo_server: tuple[Any, SandboxAdmin], named: tuple[str, ...], tmp_path: Path) -> None:
    # given this repository, whose template names the example handlers (the built-in demo's)
    server, admin = echo_server

    # when a run is pointed at a server that is not its own sandbox, without --demo-handlers
    result = local(ROOT, tmp_path, server.url, *named)

    # then it is refused in one line naming the flag, and the server was never pulled from
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("serverless-worker: error: "), result.stderr
    assert "the built-in demo's handlers" in lines[0] and "--demo-handlers" in lines[0], lines[0]
    assert "--handler-module" in lines[0] and "Traceback" not in result.stderr
    assert untouched(admin), admin.jobs()


def test_the_demo_handlers_run_against_another_server_when_asked(echo_server: tuple[Any, SandboxAdmin],
                                                                 tmp_path: Path) -> None:
    server, admin = echo_server

    result = local(ROOT, tmp_path, server.url, "--demo-handlers")

    assert result.returncode == 0, result.stdout + result.stderr
    assert [job["status"] for job in admin.jobs()] == ["Completed"]


def test_without_a_handler_module_a_run_for_a_server_is_refused_in_one_line(
        echo_server: tuple[Any, SandboxAdmin], tmp_path: Path) -> None:
    # given a directory that is no project (no template.yaml names a handler module)
    server, admin = echo_server

    # when a run for a server names no handler module
    result = local(tmp_path, tmp_path, server.url)

    # then one line says how to name one, and nothing was pulled
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("serverless-worker: error: no handler module to run"), lines
    assert "--handler-module" in lines[0] and "SW_HANDLER_MODULE" in lines[0] and "init" in lines[0]
    assert untouched(admin), admin.jobs()
    # and a module named by the environment is the user's choice: it runs
    mine = tmp_path / "mine.py"
    mine.write_text("from serverless_worker import handler\n\n\n@handler('echo')\ndef echo(job):\n"
                    "    return {'echoed': job.input}\n")
    env_named = subprocess.run([str(CLI), "local", "--url", server.url, "--api-key-env", "TEST_KEY",
                                "--until-idle", "1"], cwd=tmp_path,
                               env=clean_env(TEST_KEY=SECRET, SW_HANDLER_MODULE="mine.py"),
                               capture_output=True, text=True, timeout=120)
    assert env_named.returncode == 0, env_named.stdout + env_named.stderr
    assert "echoed" in str(admin.jobs()[0]["output"])
