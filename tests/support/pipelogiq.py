"""What the Pipelogiq conformance tests share: a stage and its history as the sandbox's
admin API reports them, and the sandbox's overview (workers, sessions, pulls, requests)."""

from __future__ import annotations

from typing import Any

from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin

__all__ = ["history", "job", "overview"]


def job(admin: SandboxAdmin, job_id: str) -> dict[str, Any]:
    """The stage as the sandbox holds it, with its executions and history."""
    return next(j for j in admin.jobs() if j["job_id"] == job_id)


def history(admin: SandboxAdmin, job_id: str, event: str | None = None) -> list[dict[str, Any]]:
    """The stage's history, oldest first; only the events called ``event`` when given."""
    return [h for h in job(admin, job_id)["history"] if event is None or h["event"] == event]


def overview(server: SandboxServer) -> dict[str, Any]:
    """``SandboxAdmin.overview`` for a test that holds only the server."""
    admin = SandboxAdmin(server.url)
    try:
        return admin.overview()
    finally:
        admin.close()
