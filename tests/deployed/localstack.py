"""The deployed tier's side of LocalStack: the SAM CLI (build, deploy, delete) and a
deployed stack read back through the AWS APIs at ``AWS_ENDPOINT_URL``.

``DeployedStack`` offers what the AWS tier's helpers (tests/aws/e2e_support.py,
tests/reliability/invariants.py) read from ``env.stack``: ``dynamodb``, ``table_name``,
``env["SW_INSTANCE_ID"]`` and ``store()``, so the same ledger and invariant checks run
against the table in LocalStack.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from serverless_worker.state import DynamoStateStore

__all__ = ["REGION", "ROOT", "DeployedStack", "Sam", "clients", "install_test_handlers", "log_lines"]

REGION = "us-east-1"
ROOT = Path(__file__).resolve().parents[2]
# The handler package the tier adds to every built function (HandlerModule=deployed_tier):
# the AWS tier's own handler modules, unchanged, so both tiers run the same handlers.
_HANDLER_SOURCES = {"e2e.py": ROOT / "tests" / "aws" / "handlers_e2e.py",
                    "long.py": ROOT / "tests" / "aws" / "handlers_long.py"}
_FUNCTIONS = ("SchedulerFunction", "ExecutorFunction", "StepsFunction", "DrainFunction")
_CONFIG = Config(retries={"max_attempts": 5, "mode": "standard"}, connect_timeout=10, read_timeout=120)


def clients(service: str) -> Any:
    """A boto3 client for LocalStack (AWS_ENDPOINT_URL, set by the fixture)."""
    return boto3.client(service, region_name=REGION, config=_CONFIG)


def install_test_handlers(build_dir: Path) -> None:
    """Put the test handlers into every built function as the package ``deployed_tier``.

    ``sam build`` copies functions/ as it is; the deployed stack then loads this package
    through its HandlerModule parameter, as a user's stack loads theirs."""
    for name in _FUNCTIONS:
        package = build_dir / name / "deployed_tier"
        package.mkdir(parents=True, exist_ok=True)
        for target, source in _HANDLER_SOURCES.items():
            shutil.copyfile(source, package / target)
        (package / "__init__.py").write_text(
            '"""The AWS tier\'s handlers, for the deployed tier."""\nfrom . import e2e, long  # noqa: F401\n')


