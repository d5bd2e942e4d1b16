"""Probe: run real Python handlers and an ASL state machine entirely inside moto 5.2.

Lambda runs in-process: ``LambdaSimpleBackend.invoke`` is replaced so every invoke (boto3
``RequestResponse``/``Event`` and the state machine's Task states) calls a registered Python
function with a Lambda-like context. Findings and caveats: ``docs/contributing/moto-notes.md``.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any
from unittest import mock

import boto3
import pytest
from moto import mock_aws
from moto.awslambda_simple.models import LambdaSimpleBackend

from support.moto_lambda import (
    FakeLambdaContext,
    InProcessLambda,
    abort_running_executions,
    dummy_zip,
    patch_definite_jsonpaths,
)
from support.waiting import HANG_SECONDS, wait_for

pytestmark = pytest.mark.aws

REGION = "us-east-1"
MOTO_CONFIG: Any = {"lambda": {"use_docker": False}, "stepfunctions": {"execute_state_machine": True}}
SECRET = "s3cr3t-delivery-token"

Handler = Callable[[Any, "FakeLambdaContext"], Any]


# --------------------------------------------------------------------------- in-process Lambda


# --------------------------------------------------------------------------- fixtures


@dataclass
class Aws:
    lambdas: InProcessLambda
    retry_sleeps: list[float]
    role_arn: str
    iam: Any
    lambda_: Any
    sfn: Any

    def create_function(self, name: str, handler: Handler, timeout: int = 30) -> str:
        """Register ``handler`` and create a moto function for it; returns the function ARN."""
        self.lambdas.register(name, handler)
        response = self.lambda_.create_function(
            FunctionName=name,
            Runtime="python3.13",
            Role=self.role_arn,  # must exist in moto IAM (same account)
            Handler="app.handler",
            Code={"ZipFile": dummy_zip()},  # any bytes work without docker; Code={} breaks the function
            Timeout=timeout,
            MemorySize=256,
        )
        return str(response["FunctionArn"])

    def create_state_machine(self, definition: dict[str, Any], **substitutions: str) -> str:
        text = json.dumps(definition)
        for key, value in substitutions.items():  # moto does not do DefinitionSubstitutions
            text = text.replace("${" + key + "}", value)
        name = f"sm-{uuid.uuid4().hex[:8]}"
        return str(
            self.sfn.create_state_machine(name=name, definition=text, roleArn=self.role_arn)[
                "stateMachineArn"
            ]
        )

    def run(self, machine_arn: str, payload: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
        """Start an execution (always named: unnamed ones get ARN ``...:None``) and wait for it."""
        arn = self.sfn.start_execution(
            stateMachineArn=machine_arn, name=f"ex-{uuid.uuid4().hex[:8]}", input=json.dumps(payload)
        )["executionArn"]
        def finished() -> dict[str, Any] | None:
            described: dict[str, Any] = self.sfn.describe_execution(executionArn=arn)
            return described if described["status"] != "RUNNING" else None

        done: dict[str, Any] = wait_for(finished, timeout, "the execution to leave RUNNING")
        return done

    def history(self, execution_arn: str) -> str:
        events = self.sfn.get_execution_history(executionArn=execution_arn)["events"]
        return json.dumps(events, default=str)


@pytest.fixture
def aws() -> Iterator[Aws]:
    from moto.stepfunctions.parser.asl.component.common.retry import retrier_decl

    lambdas = InProcessLambda()
    retry_sleeps: list[float] = []
    # Retry IntervalSeconds are real time.sleep calls: record them, don't wait.
    instant_time = SimpleNamespace(sleep=retry_sleeps.append)

    def invoke(backend: LambdaSimpleBackend, *args: Any) -> bytes:
        return lambdas.backend_invoke(backend, *args)

    with ExitStack() as stack:
        stack.enter_context(mock_aws(config=MOTO_CONFIG))
        stack.enter_context(mock.patch.object(LambdaSimpleBackend, "invoke", invoke))
        stack.enter_context(mock.patch.object(retrier_decl, "time", instant_time))
        patch_definite_jsonpaths(stack)
        iam = boto3.client("iam", region_name=REGION)
        role_arn = iam.create_role(RoleName="probe-role", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        yield Aws(
            lambdas=lambdas,
            retry_sleeps=retry_sleeps,
            role_arn=role_arn,
            iam=iam,
            lambda_=boto3.client("lambda", region_name=REGION),
            sfn=boto3.client("stepfunctions", region_name=REGION),
        )
        abort_running_executions()
        lambdas.drain()
    if lambdas.background_errors:
        raise lambdas.background_errors[0]


# --------------------------------------------------------------------------- handlers under test


class WorkFailed(Exception):
    """A handler's own error: its class name becomes the Step Functions error name."""


