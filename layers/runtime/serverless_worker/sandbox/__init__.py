"""In-memory emulators of the three job servers, for tests and handler development.

This module is the sandboxes' public surface: the CLI and the local demo import from here,
never from the modules behind it. Each sandbox, and the server that hosts one
(:class:`SandboxServer`, uvicorn), is imported on first use (PEP 562), so listing the
protocols costs no starlette import; the Lambda runtime imports none of this.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._server import FaultKind, FaultPlan, FaultRule, Sandbox, SandboxServer

__all__ = ["SANDBOXES", "FaultKind", "FaultPlan", "FaultRule", "Sandbox", "SandboxServer", "create_sandbox"]

SANDBOXES = {
    "pipelogiq": "serverless_worker.sandbox.pipelogiq:PipelogiqSandbox",
    "priostack": "serverless_worker.sandbox.priostack:PriostackSandbox",
    "claimqueue": "serverless_worker.sandbox.claimqueue:ClaimQueueSandbox",
}
# The server and fault vocabulary, defined in ``_server.py`` beside the base class they share.
_FROM_SERVER = frozenset({"FaultKind", "FaultPlan", "FaultRule", "Sandbox", "SandboxServer"})


def create_sandbox(protocol: str, **config: Any) -> Any:
    """Build the sandbox for ``protocol`` (one of SANDBOXES) with config overrides."""
    module_name, _, class_name = SANDBOXES[protocol].partition(":")
    return getattr(importlib.import_module(module_name), class_name)(**config)


def __getattr__(name: str) -> Any:
    if name not in _FROM_SERVER:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("._server", __name__), name)
    globals()[name] = value
    return value
