"""The one module that patches moto's internals refuses a moto it was not written against,
and is the only code running on moto that reaches into moto's private modules."""

from __future__ import annotations

import ast
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from serverless_worker.errors import ConfigurationError
from serverless_worker.local import moto_adapter
from serverless_worker.local.moto_adapter import MOTO_REQUIREMENT, UnsupportedMotoError, check_moto_version

ROOT = Path(__file__).resolve().parents[2]
# moto's public entry points: starting its server, its decorator, its settings.
PUBLIC_MOTO = {"moto", "moto.server", "moto.core.config"}


@pytest.mark.parametrize("installed", ["5.2.6", "5.2.6.post1"])
def test_a_supported_moto_passes(installed: str) -> None:
    assert check_moto_version(installed) == installed


@pytest.mark.parametrize("installed", ["5.2.5", "5.2.7", "5.1.21", "5.3.0", "6.0.0", "4.2.14"])
def test_an_untested_moto_is_refused_with_what_to_install(installed: str) -> None:
    with pytest.raises(UnsupportedMotoError) as refused:
        check_moto_version(installed)
    message = str(refused.value)
    assert f"moto {installed} is installed" in message
    assert f"pip install '{MOTO_REQUIREMENT}'" in message
    assert "\n" not in message
    assert isinstance(refused.value, ConfigurationError)  # the CLI's one-line, exit-2 kind


def test_a_missing_moto_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(moto_adapter.metadata, "version", missing)
    with pytest.raises(UnsupportedMotoError, match="moto is not installed"):
        check_moto_version()


def test_the_installed_moto_is_the_one_checked() -> None:
    assert metadata.version("moto") == moto_adapter.MOTO_VERSION


def test_pyproject_pins_the_range_the_adapter_supports() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    requirements = [r for reqs in project["project"]["optional-dependencies"].values() for r in reqs]
    pins = {r.split("]", 1)[1] if "[" in r else r.removeprefix("moto")
            for r in requirements if r.startswith("moto")}
    assert pins == {MOTO_REQUIREMENT.removeprefix("moto")}, pins


def _moto_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    found |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    return {name for name in found if name == "moto" or name.startswith("moto.")}


def test_only_the_adapter_reaches_into_moto_internals() -> None:
    """The package, the benchmarks and the tests' shared support run on moto; only the
    adapter may import its private modules (a type-only import is not a patch)."""
    places = [ROOT / "layers/runtime/serverless_worker", ROOT / "benchmarks", ROOT / "tests/support"]
    offenders = {}
    for place in places:
        for path in place.rglob("*.py"):
            if path.name == "moto_adapter.py":
                continue
            private = _moto_imports(path) - PUBLIC_MOTO - {"moto.awslambda_simple.models"}
            if private:
                offenders[str(path.relative_to(ROOT))] = sorted(private)
    assert offenders == {}


_DEFERRED_BATCH = """
import sys
from contextlib import ExitStack
from serverless_worker.local import moto_adapter

with ExitStack() as stack:
    moto_adapter.patch_definite_jsonpaths(stack)  # loads the ASL interpreter, its Batch task too
    loaded_early = sorted(m for m in sys.modules if m.startswith(("moto.ec2", "moto.batch.models")))
    from moto.batch import batch_backends  # the backend lookup: the package's __init__ runs now
    from moto.batch.utils import JobStatus
    import moto.batch
    print(loaded_early, type(batch_backends).__name__, "moto.batch.models" in sys.modules,
          moto.batch.utils.JobStatus is JobStatus)
"""


def test_the_asl_interpreter_loads_without_moto_s_batch_and_ec2_models_until_used() -> None:
    """Importing the interpreter used to load moto's EC2 models (most of a long-running
    start); they load once something reads the Batch package, and Batch still works then."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _DEFERRED_BATCH], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["[]", "BackendDict", "True", "True"]
