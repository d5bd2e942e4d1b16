"""Build the configured protocol client from settings.

This is the one place that knows each client's constructor; the runtime asks for "the
client" and never names a protocol.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from . import protocol_class
from ._http import RetryPolicy
from .base import WorkerProtocol

if TYPE_CHECKING:
    from ..settings import Settings

__all__ = ["ONE_ATTEMPT", "create_client"]

# The reaper's policy: it retries a settling call at the retry time noted on its ledger
# item (docs/retries.md), so its client tries each call once.
ONE_ATTEMPT = RetryPolicy(attempts=1)


def create_client(settings: Settings, credential: SecretStr, *, retry: RetryPolicy | None = None,
                  **overrides: Any) -> WorkerProtocol:
    """A client for ``settings.protocol`` holding ``credential`` (API key or bearer token)."""
    common: dict[str, Any] = {
        "retry": retry or RetryPolicy(timeout=settings.max_wait_seconds),
        "connect_timeout": settings.connect_timeout,
        "read_timeout": settings.read_timeout,
        "allow_insecure_http": settings.allow_insecure_http,
    }
    specific: dict[str, dict[str, Any]] = {
        "pipelogiq": {"session_ttl_seconds": settings.session_ttl_seconds},
        "priostack": {},
        "claimqueue": {"worker_id": settings.instance_id},
    }
    kwargs = {**common, **specific.get(settings.protocol, {}), **overrides}
    return protocol_class(settings.protocol)(settings.base_url, credential, **kwargs)  # type: ignore[call-arg]
