"""CLI tier: ``local`` and ``doctor`` load a project's handlers as Lambda does.

In Lambda the code root (``functions/``) is on the path, so a handler may ``import util``
beside it; and every module in the handler package is loaded, so a new file in
``functions/handlers/`` needs no import in ``__init__.py``. A module there that registers
nothing is named in a warning. The project is the one ``serverless-worker init`` writes,
with its ``handlers.py`` turned into a package.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from serverless_worker.sandbox.admin import SandboxAdmin

pytestmark = pytest.mark.cli

CLI = Path(sys.executable).with_name("serverless-worker")
SECRET = "loading-k3y-never-printed-0b7e"
SANDBOX_KEYS: dict[str, dict[str, Any]] = {"pipelogiq": {"api_keys": {SECRET: 12}}}

UTIL = '''
def shout(text):
    return text.upper() + "!"
'''
GREET = '''
import util

from serverless_worker import handler


@handler("greet")
def greet(job):
    return {"message": util.shout("hello " + job.input["name"])}
'''
NOTES = '''
"""Nothing here registers a handler."""
LIMIT = 3
'''


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """An init project whose handlers are a package: greet.py (imports functions/util.py),
    notes.py (registers nothing), and an ``__init__.py`` that imports neither."""
    root = tmp_path / "app"
    made = subprocess.run([str(CLI), "init", str(root), "--from-pypi"], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    (root / "functions" / "handlers.py").unlink()
    package = root / "functions" / "handlers"
    package.mkdir()
    (package / "__init__.py").write_text('"""My handlers."""\n')
    (package / "greet.py").write_text(GREET)
    (package / "notes.py").write_text(NOTES)
    (root / "functions" / "util.py").write_text(UTIL)
    return root


def run(project: Path, command: str, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SW_")}
    env["LOADING_KEY"] = SECRET
    return subprocess.run([str(CLI), command, "--protocol", "pipelogiq", "--url", url, "--api-key-env", "LOADING_KEY",
                           "--handlers", "greet", *args], cwd=project, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_doctor_finds_a_new_handler_file_that_imports_a_module_beside_it(project: Path, serve: Any) -> None:
    server = serve("pipelogiq", **SANDBOX_KEYS["pipelogiq"])

    result = run(project, "doctor", server.url)

    assert result.returncode == 0, result.stdout + result.stderr
    handlers_line = next(line for line in result.stdout.splitlines() if " handlers " in f" {line} ")
    assert handlers_line.split()[0] == "OK" and "greet" in handlers_line, result.stdout
    assert "ModuleNotFoundError" not in result.stdout + result.stderr
    # the module that registers nothing is named, once, as a finding to act on (not a log line)
    warnings = [line for line in result.stdout.splitlines() if "registers no @handler" in line]
    assert len(warnings) == 1 and warnings[0].split()[:2] == ["WARN", "handlers"], result.stdout
    assert str(project / "functions" / "handlers" / "notes.py") in warnings[0], result.stdout
    assert result.stderr == "", result.stderr


def test_local_runs_that_handler_to_its_result(project: Path, serve: Any) -> None:
    server = serve("pipelogiq", **SANDBOX_KEYS["pipelogiq"])
    admin = SandboxAdmin(server.url)
    admin.seed({"handler": "greet", "inputs": [{"name": "Ada"}, {"name": "Lin"}]})

    result = run(project, "local", server.url, "--until-idle", "3")

    assert result.returncode == 0, result.stdout + result.stderr
    jobs = admin.jobs()
    assert [job["status"] for job in jobs] == ["Completed", "Completed"], jobs
    assert sorted("HELLO ADA!" in str(job["output"]) or "HELLO LIN!" in str(job["output"]) for job in jobs) \
        == [True, True], jobs
    admin.close()
