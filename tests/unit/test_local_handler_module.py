"""The local run's ``--handler-module``: names and relative paths resolve where the user typed them.

A newcomer runs ``serverless-worker local --handler-module my_handlers`` next to their
``my_handlers.py``; that must work without ``PYTHONPATH=.``, and a path that is missing
must be reported against the working directory, not the project root.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from serverless_worker.errors import ConfigurationError
from serverless_worker.local.handler_module import load_local_handlers, resolve_handler_module
from serverless_worker.registry import default_registry

HANDLERS = '''
from serverless_worker import handler


@handler("greet")
def greet(job):
    return {"hello": job.input.get("name", "world")}
'''


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project root with its own functions/handlers.py, away from the working directory."""
    root = tmp_path / "project"
    (root / "functions").mkdir(parents=True)
    (root / "functions" / "handlers.py").write_text(HANDLERS)
    return root


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    here = tmp_path / "work"
    (here / "sub").mkdir(parents=True)
    monkeypatch.chdir(here)
    return here


def test_a_module_name_in_the_working_directory_needs_no_pythonpath(project: Path, workdir: Path) -> None:
    (workdir / "my_handlers.py").write_text(HANDLERS)

    assert resolve_handler_module("my_handlers", project) == str(workdir / "my_handlers.py")
    with default_registry.isolated():
        assert "greet" in load_local_handlers("my_handlers", project, ["greet"])


def test_a_package_in_the_working_directory_resolves_to_its_directory(project: Path, workdir: Path) -> None:
    (workdir / "jobs").mkdir()
    (workdir / "jobs" / "__init__.py").write_text(HANDLERS)

    assert resolve_handler_module("jobs", project) == str(workdir / "jobs")


@pytest.mark.parametrize("name", ["x.py", "./x.py", "sub/x.py"])
def test_a_relative_path_resolves_against_the_working_directory(project: Path, workdir: Path, name: str) -> None:
    (workdir / "x.py").write_text(HANDLERS)
    (workdir / "sub" / "x.py").write_text(HANDLERS)

    assert Path(resolve_handler_module(name, project)) == workdir / name


@pytest.mark.parametrize("name", ["missing.py", "./missing.py", "sub/missing.py"])
def test_a_missing_path_is_reported_against_the_working_directory(project: Path, workdir: Path,
                                                                   name: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        resolve_handler_module(name, project)

    assert f"{name!r} in {workdir}" in str(caught.value)


def test_the_working_directory_comes_before_the_project(project: Path, workdir: Path) -> None:
    (workdir / "handlers.py").write_text(HANDLERS)

    assert resolve_handler_module("handlers", project) == str(workdir / "handlers.py")


def test_the_project_is_still_searched_when_the_working_directory_has_nothing(project: Path,
                                                                                workdir: Path) -> None:
    assert resolve_handler_module("handlers", project) == str(project / "functions" / "handlers.py")
    assert resolve_handler_module("functions/handlers.py", project) == str(project / "functions" / "handlers.py")


def test_an_unknown_name_names_both_places_it_looked(project: Path, workdir: Path) -> None:
    with pytest.raises(ConfigurationError, match="neither a module nor a file") as caught:
        resolve_handler_module("no_such_handlers_module", project)

    assert str(workdir) in str(caught.value) and str(project) in str(caught.value)
