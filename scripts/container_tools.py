"""Which container tools ``make sam-local-invoke`` and ``make test-deployed`` use: a user's own
first, this build machine's host helpers second, and with neither one line naming what to
install. Standard library only, so the Makefile runs it before any virtual environment exists.

``sam-local-invoke``:

1. ``SAM_LOCAL_PODMAN`` given (``--helper``): a path is that host helper; empty is the Docker
   engine already running.
2. Otherwise a Docker engine that answers (``docker info``): ``sam local invoke`` on Docker, as
   SAM documents it (SAM pulls its images itself).
3. Otherwise the host helper beside this repository (``../shared/tools/sam-local-podman.sh``:
   podman behind a Docker API and a locally built Lambda image, for machines without Docker).

``test-deployed`` (LocalStack):

1. ``AWS_ENDPOINT_URL`` set: that LocalStack, already running.
2. ``LOCALSTACK_HOST`` given (``--helper``): that host helper.
3. A Docker engine that answers: LocalStack's own CLI (``localstack start``/``wait``/``stop``),
   on the ``PATH`` or named by ``LOCALSTACK_CLI``.
4. Otherwise the host helper beside this repository (``../shared/tools/localstack-host.sh``).

Usage::

    python3 scripts/container_tools.py check sam-local-invoke [--helper PATH]   # exit 2 and one line if none
    python3 scripts/container_tools.py which test-deployed                      # prints the choice
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DOCKER_INSTALL", "HOST_HELPERS", "LOCALSTACK_INSTALL", "Choice", "NoTools", "choose", "docker_answers"]

ROOT = Path(__file__).resolve().parents[1]
DOCKER_INSTALL = "https://docs.docker.com/get-docker/"
LOCALSTACK_INSTALL = "https://docs.localstack.cloud/getting-started/installation/"
# target -> (the helper beside this repository, the variable that names another)
HOST_HELPERS = {"sam-local-invoke": ("sam-local-podman.sh", "SAM_LOCAL_PODMAN"),
                "test-deployed": ("localstack-host.sh", "LOCALSTACK_HOST")}
_DOCKER_TIMEOUT = 20.0


@dataclass(frozen=True)
class Choice:
    """What a target runs on: ``docker`` (the engine; for LocalStack with its CLI at
    ``path``), ``host`` (the host helper at ``path``) or ``endpoint`` (a LocalStack at ``url``)."""

    kind: str
    path: str = ""
    url: str = ""

    def __str__(self) -> str:
        return " ".join(part for part in (self.kind, self.path or self.url) if part)


class NoTools(Exception):
    """Neither the user's tools nor a host helper: the message is the one line to print."""


def docker_answers(env: Mapping[str, str]) -> bool:
    """Whether a Docker engine answers here (the ``docker`` CLI on the PATH, and ``docker info``)."""
    docker = shutil.which("docker", path=env.get("PATH"))
    if docker is None:
        return False
    try:
        return subprocess.run([docker, "info"], env=dict(env), capture_output=True, timeout=_DOCKER_TIMEOUT,
                              check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _default_helper(target: str, root: Path) -> Path:
    return root.parent / "shared" / "tools" / HOST_HELPERS[target][0]


def choose(target: str, *, env: Mapping[str, str], helper: str | None = None, root: Path = ROOT,
           docker: Callable[[Mapping[str, str]], bool] = docker_answers) -> Choice:
    """The tools ``target`` uses (see the module docstring); NoTools when there are none.
    ``helper``: the variable naming a host helper, as given (``None``: not given)."""
    if target not in HOST_HELPERS:
        raise ValueError(f"unknown target {target!r}: one of {', '.join(HOST_HELPERS)}")
    name, variable = HOST_HELPERS[target]
    if target == "test-deployed" and env.get("AWS_ENDPOINT_URL"):
        return Choice("endpoint", url=env["AWS_ENDPOINT_URL"])
    if helper:
        if not Path(helper).is_file():
            raise NoTools(f"make {target}: {variable}={helper} names no file (the host helper); leave "
                          f"{variable} unset to use Docker")
        return Choice("host", path=helper)
    if helper == "" and target == "sam-local-invoke":  # empty: the Docker engine already running
        if not docker(env):
            raise NoTools(f"make {target}: SAM_LOCAL_PODMAN= asks for the Docker engine, and none answers "
                          f"(`docker info`); install Docker ({DOCKER_INSTALL}) and start it")
        return Choice("docker")
    if docker(env):
        if target == "sam-local-invoke":
            return Choice("docker")
        cli = env.get("LOCALSTACK_CLI") or shutil.which("localstack", path=env.get("PATH"))
        if not cli:
            raise NoTools(f"make {target}: Docker answers here but the LocalStack CLI is not installed: "
                          f"pip install localstack ({LOCALSTACK_INSTALL}), or set AWS_ENDPOINT_URL to a "
                          "running LocalStack")
        return Choice("docker", path=cli)
    default = _default_helper(target, root)
    if default.is_file():
        return Choice("host", path=str(default))
    if target == "sam-local-invoke":
        raise NoTools(f"make {target}: needs Docker for `sam local invoke`: install it ({DOCKER_INSTALL}) and "
                      f"start it (no Docker engine answers here, and no host helper is at ../shared/tools/{name}; "
                      f"{variable}=PATH names one)")
    raise NoTools(f"make {target}: needs LocalStack: install Docker ({DOCKER_INSTALL}) and the LocalStack CLI "
                  f"(pip install localstack), or set AWS_ENDPOINT_URL to a running LocalStack (no Docker engine "
                  f"answers here, and no host helper is at ../shared/tools/{name}; {variable}=PATH names one)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("check", "which"))
    parser.add_argument("target", choices=sorted(HOST_HELPERS))
    parser.add_argument("--helper", default=None, help="the variable naming a host helper, as given")
    args = parser.parse_args(argv)
    try:
        choice = choose(args.target, env=os.environ, helper=args.helper)
    except NoTools as missing:
        print(missing, file=sys.stderr)
        return 2
    if args.action == "which":
        print(choice)
    return 0


if __name__ == "__main__":
    sys.exit(main())
