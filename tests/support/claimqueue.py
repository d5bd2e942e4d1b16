"""What the claim-queue conformance tests share: reading an item back from the sandbox's
admin API, the pull and outcome they build, and clients that are closed after the test."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from serverless_worker.model import Delivery, Outcome, OutcomeKind
from serverless_worker.protocols.base import PullRequest
from serverless_worker.protocols.claimqueue import ClaimQueueClient
from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin

__all__ = ["QUEUE", "TOKEN", "ClientMaker", "client_maker", "events", "job", "pull", "success"]

TOKEN = "sandbox-token"  # the sandbox's default bearer token
QUEUE = "resize"


def job(admin: SandboxAdmin, item_id: str) -> dict[str, Any]:
    """The item as the sandbox holds it, with its history."""
    return next(j for j in admin.jobs() if j["id"] == item_id)


def events(admin: SandboxAdmin, item_id: str, name: str) -> list[dict[str, Any]]:
    """The item's history events called ``name``, oldest first."""
    return [h for h in job(admin, item_id)["history"] if h["event"] == name]


def pull(client: ClaimQueueClient, criteria: dict[str, Any] | None = None, *, max_items: int = 1) -> list[Delivery]:
    return client.pull(PullRequest(handler=QUEUE, max_items=max_items, criteria=criteria))


def success(value: Any) -> Outcome:
    return Outcome(kind=OutcomeKind.SUCCESS, value=value)


class ClientMaker:
    """Builds clients for a sandbox with the test's defaults; each one is closed at the end."""

    def __init__(self, **defaults: Any) -> None:
        self.defaults = {"worker_id": "box-1", **defaults}
        self.clients: list[ClaimQueueClient] = []

    def __call__(self, server: SandboxServer, **options: Any) -> ClaimQueueClient:
        options = {**self.defaults, **options}
        client = ClaimQueueClient(server.url, options.pop("token", TOKEN), **options)
        self.clients.append(client)
        return client


@contextmanager
def client_maker(**defaults: Any) -> Iterator[ClientMaker]:
    """``with client_maker(transport="socket") as make: make(server)``; closes what it made."""
    maker = ClientMaker(**defaults)
    try:
        yield maker
    finally:
        for client in maker.clients:
            client.close()
