"""serverless-worker: run job handlers for HTTP job-worker APIs on AWS Lambda.

Example::

    from serverless_worker import BusinessError, Job, handler

    @handler("payment-processor")
    def charge(job: Job[Payment]) -> dict:
        return {"status": "charged"}

``__all__`` is what a handler author uses. The runtime's own pieces are imported from
their modules (``serverless_worker.registry``, ``.job``, ``.handler_runner``...), and
tests run handlers through :mod:`serverless_worker.testing`. The handler API is imported
on first use (PEP 562), so ``import serverless_worker`` stays cheap for the CLI and for
entry points that only need the error tree; so is ``__version__``, read from the
installed distribution's metadata.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import BusinessError, JobCancelledError

if TYPE_CHECKING:
    from .job import CancelReason, Job
    from .registry import handler
    from .results import Continue, Result

__all__ = [
    "BusinessError",
    "CancelReason",
    "Continue",
    "Job",
    "JobCancelledError",
    "Result",
    "handler",
]
_LAZY = {
    "handler": "registry",
    "CancelReason": "job",
    "Job": "job",
    "Continue": "results",
    "Result": "results",
}


def __getattr__(name: str) -> Any:
    if name == "__version__":
        globals()[name] = value = _read_version()
        return value
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def _read_version() -> str:
    """The installed distribution's version (importlib.metadata), or, where the package
    runs from copied sources without metadata (the Lambda layer), ``_version.VERSION``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("serverless-worker")
    except PackageNotFoundError:
        from ._version import VERSION

        return VERSION


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
