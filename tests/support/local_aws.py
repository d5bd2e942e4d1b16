"""An embedded AWS for commands run as subprocesses: moto's server on loopback holding what
template.yaml deploys, under the names a local run gives them (``serverless_worker.stack``),
reached through ``AWS_ENDPOINT_URL``.

Usage (tests/cli/conftest.py makes it the ``local_aws`` fixture)::

    with local_aws_server() as aws:
        run_cli("invoke", "SchedulerFunction", "-e", "events/scheduler.json", env=aws.env())
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import os
import subprocess
import sys
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import requests

from .dynamodb import create_state_table
from .template import TEMPLATE_PATH

__all__ = ["CLI", "EXECUTOR", "REGION", "ROOT", "TABLE", "LocalAws", "local_aws_server", "run_cli"]

ROOT = TEMPLATE_PATH.parent
# The console script installed next to this interpreter: the real entry point, not main().
CLI = Path(sys.executable).with_name("serverless-worker")
REGION = "us-east-1"
# The names a local run of template.yaml gives its resources (serverless_worker.stack).
TABLE = "StateTable"
EXECUTOR = "ExecutorFunction"


@dataclass
class LocalAws:
    """moto's server with the stack's table (and executor function) under their local names."""

    url: str
    dynamodb: Any

    def env(self, **extra: str) -> dict[str, str]:
        """A subprocess environment that reaches only this server (no profile, no real credentials)."""
        base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SW_", "POWERTOOLS_"))}
        base.update({
            "AWS_ENDPOINT_URL": self.url, "AWS_DEFAULT_REGION": REGION,
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_CONFIG_FILE": "/nonexistent/aws-config",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
            "AWS_EC2_METADATA_DISABLED": "true",
        })
        base.update(extra)
        return base

    def ledger(self) -> list[dict[str, Any]]:
        """Every delivery item in the table, as plain values."""
        from boto3.dynamodb.types import TypeDeserializer

        plain = TypeDeserializer()
        items = self.dynamodb.scan(TableName=TABLE, ConsistentRead=True)["Items"]
        return [{k: plain.deserialize(v) for k, v in item.items()} for item in items
                if item["pk"]["S"].startswith("delivery#")]

    def item(self, pk: str) -> dict[str, Any] | None:
        from boto3.dynamodb.types import TypeDeserializer

        plain = TypeDeserializer()
        key = {"pk": {"S": pk}, "sk": {"S": pk.split("#", 1)[0]}}
        found = self.dynamodb.get_item(TableName=TABLE, Key=key, ConsistentRead=True).get("Item")
        return {k: plain.deserialize(v) for k, v in found.items()} if found else None


def _zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("app.py", "def lambda_handler(event, context):\n    return event\n")
    return buffer.getvalue()


@contextlib.contextmanager
def local_aws_server() -> Iterator[LocalAws]:
    """A fresh moto server: the state table, and the executor the scheduler fans out to.

    With ``use_docker`` off, moto accepts an asynchronous Invoke of the executor and runs
    nothing, so a tick's dispatch succeeds and the test runs the executor itself.
    """
    from moto.core.config import default_user_config
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    saved = copy.deepcopy(default_user_config)  # the server's config is this process's
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    try:
        # Backends are process-wide: start from nothing, whatever ran in this process before.
        requests.post(f"{url}/moto-api/reset", timeout=10)
        requests.post(f"{url}/moto-api/config", json={"lambda": {"use_docker": False}}, timeout=10)
        session = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                                        region_name=REGION)
        dynamodb = session.client("dynamodb", endpoint_url=url)
        create_state_table(dynamodb, TABLE)
        role = session.client("iam", endpoint_url=url).create_role(
            RoleName=f"sw-{uuid.uuid4().hex[:6]}", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        session.client("lambda", endpoint_url=url).create_function(
            FunctionName=EXECUTOR, Runtime="python3.13", Role=role, Handler="app.lambda_handler",
            Code={"ZipFile": _zip()}, Timeout=900)
        yield LocalAws(url=url, dynamodb=dynamodb)
    finally:
        with contextlib.suppress(requests.RequestException):
            requests.post(f"{url}/moto-api/reset", timeout=10)
        server.stop()
        default_user_config.clear()
        default_user_config.update(saved)


def run_cli(*args: str, env: dict[str, str], timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """``serverless-worker ARGS`` from the project directory, as a user runs it."""
    assert CLI.exists(), f"console script missing at {CLI}: pip install -e .[dev]"
    return subprocess.run([str(CLI), *args], capture_output=True, text=True, timeout=timeout, check=False,
                          cwd=ROOT, env=env)
