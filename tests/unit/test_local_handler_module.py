"""The local run's ``--handler-module``: names and relative paths resolve where the user typed them.

A newcomer runs ``serverless-worker local --handler-module my_handlers`` next to their
``my_handlers.py``; that must work without ``PYTHONPATH=.``, and a path that is missing
must be reported against the working directory, not the project root.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from serverless_worker.errors import ConfigurationError
from serverless_worker.local.handler_module import code_directories, load_local_handlers, resolve_handler_module
from serverless_worker.registry import HandlerRegistry, default_registry, load_handlers

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


def test_a_handler_file_imports_a_module_beside_it_as_in_lambda(project: Path, workdir: Path) -> None:
    # given a handler file in its own directory, importing a module that sits beside it
    here = workdir / "jobs_elsewhere"
    here.mkdir()
    (here / "shout_helper_4c1.py").write_text("def shout(text):\n    return text.upper()\n")
    (here / "loud.py").write_text("import shout_helper_4c1\n\nfrom serverless_worker import handler\n\n\n"
                                  "@handler('loud')\ndef loud(job):\n    return shout_helper_4c1.shout('hi')\n")

    # when it is loaded for a local run
    with default_registry.isolated():
        registry = load_local_handlers(str(here / "loud.py"), project, ["loud"])

    # then the import resolved, and the directories Lambda would have are on the path
    assert "loud" in registry
    assert code_directories(str(here / "loud.py"), project) == [(project / "functions").resolve(), here.resolve()]


def test_every_module_of_a_handler_package_is_loaded_and_an_empty_one_named(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # given a package whose __init__ imports nothing, a module with a handler, one without,
    # and a private helper that would fail if it were imported
    package = tmp_path / "pkg_discovery_91a"
    package.mkdir()
    (package / "__init__.py").write_text('"""Nothing imported here."""\n')
    (package / "greet.py").write_text(HANDLERS)
    (package / "notes.py").write_text("LIMIT = 3\n")
    (package / "_private.py").write_text("raise RuntimeError('never imported')\n")

    # when the package is loaded
    with default_registry.isolated(), caplog.at_level("WARNING", logger="serverless_worker.registry"):
        registry = HandlerRegistry()
        load_handlers(package, registry)

    # then the handler in greet.py registered, notes.py is named once, _private.py never ran
    assert registry.names() == ["greet"]
    named = [r.getMessage() for r in caplog.records if "registers no @handler" in r.getMessage()]
    assert len(named) == 1 and str(package / "notes.py") in named[0], named
