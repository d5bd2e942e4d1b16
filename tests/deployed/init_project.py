"""The project ``serverless-worker init`` writes, deployed as its README says, beside the
main stacks: written into a temporary directory, built there with ``sam build`` (its layer
from the wheel in its ``vendor/``), its API key in Secrets Manager as ``<stack>/api-key``,
an SNS topic for its alarms, then a plain ``sam deploy`` of the built template with the
README's parameters, against a Pipelogiq sandbox on loopback (the template's default
protocol). Its jobs are the example handler's, ``greet``: one greeting, one rejection.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployed.localstack import DeployedStack, Sam, clients

__all__ = ["GREETINGS", "INIT_FUNCTIONS", "INIT_PROTOCOL", "InitStack", "build_init_project", "init_parameters"]

INIT_PROTOCOL = "pipelogiq"
INIT_FUNCTIONS = ("SchedulerFunction", "ExecutorFunction", "DrainFunction")
# The example handler's inputs: "nobody" is its business rejection (NO_ONE_TO_GREET).
GREETINGS = [{"name": "Ada"}, {"name": "nobody"}]


@dataclass
class InitStack:
    """The init project, its stack and what the summary line says about it."""

    project: Path
    build_seconds: float
    env: Any = None  # aws.conftest.Env: the sandbox, its admin API and the DeployedStack
    topic_arn: str = ""
    jobs: dict[str, int] = field(default_factory=dict)
    schedule_ticks: int = 0
    notes: list[str] = field(default_factory=list)
    delete: Future[float] | None = None  # its sam delete, running beside the main stacks' tests

    @property
    def stack(self) -> DeployedStack:
        return self.env.stack  # type: ignore[no-any-return]

    @property
    def template(self) -> Path:
        return self.project / ".aws-sam" / "build" / "template.yaml"


def build_init_project(sam: Sam, parent: Path, name: str) -> InitStack:
    """``serverless-worker init parent/name``, then ``sam build`` in it with the python3.13 of
    PYTHON (the Makefile's) first on the PATH, as the README's ``sam build`` needs."""
    project = parent / name
    command = shutil.which("serverless-worker", path=str(Path(sys.executable).parent)) or "serverless-worker"
    made = subprocess.run([command, "init", str(project)], capture_output=True, text=True, timeout=300, check=False)
    assert made.returncode == 0, f"serverless-worker init failed:\n{made.stdout}{made.stderr}"
    env = dict(os.environ)
    python = os.environ.get("PYTHON") or shutil.which("python3.13")
    if python:
        env["PATH"] = os.pathsep.join([str(Path(python).parent), env.get("PATH", "")])
    took = sam.run(["build"], "sam-build-init.log", cwd=project, env=env)
    return InitStack(project=project, build_seconds=took)


def init_parameters(stack_name: str, base_url: str, key: str) -> dict[str, str]:
    """The README's steps before ``sam deploy``: the key as a secret named ``<stack>/api-key``
    and a topic for the alarms; then the parameters it lists."""
    secret = clients("secretsmanager").create_secret(Name=f"{stack_name}/api-key", SecretString=key)["ARN"]
    topic = clients("sns").create_topic(Name=f"{stack_name}-alarms")["TopicArn"]
    return {"Protocol": INIT_PROTOCOL, "BaseUrl": base_url, "ApiKeySecretArn": secret, "AlarmTopicArn": topic}
