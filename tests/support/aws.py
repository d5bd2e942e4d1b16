"""The deployed stack, emulated: moto with the table, functions and state machine built
from template.yaml and the real ASL file, each function running its real entry point
(functions/*/app.py) in-process, against a sandbox job server on loopback.

Usage (see tests/aws/conftest.py)::

    stack = WorkerStack.start(monkeypatch, sandbox_url=..., protocol="pipelogiq", api_key=...)
    stack.invoke("SchedulerFunction", {"poll_window_seconds": 2})
"""

from __future__ import annotations

import importlib.util
import json
import uuid
from collections.abc import Callable
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import boto3
import pytest
from moto import mock_aws

from serverless_worker.local import moto_adapter
from serverless_worker.local.template import param_default, state_machine_definition

from .dynamodb import create_state_table
from .moto_lambda import InProcessLambda, abort_running_executions, dummy_zip
from .template import TEMPLATE_PATH, load_template
from .waiting import HANG_SECONDS, wait_for

__all__ = ["FUNCTIONS", "MOTO_CONFIG", "REGION", "WorkerStack"]

REGION = "us-east-1"
MOTO_CONFIG: Any = {"lambda": {"use_docker": False}, "stepfunctions": {"execute_state_machine": True}}
ROOT = TEMPLATE_PATH.parent
FUNCTIONS = ("SchedulerFunction", "ExecutorFunction", "StepsFunction", "DrainFunction")


def _load_entry(code_uri: str, handler: str) -> Callable[[Any, Any], Any]:
    """Import ``CodeUri/<module path>.py`` by file and return its handler function."""
    module_path, _, function = handler.rpartition(".")
    path = ROOT / code_uri / (module_path.replace(".", "/") + ".py")
    name = "sw_fn_" + module_path.replace("/", "_").replace(".", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader, path
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, function)  # type: ignore[no-any-return]