class TransientServiceError(Exception):
    error_type = "Lambda.ServiceException"


@dataclass
class Worker:
    """Two tiny 'functions': ``work`` (slice/renew/callback steps) and ``give_back``."""

    sfn: Any
    slices_needed: int = 3
    fail_at: int | None = None
    transient_failures: int = 0
    calls: list[tuple[str, Any]] = field(default_factory=list)
    sliced_to_end: threading.Event = field(default_factory=threading.Event)

    def work(self, event: dict[str, Any], context: FakeLambdaContext) -> Any:
        self.calls.append((event["step"], event))
        assert context.function_name == "work"
        assert 0 < context.get_remaining_time_in_millis() <= 30_000
        if event["step"] == "slice":
            if self.transient_failures:
                self.transient_failures -= 1
                raise TransientServiceError("throttled")
            n = event["n"] + 1
            if n == self.fail_at:
                raise WorkFailed(f"slice {n} failed")
            more = n < self.slices_needed
            if not more:
                self.sliced_to_end.set()
            return {"n": n, "more": more}
        if event["step"] == "renew":
            # Deterministic: the first renewal reports the end of the slice loop, however
            # long the slices take on a loaded machine (the limit only bounds a hang).
            return {"finished": self.sliced_to_end.wait(HANG_SECONDS)}
        if event["step"] == "callback":
            token = event["task_token"]

            def complete_later() -> None:
                # The behaviour under test: a callback that arrives after the task returned,
                # from outside, as a real worker's would (moto's clock cannot be moved).
                time.sleep(0.2)
                self.sfn.send_task_heartbeat(taskToken=token)
                self.sfn.send_task_success(
                    taskToken=token, output=json.dumps({"result": "ok", "secret": SECRET})
                )

            threading.Thread(target=complete_later, daemon=True).start()
            return {"accepted": True}
        raise ValueError(event["step"])

    def give_back(self, event: dict[str, Any], context: FakeLambdaContext) -> Any:
        self.calls.append(("give_back", event))
        return {"gave_back": event["job"], "error": event["error"]["Error"]}


