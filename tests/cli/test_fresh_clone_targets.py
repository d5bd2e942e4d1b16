"""CLI tier: a user's fresh clone, in an empty folder with nothing beside it (no ../shared host
helpers) and no Docker engine, runs every documented make target or stops it with one line.

The clone is this checkout's commit, with the working tree's own changes laid over it. A
``docker`` that answers no ``docker info`` stands first on the PATH (a machine without a
Docker engine, as this build machine is). The two targets that need containers
(``sam-local-invoke``, ``test-deployed``) are run for real: each must stop at once, before
installing anything, with one line naming what to install and no traceback. Every other
target in ``make help`` is run as ``make -n`` (its whole recipe resolved): it must resolve
within the clone, reaching for nothing beside it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.cli

ROOT = Path(__file__).resolve().parents[2]
CONTAINER_TARGETS = {"sam-local-invoke": "needs Docker", "test-deployed": "needs LocalStack"}


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=120).stdout


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clone of this commit in an empty folder, with the working tree's changes on top."""
    folder = tmp_path_factory.mktemp("empty")
    target = folder / "serverless-worker"
    _git("clone", "--quiet", "--no-checkout", str(ROOT), str(target), cwd=folder)
    _git("checkout", "--quiet", _git("rev-parse", "HEAD").strip(), cwd=target)
    for name in _git("ls-files", "--modified", "--others", "--exclude-standard", "-z").split("\0"):
        if not name:
            continue
        source, copy = ROOT / name, target / name
        if source.exists():
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy)
        elif copy.exists():
            copy.unlink()
    assert not (folder / "shared").exists()
    return target


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """This environment on a machine with no Docker engine, and none of the helpers' variables."""
    bin_dir = tmp_path_factory.mktemp("no-docker-bin")
    docker = bin_dir / "docker"
    docker.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    docker.chmod(0o755)
    skip = ("SAM_LOCAL_PODMAN", "LOCALSTACK_HOST", "LOCALSTACK_CLI", "AWS_ENDPOINT_URL", "VIRTUAL_ENV", "MAKEFLAGS",
            "MAKELEVEL", "MFLAGS")
    base = {k: v for k, v in os.environ.items() if k not in skip and not k.startswith(("SWTEST_", "PYTEST_"))}
    return {**base, "PATH": f"{bin_dir}{os.pathsep}{base.get('PATH', '')}"}


def make(clone: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", *args], cwd=clone, env=env, capture_output=True, text=True, timeout=300,
                          check=False)


def documented(clone: Path, env: dict[str, str]) -> list[str]:
    listed = make(clone, env, "help")
    assert listed.returncode == 0, listed.stderr
    return re.findall(r"^\s+make (\S+)", listed.stdout, re.MULTILINE)


@pytest.mark.parametrize("target", sorted(CONTAINER_TARGETS))
def test_a_container_target_stops_at_once_with_one_line_naming_what_to_install(
        clone: Path, env: dict[str, str], target: str) -> None:
    assert target in documented(clone, env)

    result = make(clone, env, target)

    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == "", result.stdout          # nothing installed or built first
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert f"make {target}: {CONTAINER_TARGETS[target]}" in lines[0], lines[0]
    assert "https://docs.docker.com/get-docker/" in lines[0] and "Traceback" not in result.stderr
    assert not (clone / ".venv").exists()


def test_every_other_documented_target_resolves_within_the_clone(clone: Path, env: dict[str, str]) -> None:
    targets = [target for target in documented(clone, env) if target not in CONTAINER_TARGETS]
    assert {"test", "run", "lint", "sam-build", "sam-validate", "dist", "iam-scan"} <= set(targets), targets

    for target in targets:
        result = make(clone, env, "-n", target)
        assert result.returncode == 0, f"make -n {target}:\n{result.stdout}{result.stderr}"
        recipe = result.stdout + result.stderr
        assert "shared/tools" not in recipe and str(ROOT) not in recipe, f"make -n {target}:\n{recipe}"
