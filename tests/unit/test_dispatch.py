"""The dispatcher's Step Functions calls for callback tasks: a task that is over is an
answer, not an error; anything else is a DispatchError naming only the code; each client
is built once, on its first call. The executor's three event shapes (a delivery, a
delivery whose pull was full, a puller) as the executor function receives them. AWS is
moto (with its ASL interpreter and the in-process Lambda), in-process."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import boto3
import pytest
from botocore.config import Config
from moto import mock_aws

from serverless_worker.awsclients import LazyClient
from serverless_worker.local import moto_adapter
from serverless_worker.local.dispatcher import LocalDispatcher
from serverless_worker.local.moto_lambda import InProcessLambda, dummy_zip
from serverless_worker.local.observe import RunObserver
from serverless_worker.runtime.dispatch import AwsDispatcher, DispatchError
from support.aws_env import use_fake_aws_credentials
from support.waiting import HANG_SECONDS

REGION = "eu-west-1"
MOTO_CONFIG: Any = {"stepfunctions": {"execute_state_machine": True}}


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    use_fake_aws_credentials(monkeypatch, REGION)
    with mock_aws(config=MOTO_CONFIG):
        yield


def _unreachable_sfn() -> Any:
    """A real Step Functions client whose endpoint refuses connections at once."""
    return boto3.client("stepfunctions", region_name=REGION, endpoint_url="http://127.0.0.1:9",
                        aws_access_key_id="x", aws_secret_access_key="x",
                        config=Config(retries={"max_attempts": 1}, connect_timeout=1))


@pytest.mark.parametrize("call", ["fail", "heartbeat"])
def test_a_task_that_is_over_is_reported_as_such(aws: None, call: str) -> None:
    dispatcher = AwsDispatcher(executor_function=None, state_machine_arn=None)

    if call == "fail":
        sent = dispatcher.fail_task("no-such-task", error="LeaseLost", cause="renewal refused")
    else:
        sent = dispatcher.heartbeat_task("no-such-task")

    assert sent is False  # moto answers InvalidToken: there is no task to tell any more


@pytest.mark.parametrize("call", ["fail", "heartbeat"])
def test_an_unreachable_step_functions_is_a_dispatch_error(call: str) -> None:
    dispatcher = AwsDispatcher(executor_function=None, state_machine_arn=None, sfn_client=_unreachable_sfn())

    with pytest.raises(DispatchError) as raised:
        if call == "fail":
            dispatcher.fail_task("secret-task-token", error="LeaseLost", cause="renewal refused")
        else:
            dispatcher.heartbeat_task("secret-task-token")

    assert "EndpointConnectionError" in str(raised.value)
    assert "secret-task-token" not in str(raised.value)


def test_each_client_is_built_on_its_first_call_and_reused(aws: None) -> None:
    dispatcher = AwsDispatcher(executor_function="executor", state_machine_arn=None)
    sfn, lam = dispatcher._sfn, dispatcher._lambda
    assert isinstance(sfn, LazyClient) and isinstance(lam, LazyClient)
    assert not sfn.built and not lam.built

    dispatcher.heartbeat_task("no-such-task")
    built = sfn.client
    threads = [threading.Thread(target=dispatcher.fail_task, args=("no-such-task",),
                                kwargs={"error": "e", "cause": "c"}) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert dispatcher._sfn is sfn and sfn.client is built  # one client for every call and thread
    assert not lam.built  # a dispatcher that never invokes never builds the Lambda client


def test_the_local_dispatcher_without_a_state_machine_refuses_task_calls() -> None:
    dispatcher = LocalDispatcher(concurrency=1, executor_timeout=1.0, observer=RunObserver())
    try:
        with pytest.raises(DispatchError, match="no state machine"):
            dispatcher.fail_task("token", error="e", cause="c")
        with pytest.raises(DispatchError, match="no state machine"):
            dispatcher.heartbeat_task("token")
    finally:
        dispatcher.close()


def test_the_local_dispatcher_sends_task_calls_through_its_step_functions(aws: None) -> None:
    sfn = boto3.client("stepfunctions", region_name=REGION)
    dispatcher = LocalDispatcher(concurrency=1, executor_timeout=1.0, observer=RunObserver(),
                                 state_machine_arn="arn:aws:states:eu-west-1:123456789012:stateMachine:w",
                                 sfn_client=sfn)
    try:
        assert dispatcher.heartbeat_task("no-such-task") is False
        assert dispatcher.fail_task("no-such-task", error="e", cause="c") is False
    finally:
        dispatcher.close()


@pytest.fixture
def executor(monkeypatch: pytest.MonkeyPatch) -> Iterator[InProcessLambda]:
    """An executor function in moto whose invocations are recorded (its handler does nothing)."""
    use_fake_aws_credentials(monkeypatch, REGION)
    lambdas = InProcessLambda()
    lambdas.register("executor", lambda event, context: None)
    with ExitStack() as stack:
        stack.enter_context(mock_aws(config={"lambda": {"use_docker": False}}))
        moto_adapter.route_lambda_invoke(stack, lambdas.backend_invoke)
        iam = boto3.client("iam", region_name=REGION)
        role = iam.create_role(RoleName="executor", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        boto3.client("lambda", region_name=REGION).create_function(
            FunctionName="executor", Runtime="python3.13", Role=role, Handler="app.handler",
            Code={"ZipFile": dummy_zip()})
        yield lambdas
        lambdas.drain(HANG_SECONDS)


def test_the_executor_events_are_the_ledger_key_the_full_pull_flag_and_the_puller(
        executor: InProcessLambda) -> None:
    dispatcher = AwsDispatcher(executor_function="executor", state_machine_arn=None)

    dispatcher.invoke_executor("delivery#priostack#j1:r3")
    dispatcher.invoke_executor("delivery#priostack#j2:r3", pull=True)
    dispatcher.invoke_puller("work", by=1_700_000_123.5)

    assert [(i.function_name, i.invocation_type, i.event) for i in executor.invocations] == [
        ("executor", "Event", {"ledger_key": "delivery#priostack#j1:r3"}),  # today's, unchanged
        ("executor", "Event", {"ledger_key": "delivery#priostack#j2:r3", "pull": True}),
        ("executor", "Event", {"pull": {"handler": "work", "by": 1_700_000_123.5}}),
    ]


def test_a_puller_that_cannot_be_invoked_is_a_dispatch_error(aws: None) -> None:
    # given no executor function of that name: the invoke is refused
    dispatcher = AwsDispatcher(executor_function="no-such-executor", state_machine_arn=None)

    with pytest.raises(DispatchError, match="ResourceNotFoundException"):
        dispatcher.invoke_puller("work", by=1.0)
    with pytest.raises(DispatchError, match="no executor function"):
        AwsDispatcher(executor_function=None, state_machine_arn=None).invoke_puller("work", by=1.0)


def test_the_local_dispatcher_starts_no_pullers() -> None:
    dispatcher = LocalDispatcher(concurrency=1, executor_timeout=1.0, observer=RunObserver())
    try:
        with pytest.raises(DispatchError, match="starts no pullers"):
            dispatcher.invoke_puller("work", by=1.0)
    finally:
        dispatcher.close()
