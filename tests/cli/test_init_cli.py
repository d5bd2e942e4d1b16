"""CLI tier: ``serverless-worker init DIR`` writes a project of the user's own.

The project must work as written: its tests of the example handler pass at once (run
here with this environment's Python, as a user would after ``pip install``) and its
layer installs the runtime by name at this package's version, from the wheel init puts
in ``vendor/`` until the package is on PyPI. On a fresh virtual environment, with
serverless-worker installed from its wheel, ``init app`` and the README's install-and-test
command pass. Its template's ``sam validate --lint`` and its ``sam build`` run in
``make sam-validate``, where the SAM CLI is installed. An existing, non-empty DIR is
refused in one line with exit 2, and nothing in it is touched.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from serverless_worker import __version__

pytestmark = pytest.mark.cli

CLI = Path(sys.executable).with_name("serverless-worker")
ROOT = Path(__file__).resolve().parents[2]
WHEEL = f"serverless_worker-{__version__}-py3-none-any.whl"


def init(directory: Path, cwd: Path, *args: str, cli: Path = CLI) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(cli), "init", str(directory), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=outside_pytest_env())


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
    # the state file `serverless-worker local` keeps in the project is never committed
    assert ".serverless-worker/" in (project / ".gitignore").read_text().splitlines()
    for event in (project / "events").glob("*.json"):
        json.loads(event.read_text())
    # the layer installs the runtime by name, at this version, from the wheel in vendor/
    layer = (project / "layer/requirements.txt").read_text().splitlines()
    assert f"serverless-worker=={__version__}" in layer and "--find-links ../vendor" in layer
    assert "--find-links vendor" in (project / "requirements.txt").read_text().splitlines()
    assert [p.name for p in (project / "vendor").iterdir()] == [WHEEL]
    assert "built from the source tree" in result.stdout  # this checkout's .venv is an editable install
    # the README has its commands
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


def test_from_pypi_names_the_version_and_carries_no_wheel(tmp_path: Path) -> None:
    project = tmp_path / "published"

    result = init(project, tmp_path, "--from-pypi")

    assert result.returncode == 0, result.stderr
    assert not (project / "vendor").exists()
    for requirements in ("requirements.txt", "layer/requirements.txt"):
        lines = (project / requirements).read_text().splitlines()
        assert not [line for line in lines if line.startswith("--")], lines
        assert any(line.endswith(f"=={__version__}") for line in lines), lines


def test_a_wheel_of_another_version_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    other = tmp_path / "serverless_worker-9.9.9-py3-none-any.whl"
    other.write_bytes(b"not a wheel")

    result = init(tmp_path / "app", tmp_path, "--wheel", str(other))

    assert result.returncode == 2
    assert WHEEL in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr
    assert not (tmp_path / "app").exists()


def readme_first_commands(readme: str) -> list[str]:
    """The README's first command block, each command without its comment, less the first
    line (it creates and activates the virtual environment the test makes itself)."""
    block = re.search(r"```bash\n(.*?)```", readme, re.DOTALL)
    assert block, readme[:2000]
    commands = [line.split("  #")[0].strip() for line in block.group(1).splitlines() if line.strip()]
    assert "-m venv" in commands[0] and "activate" in commands[0], commands
    return commands[1:]


def fresh_venv(where: Path) -> Path:
    """A new virtual environment of the Lambda runtime's Python; its bin/ directory."""
    python = subprocess.run(["bash", str(ROOT / "scripts" / "lambda-python.sh")], capture_output=True, text=True,
                            check=True).stdout.strip()
    subprocess.run([python, "-m", "venv", str(where)], check=True, timeout=120)
    return where / "bin"


def in_venv(bin_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in outside_pytest_env().items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    return {**env, "VIRTUAL_ENV": str(bin_dir.parent), "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"}


# Two fresh venvs, pip installs and the project's own test run: on a loaded machine that can
# take more than the suite's 300 s per test. This only bounds a hang (its steps' own limits).
@pytest.mark.timeout(1800)
def test_a_fresh_venv_with_the_wheel_inits_a_project_whose_readme_commands_pass(tmp_path: Path) -> None:
    # given the wheel of this version (what init vendors from this editable checkout)
    seed = tmp_path / "seed"
    assert init(seed, tmp_path).returncode == 0
    wheel = seed / "vendor" / WHEEL

    # and serverless-worker installed from it into a fresh virtual environment, as a user would
    user = fresh_venv(tmp_path / "user-venv")
    install = subprocess.run([str(user / "python"), "-m", "pip", "install", "-q", str(wheel)], env=in_venv(user),
                             capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr

    # when that installation writes a project (its wheel packed from the installed files)
    app = tmp_path / "app"
    made = init(app, tmp_path, cli=user / "serverless-worker")
    assert made.returncode == 0, made.stderr
    assert "packed from the installed package" in made.stdout
    with zipfile.ZipFile(app / "vendor" / WHEEL) as packed, zipfile.ZipFile(wheel) as built:
        assert sorted(packed.namelist()) == sorted(built.namelist())
        assert packed.testzip() is None

    # then the README's first commands pass in another fresh virtual environment, outside this
    # repository: the install, `serverless-worker local` with no arguments (its sandbox seeded
    # with the scaffold's own sample job, which it completes, its result shown), the tests
    project_venv = fresh_venv(tmp_path / "project-venv")
    commands = readme_first_commands((app / "README.md").read_text())
    assert commands[:2] == ["python -m pip install -r requirements.txt", "serverless-worker local"], commands
    outputs = []
    for command in commands:
        run = subprocess.run(["bash", "-c", command], cwd=app, env=in_venv(project_venv), capture_output=True,
                             text=True, timeout=900)
        assert run.returncode == 0, command + "\n" + run.stdout[-3000:] + run.stderr[-3000:]
        outputs.append(run.stdout)
    worked = outputs[1]
    assert "1 sample job from events/greet.json" in worked, worked
    assert re.search(r"^\s*done\s+1\b", worked, re.MULTILINE), worked
    assert '{"greeting": "Hello, Ada!"}' in worked, worked
    assert re.search(r"\b3 passed\b", outputs[-1]), outputs[-1][-2000:]
    # and serverless-worker there is the vendored wheel, with its command
    shown = subprocess.run([str(project_venv / "python"), "-m", "pip", "show", "-f", "serverless-worker"],
                           env=in_venv(project_venv), capture_output=True, text=True, timeout=60)
    assert f"Version: {__version__}" in shown.stdout
    assert subprocess.run([str(project_venv / "serverless-worker"), "--help"], capture_output=True,
                          timeout=60).returncode == 0


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

