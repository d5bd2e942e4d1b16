"""The package builds as a wheel with its version: ``serverless_worker-X.Y.Z-py3-none-any.whl``
holding the runtime package and the ``serverless-worker`` console script, and
``serverless_worker.__version__`` is the version the metadata states.

The build runs offline (no index, no build isolation: setuptools and wheel are dev
dependencies) on a copy of the sources in tmp_path, so the worktree gets no build/ or
egg-info from it.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import serverless_worker
from serverless_worker._version import VERSION

ROOT = Path(__file__).resolve().parents[2]


def test_version_is_the_installed_metadata_and_the_one_source() -> None:
    assert serverless_worker.__version__ == importlib.metadata.version("serverless-worker") == VERSION
    assert VERSION.count(".") == 2 and all(part.isdigit() for part in VERSION.split("."))


def test_the_wheel_holds_the_package_and_the_console_script(tmp_path: Path) -> None:
    # given a copy of what the wheel is built from
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "layers/runtime/serverless_worker", src / "layers/runtime/serverless_worker",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))

    # when pip builds it, offline
    out = tmp_path / "dist"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "--no-index",
         "-q", "-w", str(out)],
        capture_output=True, text=True, timeout=240, env={**os.environ, "PIP_NO_INDEX": "1"})
    assert result.returncode == 0, result.stderr

    # then it is one pure-Python wheel named after the version
    wheels = list(out.glob("*.whl"))
    assert [w.name for w in wheels] == [f"serverless_worker-{VERSION}-py3-none-any.whl"]
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = set(wheel.namelist())
        info = f"serverless_worker-{VERSION}.dist-info"
        entry_points = wheel.read(f"{info}/entry_points.txt").decode()
        metadata = wheel.read(f"{info}/METADATA").decode()
    # the runtime package, the handler API, the local runner, the typed marker and init's project
    for module in ("__init__.py", "_version.py", "registry.py", "testing.py", "runtime/executor.py",
                   "protocols/pipelogiq.py", "local/worker.py", "cli/__init__.py", "py.typed",
                   "cli/project/template.yaml", "cli/project/functions/handlers.py.tmpl", "cli/project/gitignore"):
        assert f"serverless_worker/{module}" in names, module
    assert not [n for n in names if "__pycache__" in n or n.startswith(("tests/", "functions/"))]
    assert "[console_scripts]\nserverless-worker = serverless_worker.cli:main" in entry_points
    assert f"\nVersion: {VERSION}\n" in metadata and "\nName: serverless-worker\n" in metadata


def test_the_changelog_heads_its_newest_release_with_the_one_version() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    releases = [line for line in changelog.splitlines() if line.startswith("## [") and "Unreleased" not in line]
    assert releases and releases[0].startswith(f"## [{VERSION}]"), releases[:1]
