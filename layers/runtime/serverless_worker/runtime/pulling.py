"""What the scheduler and an executor that keeps pulling decide alike about a pull and what it
brought: the claim-queue criteria to ask with, whether a handler runs long (state machine),
and how a delivery the ledger already holds is settled unrun.
"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import ProtocolError, UnknownHandlerError
from ..model import Delivery
from .services import Services

__all__ = ["criteria", "discard_duplicate", "long_running"]

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
