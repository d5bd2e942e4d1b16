"""serverless-worker: run job handlers for HTTP job-worker APIs on AWS Lambda.

Example::

    from serverless_worker import BusinessError, Job, handler

    @handler("payment-processor")
    def charge(job: Job) -> dict:
        return {"status": "charged"}

The handler API is imported on first use (PEP 562), so ``import serverless_worker``
stays cheap for the CLI and for entry points that only need the error tree.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import BusinessError, JobCancelledError, ServerlessWorkerError, UnknownHandlerError

if TYPE_CHECKING:
    from .job import CancelReason, Job
    from .registry import HandlerRegistry, HandlerSpec, default_registry, handler, load_handlers
    from .results import Continue, Result

__all__ = [
    "BusinessError",
    "CancelReason",
    "Continue",
    "HandlerRegistry",
    "HandlerSpec",
    "Job",
    "JobCancelledError",
    "Result",
    "ServerlessWorkerError",
    "UnknownHandlerError",
    "default_registry",
    "handler",
    "load_handlers",
]
__version__ = "0.1.0"

_LAZY = {
    "HandlerRegistry": "registry",
    "HandlerSpec": "registry",
    "default_registry": "registry",
    "handler": "registry",
    "load_handlers": "registry",
    "CancelReason": "job",
    "Job": "job",
    "Continue": "results",
    "Result": "results",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
