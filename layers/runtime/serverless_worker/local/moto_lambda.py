"""Run the project's Lambda code inside moto: an in-process replacement for
``LambdaSimpleBackend.invoke`` with a Lambda-like context (see docs/contributing/moto-notes.md).

``moto_adapter.route_lambda_invoke`` installs it. Used by the local runner (the state
machine's Task states call the steps entry point through it) and by the AWS test tier
(every function's real ``app.py``).
"""

from __future__ import annotations

import io
import json
import threading
import time
import traceback
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from moto.awslambda_simple.models import LambdaSimpleBackend

__all__ = [
    "FakeLambdaContext",
    "Handler",
    "InProcessLambda",
    "Invocation",
    "dummy_zip",
    "error_payload",
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
    """Registry of handlers plus the replacement for ``LambdaSimpleBackend.invoke``.

    ``record=False`` keeps no list of invocations (a long local run would grow it forever).
    """

    def __init__(self, *, record: bool = True) -> None:
        self._record = record
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
        if self._record:
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


def dummy_zip() -> bytes:
    """Code for ``create_function``: moto without Docker never runs it, but wants a zip."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("app.py", "def handler(event, context):\n    return event\n")
    return buffer.getvalue()
