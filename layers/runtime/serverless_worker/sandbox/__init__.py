"""In-memory emulators of the three job servers, for tests and handler development.

Each is imported lazily by name so the Lambda runtime never pays for uvicorn/starlette.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["SANDBOXES", "create_sandbox"]

SANDBOXES = {
    "pipelogiq": "serverless_worker.sandbox.pipelogiq:PipelogiqSandbox",
    "priostack": "serverless_worker.sandbox.priostack:PriostackSandbox",
    "claimqueue": "serverless_worker.sandbox.claimqueue:ClaimQueueSandbox",
}


def create_sandbox(protocol: str, **config: Any) -> Any:
    """Build the sandbox for ``protocol`` (one of SANDBOXES) with config overrides."""
    module_name, _, class_name = SANDBOXES[protocol].partition(":")
    return getattr(importlib.import_module(module_name), class_name)(**config)
