"""Fan-out: start one executor per delivery, or one state-machine execution for
long-running handlers. Payloads carry only the ledger key, and where executors keep
pulling (setting ``self_pull``, docs/limits.md) a flag saying the pull was full, or, for a
puller the scheduler starts without a delivery, the handler to pull for and by when.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import awsclients
from ..awsclients import LambdaClient, StepFunctionsClient
from ..errors import DispatchError

if TYPE_CHECKING:
    import botocore.exceptions

__all__ = ["Dispatcher", "AwsDispatcher", "executor_event", "execution_input", "puller_event"]


def executor_event(ledger_key: str, *, pull: bool = False) -> dict[str, Any]:
    """The executor's whole event: nothing secret, nothing large. ``pull``: the pull that
    brought this delivery came back full, so after it the executor may pull the next."""
    return {"ledger_key": ledger_key, "pull": True} if pull else {"ledger_key": ledger_key}


def puller_event(handler: str, by: float) -> dict[str, Any]:
    """A puller's event: an executor with no delivery yet, which pulls for ``handler`` only if
    it starts before ``by`` (epoch seconds; the scheduler counts its slot until then)."""
    return {"pull": {"handler": handler, "by": by}}


def execution_input(ledger_key: str, handover_epoch: str | None = None) -> dict[str, Any]:
    return {"ledger_key": ledger_key, "handover_epoch": handover_epoch}


class Dispatcher(ABC):
    """Where deliveries go once they are in the ledger, and the Step Functions calls the
    long-running steps make about their callback task."""

    @abstractmethod
    def invoke_executor(self, ledger_key: str, *, pull: bool = False) -> None:
        """Start the executor for one delivery without waiting for it; ``pull``: its pull
        came back full (see :func:`executor_event`)."""

    def invoke_puller(self, handler: str, by: float) -> None:
        """Start an executor that pulls for ``handler`` itself (see :func:`puller_event`)."""
        raise DispatchError(f"{type(self).__name__} starts no pullers")

    @abstractmethod
    def start_execution(self, ledger_key: str, handover_epoch: str | None = None) -> None:
        """Start the long-running state machine for one delivery."""

    def fail_task(self, task_token: str, *, error: str, cause: str) -> bool:
        """End a callback task as failed; ``False`` when the task had already ended."""
        raise DispatchError(f"{type(self).__name__} has no state machine")

    def heartbeat_task(self, task_token: str) -> bool:
        """Keep a callback task alive; ``False`` when the task had already ended."""
        raise DispatchError(f"{type(self).__name__} has no state machine")


_NAME_SAFE = re.compile(r"[^0-9A-Za-z_-]")
# What Step Functions answers for a task token whose task is over (timed out, finished,
# or its execution ended): nothing is wrong, there is just nothing left to tell it.
_TASK_ENDED = frozenset({"TaskDoesNotExist", "TaskTimedOut", "InvalidToken"})


class AwsDispatcher(Dispatcher):
    """Lambda async ``Invoke`` and Step Functions calls through boto3, each client built on
    its first call (``awsclients``) and reused for the life of the container."""

    def __init__(self, *, executor_function: str | None, state_machine_arn: str | None,
                 lambda_client: LambdaClient | None = None,
                 sfn_client: StepFunctionsClient | None = None) -> None:
        self._function = executor_function
        self._state_machine = state_machine_arn
        self._lambda = lambda_client if lambda_client is not None else awsclients.lambda_client()
        self._sfn = sfn_client if sfn_client is not None else awsclients.stepfunctions_client()

    def invoke_executor(self, ledger_key: str, *, pull: bool = False) -> None:
        self._invoke(executor_event(ledger_key, pull=pull))

    def invoke_puller(self, handler: str, by: float) -> None:
        self._invoke(puller_event(handler, by))

    def _invoke(self, event: dict[str, Any]) -> None:
        """One async (Event) invoke of the executor function: a DispatchError naming only the
        error's type or code when it does not go through."""
        if not self._function:
            raise DispatchError("no executor function configured (SW_EXECUTOR_FUNCTION_NAME)")
        import botocore.exceptions

        try:
            self._lambda.invoke(FunctionName=self._function, InvocationType="Event",
                                Payload=json.dumps(event).encode())
        except botocore.exceptions.BotoCoreError as err:
            raise DispatchError(f"invoke failed: {type(err).__name__}") from err
        except botocore.exceptions.ClientError as err:
            raise DispatchError(f"invoke failed: {_code(err)}") from err

    def start_execution(self, ledger_key: str, handover_epoch: str | None = None) -> None:
        if not self._state_machine:
            raise DispatchError("no state machine configured (SW_STATE_MACHINE_ARN)")
        import botocore.exceptions

        name = _execution_name(ledger_key, handover_epoch)
        try:
            self._sfn.start_execution(stateMachineArn=self._state_machine, name=name,
                                      input=json.dumps(execution_input(ledger_key, handover_epoch)))
        except botocore.exceptions.ClientError as err:
            if _code(err) == "ExecutionAlreadyExists":
                return  # the same delivery was already started: idempotent by name
            raise DispatchError(f"start_execution failed: {_code(err)}") from err
        except botocore.exceptions.BotoCoreError as err:
            raise DispatchError(f"start_execution failed: {type(err).__name__}") from err

    def fail_task(self, task_token: str, *, error: str, cause: str) -> bool:
        return self._task_call("send_task_failure",
                               lambda: self._sfn.send_task_failure(taskToken=task_token, error=error,
                                                                   cause=cause))

    def heartbeat_task(self, task_token: str) -> bool:
        return self._task_call("send_task_heartbeat", lambda: self._sfn.send_task_heartbeat(taskToken=task_token))

    @staticmethod
    def _task_call(operation: str, call: Callable[[], object]) -> bool:
        """``call()``; ``False`` when the task is over, a DispatchError naming the code otherwise
        (the code only: a message could quote the token)."""
        import botocore.exceptions

        try:
            call()
        except botocore.exceptions.ClientError as err:
            if _code(err) in _TASK_ENDED:
                return False
            raise DispatchError(f"{operation} failed: {_code(err)}") from err
        except botocore.exceptions.BotoCoreError as err:
            raise DispatchError(f"{operation} failed: {type(err).__name__}") from err
        return True


def _code(err: botocore.exceptions.ClientError) -> str:
    return str(err.response.get("Error", {}).get("Code", ""))


def _execution_name(ledger_key: str, handover_epoch: str | None) -> str:
    """At most 80 chars. A continue-as-new is named after its (unique) successor epoch, so a
    retried handover starts it once. A first execution gets a fresh name: a delivery handed
    back and delivered again keeps its ledger key, and a reused name would make its start a
    silent no-op (names stay taken for 90 days). A doubled first start is harmless: the
    ledger claim lets one execution run and the other ends at once."""
    import hashlib
    import uuid

    seed = handover_epoch or f"first:{uuid.uuid4()}"
    digest = hashlib.sha256(f"{ledger_key}|{seed}".encode()).hexdigest()[:24]
    readable = _NAME_SAFE.sub("-", ledger_key)[:50]
    return f"{readable}-{digest}"
