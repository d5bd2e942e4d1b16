"""The ``bench`` handler (``harness.HANDLER``) for runs through the Lambda entry points, which
load their handlers from ``SW_HANDLER_MODULE`` (this file): it returns at once, so a run
measures the runtime's work per job, not a handler's. It declares a timeout, as a handler
must for an executor to pull its next job itself (docs/limits.md)."""

from __future__ import annotations

from typing import Any

from serverless_worker import Job, handler


@handler("bench", timeout=10)
def bench(job: Job[Any]) -> dict[str, Any]:
    return {"ok": True}
