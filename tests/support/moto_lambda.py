"""Run the project's Lambda code inside moto, and moto's Step Functions workarounds.

Both live in the package (``serverless_worker.local``), where the local runner uses them;
the tests take them from there too, so there is one copy.
"""

from __future__ import annotations

from serverless_worker.local.moto_adapter import abort_running_executions, patch_definite_jsonpaths
from serverless_worker.local.moto_lambda import (
    FakeLambdaContext,
    Handler,
    InProcessLambda,
    Invocation,
    dummy_zip,
    error_payload,
)

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
