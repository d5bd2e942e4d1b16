"""What the scheduler and an executor that keeps pulling decide alike about a pull and what it
brought: the claim-queue criteria to ask with, whether a handler runs long (state machine),
which deliveries a pull left to the server because no request could name them, and how a
delivery the ledger already holds is settled unrun.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..errors import ProtocolError, UnknownHandlerError
from ..model import Delivery
from ..protocols.base import PullRequest, WorkerProtocol
from .services import Services

__all__ = ["criteria", "discard_duplicate", "long_running", "pull_noting_unaddressable"]

log = logging.getLogger("serverless_worker.pulling")


def criteria(services: Services, handler: str) -> dict[str, Any] | None:
    """SW_CRITERIA overrides what the handler declared with ``@handler(criteria=...)``."""
    configured = (services.settings.criteria or {}).get(handler)
    if configured is not None:
        return dict(configured)
    try:
        declared = services.registry.get(handler).criteria
    except UnknownHandlerError:  # the executor reports it as a failure
        return None
    return dict(declared) if declared else None


def long_running(services: Services, handler: str) -> bool:
    """A ``slices`` or ``callback`` handler: its deliveries go to the state machine."""
    try:
        return bool(services.registry.get(handler).long_running)
    except UnknownHandlerError:  # the executor reports it as a failure
        return False


def discard_duplicate(services: Services, delivery: Delivery) -> None:
    """The ledger already has this execution: a duplicate delivery. Settle it unrun."""
    try:
        services.call(lambda p: p.discard(delivery))
    except ProtocolError as err:
        log.info("duplicate not acknowledged: %s", err)
    services.events.add("job.duplicate_discarded", f"duplicate delivery of job {delivery.job_id}",
                        job_id=delivery.job_id)


def pull_noting_unaddressable(protocol: WorkerProtocol, request: PullRequest,
                              note: Callable[[list[str]], None]) -> list[Delivery]:
    """``protocol.pull``, passing ``note`` what each delivery it took and left to the
    server's own return path lacked (no request could name it), whether or not it raised."""
    try:
        return protocol.pull(request)
    finally:
        lacks = protocol.take_unaddressable()
        if lacks:
            note(lacks)
