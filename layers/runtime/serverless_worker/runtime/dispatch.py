"""Fan-out: start one executor per delivery, or one state-machine execution for
long-running handlers. Payloads carry only the ledger key.
"""

from __future__ import annotations

import json
import re
import threading
from abc import ABC, abstractmethod
from typing import Any

from ..errors import ServerlessWorkerError

__all__ = ["DispatchError", "Dispatcher", "AwsDispatcher", "executor_event", "execution_input"]


class DispatchError(ServerlessWorkerError):
    """Starting an executor or an execution failed (throttled, missing permission, ...)."""


def executor_event(ledger_key: str) -> dict[str, Any]:
    """The executor's whole event: nothing secret, nothing large."""
    return {"ledger_key": ledger_key}


def execution_input(ledger_key: str, handover_epoch: str | None = None) -> dict[str, Any]:
    return {"ledger_key": ledger_key, "handover_epoch": handover_epoch}


class Dispatcher(ABC):
    """Where deliveries go once they are in the ledger."""

    @abstractmethod
    def invoke_executor(self, ledger_key: str) -> None:
        """Start the executor for one delivery without waiting for it."""

    @abstractmethod
    def start_execution(self, ledger_key: str, handover_epoch: str | None = None) -> None:
        """Start the long-running state machine for one delivery."""


_NAME_SAFE = re.compile(r"[^0-9A-Za-z_-]")


class AwsDispatcher(Dispatcher):
    """Lambda async ``Invoke`` and Step Functions ``StartExecution`` through boto3."""

    def __init__(self, *, executor_function: str | None, state_machine_arn: str | None,
                 lambda_client: Any = None, sfn_client: Any = None) -> None:
        self._function = executor_function
        self._state_machine = state_machine_arn
        self._lambda = lambda_client
        self._sfn = sfn_client
        # The scheduler dispatches from a pool of threads, and creating a boto3 client on
        # the shared default session is not thread-safe: build each client once, locked.
        self._clients_lock = threading.Lock()

    def invoke_executor(self, ledger_key: str) -> None:
        if not self._function:
            raise DispatchError("no executor function configured (SW_EXECUTOR_FUNCTION_NAME)")
        import botocore.exceptions

        try:
            self.lambda_client.invoke(FunctionName=self._function, InvocationType="Event",
                                      Payload=json.dumps(executor_event(ledger_key)).encode())
        except botocore.exceptions.BotoCoreError as err:
            raise DispatchError(f"invoke failed: {type(err).__name__}") from err
        except botocore.exceptions.ClientError as err:
            raise DispatchError(f"invoke failed: {err.response['Error'].get('Code')}") from err

    @property
    def lambda_client(self) -> Any:
        with self._clients_lock:
            if self._lambda is None:
                import boto3

                self._lambda = boto3.client("lambda")
            return self._lambda

    @property
    def sfn_client(self) -> Any:
        with self._clients_lock:
            if self._sfn is None:
                import boto3

                self._sfn = boto3.client("stepfunctions")
            return self._sfn

    def start_execution(self, ledger_key: str, handover_epoch: str | None = None) -> None:
        if not self._state_machine:
            raise DispatchError("no state machine configured (SW_STATE_MACHINE_ARN)")
        import botocore.exceptions

        name = _execution_name(ledger_key, handover_epoch)
        try:
            self.sfn_client.start_execution(stateMachineArn=self._state_machine, name=name,
                                      input=json.dumps(execution_input(ledger_key, handover_epoch)))
        except botocore.exceptions.ClientError as err:
            if err.response["Error"].get("Code") == "ExecutionAlreadyExists":
                return  # the same delivery was already started: idempotent by name
            raise DispatchError(f"start_execution failed: {err.response['Error'].get('Code')}") from err
        except botocore.exceptions.BotoCoreError as err:
            raise DispatchError(f"start_execution failed: {type(err).__name__}") from err


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
