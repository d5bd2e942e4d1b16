"""The slice of the Lambda context object the runtime uses, and a local stand-in.

Everything deadline-aware reads ``get_remaining_time_in_millis`` so the same code
runs in Lambda, in moto-driven tests and in the local runner.
"""

from __future__ import annotations

import time
import uuid
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

from ..waits import time_limit

__all__ = ["WAIT_MARGIN_SECONDS", "LambdaContextLike", "LocalContext", "invocation_time_limit"]

WAIT_MARGIN_SECONDS = 2.0  # a retry wait ends this long before the invocation's timeout


class LambdaContextLike(Protocol):
    aws_request_id: str
    function_name: str

    def get_remaining_time_in_millis(self) -> int: ...


@dataclass
class LocalContext:
    """A Lambda-like context with a real deadline, for local runs and tests.

    >>> ctx = LocalContext("executor", timeout_seconds=900)
    >>> ctx.get_remaining_time_in_millis() <= 900_000
    True
    """

    function_name: str = "local"
    timeout_seconds: float = 900.0
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    memory_limit_in_mb: int = 512
    invoked_function_arn: str = ""
    started: float = field(default_factory=time.monotonic)

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.timeout_seconds - (time.monotonic() - self.started)) * 1000))


def invocation_time_limit(context: LambdaContextLike) -> AbstractContextManager[None]:
    """No retry wait in the block outlasts the invocation: each ends ``WAIT_MARGIN_SECONDS``
    before its timeout would (``waits.time_limit``), so the failed call is recorded, and
    left to the reaper, instead of the invocation being killed mid-wait."""
    return time_limit(lambda: context.get_remaining_time_in_millis() / 1000 - WAIT_MARGIN_SECONDS,
                      what="the invocation's deadline")