@dataclass
class Sam:
    """The SAM CLI of .venv-sam, run against LocalStack."""

    sam: str
    build_dir: Path
    bucket: str
    log_dir: Path

    def run(self, args: list[str], log_name: str, timeout: float = 900, *, cwd: Path = ROOT,
            env: dict[str, str] | None = None) -> float:
        """Run ``sam ARGS`` in ``cwd``; its output goes to log_dir/log_name. Returns the wall time."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / log_name
        started = time.monotonic()
        with log.open("w") as out:
            proc = subprocess.run([self.sam, *args], cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=timeout, check=False, env=env)
        took = time.monotonic() - started
        if proc.returncode != 0:
            tail = "\n".join(log.read_text().splitlines()[-40:])
            raise AssertionError(f"sam {args[0]} failed (exit {proc.returncode}, {log}):\n{tail}")
        return took

    def build(self) -> float:
        took = self.run(["build", "--build-dir", str(self.build_dir), "--parameter-overrides",
                         "Architecture=x86_64"], "sam-build.log")
        install_test_handlers(self.build_dir)
        return took

    def deploy(self, stack_name: str, parameters: dict[str, str], template: Path | None = None) -> float:
        """``sam deploy`` of the built ``template`` (the main stack's by default)."""
        # SAM splits overrides at spaces unless the value is quoted (rate(1 minute)).
        overrides = [f'{key}="{value}"' if " " in value else f"{key}={value}" for key, value in parameters.items()]
        template = template or self.build_dir / "template.yaml"
        return self.run(["deploy", "--template-file", str(template),
                         "--stack-name", stack_name, "--s3-bucket", self.bucket, "--s3-prefix", stack_name,
                         "--capabilities", "CAPABILITY_IAM", "--region", REGION, "--no-confirm-changeset",
                         "--no-fail-on-empty-changeset", "--parameter-overrides", *overrides],
                        f"sam-deploy-{stack_name}-{int(time.time())}.log")

    def delete(self, stack_name: str) -> float:
        return self.run(["delete", "--stack-name", stack_name, "--region", REGION, "--no-prompts",
                         "--s3-bucket", self.bucket, "--s3-prefix", stack_name],
                        f"sam-delete-{stack_name}.log")


@dataclass
class DeployedStack:
    """One deployed stack: its outputs, the clients, and what the AWS tier's helpers read."""

    name: str
    protocol: str
    parameters: dict[str, str]
    outputs: dict[str, str] = field(default_factory=dict)
    deploy_seconds: float = 0.0
    functions: tuple[str, ...] = _FUNCTIONS  # the logical ids of its functions

    def __post_init__(self) -> None:
        self.dynamodb = clients("dynamodb")
        self.lambda_client = clients("lambda")
        self.sfn = clients("stepfunctions")
        self.logs = clients("logs")
        self.sqs = clients("sqs")
        self.env = {"SW_INSTANCE_ID": self.name}  # InstanceId is empty: the stack's name

    def load_outputs(self) -> None:
        stack = clients("cloudformation").describe_stacks(StackName=self.name)["Stacks"][0]
        assert stack["StackStatus"] in ("CREATE_COMPLETE", "UPDATE_COMPLETE"), stack["StackStatus"]
        self.outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}

    @property
    def table_name(self) -> str:
        return self.outputs["StateTableName"]

    def store(self) -> DynamoStateStore:
        return DynamoStateStore(self.table_name, client=self.dynamodb)

    def alias(self, logical: str) -> str:
        """The `live` alias of a function: what the schedule and the stack invoke."""
        return f"{self.outputs[logical + 'Name']}:live"

    def invoke(self, logical: str, event: dict[str, Any] | None = None, *, asynchronous: bool = False) -> Any:
        """Invoke a function's live alias; a synchronous call raises on a function error."""
        response = self.lambda_client.invoke(FunctionName=self.alias(logical),
                                             InvocationType="Event" if asynchronous else "RequestResponse",
                                             Payload=json.dumps(event or {}).encode())
        if asynchronous:
            assert response["StatusCode"] == 202, response
            return None
        payload = json.loads(response["Payload"].read() or b"null")
        if response.get("FunctionError"):
            raise AssertionError(f"{logical} failed: {payload}")
        return payload

    def tick(self, window: float = 10.0) -> None:
        """A direct tick (asynchronous, as the schedule's): only ever in addition to the schedule."""
        self.invoke("SchedulerFunction", {"poll_window_seconds": window}, asynchronous=True)

    def executions(self) -> list[dict[str, Any]]:
        return self.sfn.list_executions(stateMachineArn=self.outputs["StateMachineArn"])["executions"]

    def log_groups(self) -> list[str]:
        """Every function's log group (LocalStack writes to /aws/lambda/<function>)."""
        names = [self.outputs[f"{fn}Name"] for fn in self.functions]
        return [f"/aws/lambda/{name}" for name in names]


def log_lines(logs: Any, group: str, pattern: str | None = None) -> list[str]:
    """Every message in a log group (optionally matching a filter pattern); [] if none yet."""
    lines: list[str] = []
    request: dict[str, Any] = {"logGroupName": group}
    if pattern:
        request["filterPattern"] = pattern
    while True:
        try:
            page = logs.filter_log_events(**request)
        except logs.exceptions.ResourceNotFoundException:
            return lines
        lines += [e["message"] for e in page.get("events", [])]
        token = page.get("nextToken")
        if not token or token == request.get("nextToken"):
            return lines
        request["nextToken"] = token


def endpoint() -> str:
    return os.environ["AWS_ENDPOINT_URL"]
