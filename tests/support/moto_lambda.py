"""Run the project's Lambda code inside moto: an in-process replacement for
``LambdaSimpleBackend.invoke`` with a Lambda-like context, plus workarounds for moto's
Step Functions interpreter (see docs/moto-notes.md)."""

from __future__ import annotations

import datetime
import io
import json
import re
import sys
import threading
import time
import traceback
import uuid
import zipfile
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from moto.awslambda_simple.models import LambdaSimpleBackend

__all__ = [
    "FakeLambdaContext",
    "Handler",
    "InProcessLambda",
    "Invocation",
    "abort_running_executions",
    "dummy_zip",
    "error_payload",
    "patch_definite_jsonpaths",
]

Handler = Callable[[Any, "FakeLambdaContext"], Any]


@dataclass
class FakeLambdaContext:
    """The attributes of ``awslambdaric``'s LambdaContext that handlers and Powertools read."""

    function_name: str
    invoked_function_arn: str
    memory_limit_in_mb: int
    aws_request_id: str
    timeout_seconds: int
    function_version: str = "$LATEST"
    log_group_name: str = ""
    log_stream_name: str = ""
    identity: Any = None
    client_context: Any = None
    _deadline: float = field(default=0.0, repr=False)

    def __post_init__(self) -> None:
        self._deadline = time.monotonic() + self.timeout_seconds
        self.log_group_name = self.log_group_name or f"/aws/lambda/{self.function_name}"
        self.log_stream_name = self.log_stream_name or f"2024/01/01/[$LATEST]{uuid.uuid4().hex}"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


@dataclass
class Invocation:
    function_name: str
    invocation_type: str
    event: Any
    context: FakeLambdaContext


def error_payload(exc: BaseException) -> dict[str, Any]:
    """What the Python runtime returns for an uncaught exception. ``errorType`` becomes the
    Step Functions error name; an ``error_type`` attribute lets a test fake ``Lambda.*`` errors."""
    return {
        "errorMessage": str(exc),
        "errorType": getattr(exc, "error_type", type(exc).__name__),
        "stackTrace": traceback.format_tb(exc.__traceback__),
    }


class InProcessLambda:
    """Registry of handlers plus the replacement for ``LambdaSimpleBackend.invoke``."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.invocations: list[Invocation] = []
        self.background_errors: list[BaseException] = []

    def register(self, function_name: str, handler: Handler) -> None:
        self._handlers[function_name] = handler

    def backend_invoke(
        self,
        backend: LambdaSimpleBackend,
        function_name: str,
        qualifier: str | None,
        body: str,
        headers: Any,
        response_headers: dict[str, str],
    ) -> bytes:
        # Resolves name / ARN / partial ARN and raises ResourceNotFoundException like AWS.
        fn = backend.get_function(function_name, qualifier)
        handler = self._handlers[fn.function_name]
        event = json.loads(body) if body else {}
        context = FakeLambdaContext(
            function_name=fn.function_name,
            invoked_function_arn=fn.function_arn,
            memory_limit_in_mb=int(fn.memory_size),
            aws_request_id=str(uuid.uuid4()),
            timeout_seconds=int(fn.timeout),
        )
        invocation_type = headers.get("X-Amz-Invocation-Type") or "RequestResponse"
        with self._lock:
            self.invocations.append(Invocation(fn.function_name, invocation_type, event, context))
        response_headers["x-amz-executed-version"] = "$LATEST"

        if invocation_type == "DryRun":
            return b""
        if invocation_type == "Event":
            # moto calls us synchronously: run the handler on a thread and answer 202 at once.
            # Return b"" (not None: None makes moto answer 404).
            thread = threading.Thread(
                target=self._run_in_background, args=(handler, event, context), daemon=True
            )
            with self._lock:
                self._threads.append(thread)
            thread.start()
            return b""
        try:
            result = handler(event, context)
        except Exception as exc:
            response_headers["x-amz-function-error"] = "Unhandled"
            return json.dumps(error_payload(exc)).encode()
        return json.dumps(result).encode()

    def _run_in_background(self, handler: Handler, event: Any, context: FakeLambdaContext) -> None:
        try:
            handler(event, context)
        except BaseException as exc:  # surfaced by drain()
            with self._lock:
                self.background_errors.append(exc)

    def drain(self, timeout: float = 5.0) -> None:
        """Join every Event invocation still running; raise if one did not finish."""
        deadline = time.monotonic() + timeout
        for thread in list(self._threads):
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        assert not alive, f"Event invocations still running: {alive}"


# --------------------------------------------------------------------------- moto workarounds

_DEFINITE_PATH = re.compile(r"\$(?:\.[A-Za-z_][\w-]*|\[\d+\]|\['[^']*'\])*")


def patch_definite_jsonpaths(stack: ExitStack) -> None:
    """moto 5.2.5 returns ``[v]`` for ``$.a[0].b`` (AWS returns ``v``): evaluate definite paths plainly."""
    import moto.stepfunctions.parser.asl.parse.preprocessor  # noqa: F401  (loads every component)
    from moto.stepfunctions.parser.asl.utils import json_path

    original = json_path.extract_json

    def extract_json(path: str, data: Any) -> Any:
        if _DEFINITE_PATH.fullmatch(path):
            matches = json_path.parse(path).find(data)
            if len(matches) == 1:
                return matches[0].value
        return original(path, data)

    for name, module in list(sys.modules.items()):
        patchable = name.startswith("moto.stepfunctions.parser.") and module is not json_path
        if patchable and getattr(module, "extract_json", None) is original:
            stack.enter_context(mock.patch.object(module, "extract_json", extract_json))


def abort_running_executions(timeout: float = 5.0) -> None:
    """Stop every RUNNING execution. ``stop_execution`` alone does not wake a Task that waits
    for a task token (or a Lambda call), so its threads would outlive the test."""
    from moto.stepfunctions.parser.models import stepfunctions_parser_backends

    stopping = []
    for _account, regions in stepfunctions_parser_backends.items():
        for _region, backend in regions.items():
            for machine in backend.state_machines:
                for execution in machine.executions:
                    worker = execution.exec_worker  # type: ignore[attr-defined]
                    env = worker.env if worker else None
                    if execution.status != "RUNNING" or env is None:
                        continue
                    env.set_stop(stop_date=datetime.datetime.now(datetime.UTC), cause=None, error=None)
                    for endpoint in list(env.callback_pool_manager._pool.values()):
                        endpoint.interrupt_all()
                    stopping.append(execution)
    deadline = time.monotonic() + timeout
    while any(e.status == "RUNNING" for e in stopping) and time.monotonic() < deadline:
        time.sleep(0.02)


def dummy_zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("app.py", "def handler(event, context):\n    return event\n")
    return buffer.getvalue()
