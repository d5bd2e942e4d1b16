"""CLI tier: ``serverless-worker init DIR`` writes a project of the user's own.

The project must work as written: its tests of the example handler pass at once (run
here with this environment's Python, as a user would after ``pip install``) and its
layer installs the runtime by name at this package's version. Its template's
``sam validate --lint`` runs in ``make sam-validate``, where the SAM CLI is installed.
An existing, non-empty DIR is refused in one line with exit 2, and nothing in it is
touched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from serverless_worker import __version__

pytestmark = pytest.mark.cli

CLI = Path(sys.executable).with_name("serverless-worker")


def init(directory: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CLI), "init", str(directory)], cwd=cwd, capture_output=True, text=True, timeout=60)


def outside_pytest_env() -> dict[str, str]:
    """This environment without what the running pytest (and xdist) put in it."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "SW_"))}


def test_init_writes_a_project_whose_tests_pass(tmp_path: Path) -> None:
    # given a new directory name
    project = tmp_path / "my-worker"

    # when init writes the project
    result = init(project, tmp_path)

    # then it has the template, the handler, its tests, sample events and the README
    assert result.returncode == 0, result.stderr
    for name in ("template.yaml", "README.md", "functions/app.py", "functions/handlers.py",
                 "tests/test_handlers.py", "events/scheduler.json", "events/executor.json", "events/greet.json",
                 "layer/requirements.txt", "requirements.txt", ".gitignore"):
        assert (project / name).is_file(), name
    assert not list(project.rglob("*.tmpl")) and not list(project.rglob("*@*"))
    for event in (project / "events").glob("*.json"):
        json.loads(event.read_text())
    # the layer installs the runtime by name, at this version; the README has its commands
    assert f"serverless-worker=={__version__}" in (project / "layer/requirements.txt").read_text()
    readme = (project / "README.md").read_text()
    assert "python -m pytest" in readme and "sam build && sam deploy --guided" in readme
    assert "# my-worker" in readme and "@" not in readme.replace("@handler", "")
    template = (project / "template.yaml").read_text()
    assert "ContentUri: layer/" in template and "Handler: app.scheduler" in template

    # and its tests pass at once, run as the user would run them
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=project,
                           env=outside_pytest_env(), capture_output=True, text=True, timeout=120)
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "3 passed" in tests.stdout


def test_init_into_a_directory_that_is_not_empty_is_refused_in_one_line(tmp_path: Path) -> None:
    # given a directory with a file of the user's in it
    project = tmp_path / "busy"
    project.mkdir()
    (project / "notes.txt").write_text("mine")

    # when init is pointed at it
    result = init(project, tmp_path)

    # then one line says why, exit 2, and nothing was written
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and str(project) in lines[0] and "not empty" in lines[0], result.stderr
    assert [p.name for p in project.iterdir()] == ["notes.txt"]
    assert result.stdout == ""


def test_init_creates_the_directory_and_its_parents(tmp_path: Path) -> None:
    project = tmp_path / "a" / "b"

    result = init(project, tmp_path)

    assert result.returncode == 0, result.stderr
    assert (project / "template.yaml").is_file()