WORKFLOW: dict[str, Any] = {
    "StartAt": "Work",
    "States": {
        "Work": {
            "Type": "Parallel",
            "Branches": [
                {
                    "StartAt": "Slice",
                    "States": {
                        "Slice": {
                            "Type": "Task",
                            "Resource": "${WorkArn}",
                            "Parameters": {
                                "step": "slice",
                                "job.$": "$.job",
                                "n.$": "$.n",
                                "execution.$": "$$.Execution.Id",
                            },
                            "ResultPath": "$.slice",
                            "Retry": [
                                {
                                    "ErrorEquals": ["Lambda.ServiceException"],
                                    "IntervalSeconds": 2,
                                    "MaxAttempts": 3,
                                    "BackoffRate": 2,
                                }
                            ],
                            "Next": "More?",
                        },
                        "More?": {
                            "Type": "Choice",
                            "Choices": [
                                {"Variable": "$.slice.more", "BooleanEquals": True, "Next": "Advance"}
                            ],
                            "Default": "Sliced",
                        },
                        "Advance": {
                            "Type": "Pass",
                            "Parameters": {"job.$": "$.job", "n.$": "$.slice.n"},
                            "Next": "Slice",
                        },
                        "Sliced": {
                            "Type": "Pass",
                            "Parameters": {"done": True, "slices.$": "$.slice.n"},
                            "End": True,
                        },
                    },
                },
                {
                    "StartAt": "WaitToRenew",
                    "States": {
                        "WaitToRenew": {"Type": "Wait", "SecondsPath": "$.renew_seconds", "Next": "Renew"},
                        "Renew": {
                            "Type": "Task",
                            "Resource": "${WorkArn}",
                            "Parameters": {"step": "renew", "job.$": "$.job"},
                            "ResultPath": "$.renewal",
                            "Next": "Renewed?",
                        },
                        "Renewed?": {
                            "Type": "Choice",
                            "Choices": [
                                {
                                    "Variable": "$.renewal.finished",
                                    "BooleanEquals": True,
                                    "Next": "RenewEnded",
                                }
                            ],
                            "Default": "WaitToRenew",
                        },
                        "RenewEnded": {"Type": "Succeed"},
                    },
                },
            ],
            "ResultPath": "$.work",
            "Catch": [
                {"ErrorEquals": ["WorkFailed"], "ResultPath": "$.error", "Next": "GiveBack"},
                {"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "Unexpected"},
            ],
            "Next": "Finished?",
        },
        "Finished?": {
            "Type": "Choice",
            "Choices": [{"Variable": "$.work[0].done", "BooleanEquals": True, "Next": "Done"}],
            "Default": "Unexpected",
        },
        "Done": {
            "Type": "Pass",
            "Parameters": {"job.$": "$.job", "slices.$": "$.work[0].slices"},
            "End": True,
        },
        "GiveBack": {
            "Type": "Task",
            "Resource": "${GiveBackArn}",
            "Parameters": {"job.$": "$.job", "error.$": "$.error"},
            "ResultPath": "$.give_back",
            "Next": "GaveBack",
        },
        "GaveBack": {"Type": "Fail", "Error": "JobGivenBack", "Cause": "see the ledger"},
        "Unexpected": {"Type": "Fail", "Error": "Unexpected", "Cause": "no catcher matched"},
    },
}


def _workflow(aws: Aws, worker: Worker) -> str:
    return aws.create_state_machine(
        WORKFLOW,
        WorkArn=aws.create_function("work", worker.work),
        GiveBackArn=aws.create_function("give_back", worker.give_back),
    )


# --------------------------------------------------------------------------- tests


def test_parallel_slice_loop_and_renew_loop_succeed(aws: Aws) -> None:
    worker = Worker(sfn=aws.sfn, transient_failures=1)
    machine = _workflow(aws, worker)

    started = time.monotonic()
    execution = aws.run(machine, {"job": "job-1", "n": 0, "renew_seconds": 1})
    elapsed = time.monotonic() - started

    assert execution["status"] == "SUCCEEDED", execution
    assert json.loads(execution["output"]) == {"job": "job-1", "slices": 3}
    steps = [step for step, _ in worker.calls]
    assert steps.count("slice") == 4  # one Lambda.ServiceException retried, then 3 slices
    assert steps.count("renew") == 1
    assert aws.retry_sleeps == [2]  # IntervalSeconds, recorded instead of slept
    assert 1.0 <= elapsed < 10.0  # the Wait really waits (the upper bound only bounds a hang)
    first_slice = next(event for step, event in worker.calls if step == "slice")
    assert first_slice["execution"] == execution["executionArn"]  # $$.Execution.Id
    assert {i.invocation_type for i in aws.lambdas.invocations} == {"RequestResponse"}


def test_custom_error_is_caught_and_fallback_runs(aws: Aws) -> None:
    worker = Worker(sfn=aws.sfn, fail_at=2)
    machine = _workflow(aws, worker)

    started = time.monotonic()
    execution = aws.run(machine, {"job": "job-2", "n": 0, "renew_seconds": 30})
    assert time.monotonic() - started < 15.0  # not the 30 s Wait

    # The WorkFailed catcher matched (not States.ALL), and the 30 s Wait branch was cut short.
    assert execution["status"] == "FAILED"
    assert (execution["error"], execution["cause"]) == ("JobGivenBack", "see the ledger")
    give_back = [event for step, event in worker.calls if step == "give_back"]
    assert len(give_back) == 1
    assert give_back[0]["job"] == "job-2"
    assert give_back[0]["error"]["Error"] == "WorkFailed"
    assert json.loads(give_back[0]["error"]["Cause"])["errorMessage"] == "slice 2 failed"


def test_wait_for_task_token_completed_from_the_function_thread(aws: Aws) -> None:
    worker = Worker(sfn=aws.sfn)
    work_arn = aws.create_function("work", worker.work)
    machine = aws.create_state_machine(
        {
            "StartAt": "Callback",
            "States": {
                "Callback": {
                    "Type": "Task",
                    "Resource": "arn:aws:states:::lambda:invoke.waitForTaskToken",
                    "Parameters": {
                        "FunctionName": work_arn,
                        "Payload": {"step": "callback", "job.$": "$.job", "task_token.$": "$$.Task.Token"},
                    },
                    "TimeoutSeconds": 10,
                    "HeartbeatSeconds": 5,
                    "ResultSelector": {"result.$": "$.result"},
                    "ResultPath": "$.callback",
                    "End": True,
                }
            },
        }
    )

    execution = aws.run(machine, {"job": "job-3"})

    assert execution["status"] == "SUCCEEDED", execution
    assert json.loads(execution["output"]) == {"job": "job-3", "callback": {"result": "ok"}}
    # ResultSelector keeps the secret out of the state output, but NOT out of the history:
    # TaskSucceeded records the raw SendTaskSuccess output (as AWS does).
    assert SECRET not in execution["output"]
    assert SECRET in aws.history(execution["executionArn"])


def test_lambda_invoke_request_response_error_and_event(aws: Aws) -> None:
    release, done = threading.Event(), threading.Event()
    seen: list[FakeLambdaContext] = []

    def echo(event: Any, context: FakeLambdaContext) -> Any:
        seen.append(context)
        if event.get("boom"):
            raise WorkFailed("boom")
        if event.get("async"):
            assert release.wait(HANG_SECONDS)
            done.set()
        return {"echo": event}

    arn = aws.create_function("echo", echo)

    response = aws.lambda_.invoke(FunctionName="echo", Payload=json.dumps({"a": 1}))
    assert response["StatusCode"] == 200 and "FunctionError" not in response
    assert json.loads(response["Payload"].read()) == {"echo": {"a": 1}}
    assert (seen[0].invoked_function_arn, seen[0].memory_limit_in_mb) == (arn, 256)

    response = aws.lambda_.invoke(FunctionName=arn, Payload=json.dumps({"boom": True}))
    assert response["FunctionError"] == "Unhandled"
    assert json.loads(response["Payload"].read())["errorType"] == "WorkFailed"

    response = aws.lambda_.invoke(
        FunctionName="echo", InvocationType="Event", Payload=json.dumps({"async": True})
    )
    assert response["StatusCode"] == 202
    assert not done.is_set()  # answered while the handler is still blocked on its thread
    release.set()
    assert done.wait(HANG_SECONDS)

    with pytest.raises(aws.lambda_.exceptions.ResourceNotFoundException):
        aws.lambda_.invoke(FunctionName="missing", Payload=b"{}")


def test_known_moto_divergences_still_present(aws: Aws) -> None:
    """Canaries: when one fails after a moto upgrade, revisit the workaround in docs/contributing/moto-notes.md."""
    from moto.stepfunctions.parser.asl.utils.json_path import extract_json

    assert extract_json("$.work[0].done", {"work": [{"done": True}]}) == [True]  # AWS: True

    machine = aws.create_state_machine({"StartAt": "P", "States": {"P": {"Type": "Pass", "End": True}}})
    unnamed = aws.sfn.start_execution(stateMachineArn=machine)["executionArn"]
    assert unnamed.endswith(":None")  # AWS: a generated UUID name