@dataclass
class WorkerStack:
    """A running emulated stack; ``close()`` (or the fixture) tears it down."""

    lambdas: InProcessLambda
    lambda_client: Any
    sfn: Any
    dynamodb: Any
    table_name: str
    state_machine_arn: str
    function_names: dict[str, str]
    retry_sleeps: list[float]
    env: dict[str, str] = field(default_factory=dict)
    _stack: ExitStack = field(default_factory=ExitStack)

    # -- building ---------------------------------------------------------------
    @classmethod
    def start(cls, monkeypatch: pytest.MonkeyPatch, *, protocol: str, base_url: str, api_key: str,
              handlers: list[str] | None = None, handler_module: str | None = None,
              settings: dict[str, Any] | None = None) -> WorkerStack:
        from serverless_worker.runtime.entry import reset_services

        template = load_template()
        stack = ExitStack()
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        lambdas = InProcessLambda()
        retry_sleeps: list[float] = []
        stack.enter_context(mock_aws(config=MOTO_CONFIG))
        # Looked up per call, so a test may replace lambdas.backend_invoke (to throttle, to fail).
        moto_adapter.route_lambda_invoke(stack, lambda *args: lambdas.backend_invoke(*args))
        moto_adapter.record_retry_sleeps(stack, retry_sleeps.append)  # recorded, not slept
        moto_adapter.patch_definite_jsonpaths(stack)
        moto_adapter.serialize_dynamodb(stack)

        iam = boto3.client("iam", region_name=REGION)
        role = iam.create_role(RoleName=f"sw-{uuid.uuid4().hex[:6]}",
                               AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        dynamodb = boto3.client("dynamodb", region_name=REGION)
        table = create_state_table(dynamodb).name
        lambda_client = boto3.client("lambda", region_name=REGION)
        sfn = boto3.client("stepfunctions", region_name=REGION)

        resources = template["Resources"]
        globals_ = template.get("Globals", {}).get("Function", {})
        names: dict[str, str] = {}
        for logical in FUNCTIONS:
            props = resources[logical]["Properties"]
            entry = _load_entry(props.get("CodeUri", globals_.get("CodeUri")), props["Handler"])
            fn_name = f"{logical}-{uuid.uuid4().hex[:6]}"
            timeout = int(param_default(template, props.get("Timeout", globals_.get("Timeout", 3))))
            lambdas.register(fn_name, entry)
            runtime = props.get("Runtime", globals_.get("Runtime", "python3.13"))
            lambda_client.create_function(FunctionName=fn_name, Runtime=runtime, Role=role, Handler=props["Handler"],
                                          Code={"ZipFile": dummy_zip()}, Timeout=timeout, MemorySize=256)
            names[logical] = fn_name
        steps = lambda_client.get_function(FunctionName=names["StepsFunction"])
        steps_arn = steps["Configuration"]["FunctionArn"]
        # moto does not apply DefinitionSubstitutions; this refuses a key without a value.
        definition = state_machine_definition("WorkerStateMachine", {"StepsFunctionArn": steps_arn},
                                              TEMPLATE_PATH)
        sm_arn = sfn.create_state_machine(name=f"worker-{uuid.uuid4().hex[:6]}", definition=definition,
                                          roleArn=role, type="STANDARD")["stateMachineArn"]

        env = {
            "SW_PROTOCOL": protocol,
            "SW_BASE_URL": base_url,
            "SW_API_KEY": api_key,
            "SW_HANDLERS": ",".join(handlers or []),
            "SW_HANDLER_MODULE": handler_module or str(ROOT / "functions" / "handlers"),
            "SW_TABLE_NAME": table,
            "SW_EXECUTOR_FUNCTION_NAME": names["ExecutorFunction"],
            "SW_STATE_MACHINE_ARN": sm_arn,
            "SW_INSTANCE_ID": f"test-{uuid.uuid4().hex[:6]}",
            "SW_POLL_WINDOW_SECONDS": "2",
            "SW_LEASE_RENEW_SECONDS": "1",
            "SW_REPORT_MARGIN_SECONDS": "2",
            "POWERTOOLS_SERVICE_NAME": "serverless-worker",
            "POWERTOOLS_METRICS_NAMESPACE": "ServerlessWorker",
            "POWERTOOLS_DEV": "false",
        }
        env.update({f"SW_{k.upper()}": (json.dumps(v) if isinstance(v, dict | list) else str(v))
                    for k, v in (settings or {}).items()})
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        reset_services()
        return cls(lambdas=lambdas, lambda_client=lambda_client, sfn=sfn, dynamodb=dynamodb, table_name=table,
                   state_machine_arn=sm_arn, function_names=names, retry_sleeps=retry_sleeps, env=env,
                   _stack=stack)

    # -- using ------------------------------------------------------------------
    def invoke(self, logical: str, event: dict[str, Any] | None = None) -> Any:
        """Invoke a function synchronously through the Lambda API; raise on a function error."""
        response = self.lambda_client.invoke(FunctionName=self.function_names[logical],
                                             Payload=json.dumps(event or {}).encode())
        payload = json.loads(response["Payload"].read() or b"null")
        if response.get("FunctionError"):
            raise AssertionError(
                f"{logical} failed: {payload.get('errorType')}: {payload.get('errorMessage')}")
        return payload

    def services(self) -> Any:
        from serverless_worker.runtime.entry import services_from_environment

        return services_from_environment()

    def store(self) -> Any:
        return self.services().store

    def executions(self) -> list[dict[str, Any]]:
        return self.sfn.list_executions(stateMachineArn=self.state_machine_arn)["executions"]

    def wait_for_executions(self, timeout: float = HANG_SECONDS) -> list[dict[str, Any]]:
        def finished() -> list[dict[str, Any]]:
            executions = self.executions()
            return executions if executions and all(e["status"] != "RUNNING" for e in executions) else []

        executions: list[dict[str, Any]] = wait_for(finished, timeout, "every execution to finish", interval=0.1)
        return executions

    def history(self, execution_arn: str) -> str:
        events = self.sfn.get_execution_history(executionArn=execution_arn)["events"]
        return json.dumps(events, default=str)

    def wait_idle(self, timeout: float = HANG_SECONDS) -> None:
        """Wait for every Event invocation (executor fan-out) to finish (the limit only
        bounds a hang)."""
        self.lambdas.drain(timeout)

    def close(self) -> None:
        from serverless_worker.runtime.entry import reset_services

        try:
            abort_running_executions()
            self.lambdas.drain(HANG_SECONDS)
        finally:
            with suppress(Exception):
                self.services().close()
            reset_services()
            self._stack.close()
        if self.lambdas.background_errors:
            raise self.lambdas.background_errors[0]


