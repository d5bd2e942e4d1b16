"""Which container tools ``make sam-local-invoke`` and ``make test-deployed`` pick
(scripts/container_tools.py), given what is on the PATH and in the environment: the user's
Docker (and LocalStack's CLI) first, the host helper beside the repository (or the one a
variable names) second, and with neither one line naming what to install.

A fake ``docker`` on the PATH stands in for an engine that answers ``docker info`` (or does
not); the helper is a file in a temporary ``../shared/tools`` beside a temporary root.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "container_tools.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("container_tools", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["container_tools"] = module
    spec.loader.exec_module(module)
    return module


tools = _load()


def tool(bin_dir: Path, name: str, exit_status: int) -> None:
    """A stand-in for ``name`` on the PATH that exits with ``exit_status``."""
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\nexit {exit_status}\n")
    path.chmod(0o755)


@pytest.fixture
def machine(tmp_path: Path) -> dict[str, Path]:
    """A repository root with nothing beside it, and an empty bin directory for the PATH."""
    root = tmp_path / "work" / "repo"
    root.mkdir(parents=True)
    return {"root": root, "bin": tmp_path / "bin", "helpers": tmp_path / "work" / "shared" / "tools"}


def env_for(machine: dict[str, Path], **extra: str) -> dict[str, str]:
    machine["bin"].mkdir(exist_ok=True)
    return {"PATH": f"{machine['bin']}{os.pathsep}/usr/bin{os.pathsep}/bin", **extra}


def helper(machine: dict[str, Path], name: str) -> Path:
    machine["helpers"].mkdir(parents=True, exist_ok=True)
    path = machine["helpers"] / name
    path.write_text("#!/bin/bash\n")
    return path


def choose(target: str, machine: dict[str, Path], env: dict[str, str], helper: str | None = None) -> str:
    return str(tools.choose(target, env=env, helper=helper, root=machine["root"]))


def test_docker_that_answers_comes_first_even_beside_a_host_helper(machine: dict[str, Path]) -> None:
    tool(machine["bin"], "docker", 0)
    tool(machine["bin"], "localstack", 0)
    helper(machine, "sam-local-podman.sh")
    helper(machine, "localstack-host.sh")
    env = env_for(machine)

    assert choose("sam-local-invoke", machine, env) == "docker"
    assert choose("test-deployed", machine, env) == f"docker {machine['bin'] / 'localstack'}"


def test_without_docker_the_host_helper_beside_the_repository_is_the_fallback(machine: dict[str, Path]) -> None:
    tool(machine["bin"], "docker", 1)  # the CLI is there, no engine answers (as on this build machine)
    podman = helper(machine, "sam-local-podman.sh")
    host = helper(machine, "localstack-host.sh")
    env = env_for(machine)

    assert choose("sam-local-invoke", machine, env) == f"host {podman}"
    assert choose("test-deployed", machine, env) == f"host {host}"


def test_a_variable_names_another_helper_and_an_endpoint_wins_for_localstack(machine: dict[str, Path],
                                                                            tmp_path: Path) -> None:
    tool(machine["bin"], "docker", 0)
    mine = tmp_path / "my-helper.sh"
    mine.write_text("#!/bin/bash\n")
    env = env_for(machine)

    assert choose("sam-local-invoke", machine, env, helper=str(mine)) == f"host {mine}"
    assert choose("test-deployed", machine, env_for(machine, AWS_ENDPOINT_URL="http://127.0.0.1:4566"),
                  helper=str(mine)) == "endpoint http://127.0.0.1:4566"
    # SAM_LOCAL_PODMAN= (empty) insists on the Docker engine
    assert choose("sam-local-invoke", machine, env, helper="") == "docker"


@pytest.mark.parametrize(("target", "names"), [
    ("sam-local-invoke", ["needs Docker", "https://docs.docker.com/get-docker/", "../shared/tools/sam-local-podman.sh",
                          "SAM_LOCAL_PODMAN=PATH"]),
    ("test-deployed", ["needs LocalStack", "https://docs.docker.com/get-docker/", "pip install localstack",
                       "AWS_ENDPOINT_URL", "../shared/tools/localstack-host.sh"]),
])
def test_with_neither_one_line_names_what_to_install(machine: dict[str, Path], target: str,
                                                     names: list[str]) -> None:
    tool(machine["bin"], "docker", 1)
    env = env_for(machine)

    with pytest.raises(tools.NoTools) as missing:
        choose(target, machine, env)

    line = str(missing.value)
    assert "\n" not in line and line.startswith(f"make {target}: ")
    assert all(name in line for name in names), line


def test_docker_without_the_localstack_cli_names_the_cli(machine: dict[str, Path]) -> None:
    tool(machine["bin"], "docker", 0)

    with pytest.raises(tools.NoTools, match=r"the LocalStack CLI is not installed: pip install localstack"):
        choose("test-deployed", machine, env_for(machine))


def test_the_check_command_prints_that_line_alone_and_exits_2(machine: dict[str, Path]) -> None:
    tool(machine["bin"], "docker", 1)

    result = subprocess.run([sys.executable, str(SCRIPT), "check", "sam-local-invoke", "--helper", "/no/such"],
                            env=env_for(machine), capture_output=True, text=True, timeout=60, check=False)

    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "SAM_LOCAL_PODMAN=/no/such names no file" in result.stderr
