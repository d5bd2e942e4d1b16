"""The slice of the Lambda context object the runtime uses, and a local stand-in.

Everything deadline-aware reads ``get_remaining_time_in_millis`` so the same code
runs in Lambda, in moto-driven tests and in the local runner.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["LambdaContextLike", "LocalContext"]


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
