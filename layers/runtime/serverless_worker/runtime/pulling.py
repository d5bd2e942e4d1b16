"""What the scheduler and an executor that keeps pulling decide alike about a pull and what it
brought: the claim-queue criteria to ask with, whether a handler runs long (state machine),
which deliveries a pull left to the server because no request could name them, which it
brought that were not asked for (given back untouched), and how a delivery the ledger
already holds is settled unrun.

Only what was asked for runs. A server that ignores the type asked for, the criteria or the
count hands out work this worker may not even have the code for, and another worker of the
fleet would have run: each such delivery is given back as it came (``hand_back``: Priostack
``fail`` with ``retries`` unchanged, Pipelogiq ``requeue``, the claim queue's lease left to
lapse or its socket closed), never recorded, never run, no attempt used and no incident
raised, and logged once with what the server sent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ProtocolError, UnknownHandlerError
from ..model import Delivery
from ..protocols.base import PullRequest, WorkerProtocol
from .services import Services

__all__ = ["NotAskedFor", "criteria", "discard_duplicate", "long_running", "pull_asked_for",
           "pull_noting_unaddressable"]

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


@dataclass(frozen=True)
class NotAskedFor:
    """A delivery a pull brought that its request did not ask for, and what became of it."""

    job_id: str
    why: str           # in words, quoting the server's values
    given_back: bool   # False: the hand-back call failed (the server's own return path remains)

    @property
    def kind(self) -> str:
        """The reason without the server's values, for counts: ``type``, ``criteria`` or ``count``."""
        if self.why.startswith("beyond"):
            return "count"
        return "type" if self.why.startswith("handler") else "criteria"


def pull_asked_for(services: Services, request: PullRequest, *, unaddressable: Callable[[list[str]], None],
                   not_asked: Callable[[NotAskedFor], None]) -> list[Delivery]:
    """One pull (``pull_noting_unaddressable``, through ``services.call``), then only what
    ``request`` asked for: a delivery of another type or handler, one failing the criteria
    (``WorkerProtocol.not_asked_for``) or one beyond ``max_items`` is given back untouched
    and passed to ``not_asked``. Each give-back is its own call, after the pull: a failed
    one is logged and reported, and never undoes the pull."""
    pulled = services.call(lambda p: pull_noting_unaddressable(p, request, unaddressable))
    protocol = services.protocol
    kept: list[Delivery] = []
    for delivery in pulled:
        why = protocol.not_asked_for(request, delivery)
        if why is None and len(kept) >= request.max_items:
            why = f"beyond the {request.max_items} asked for ({len(pulled)} sent)"
        if why is None:
            kept.append(delivery)
            continue
        not_asked(_give_back_unasked(services, request, delivery, why))
    return kept


def _give_back_unasked(services: Services, request: PullRequest, delivery: Delivery, why: str) -> NotAskedFor:
    job = delivery.job_id
    try:
        services.call(lambda p: p.hand_back(delivery))
    except (ProtocolError, ValueError) as err:
        log.error("job %s pulled for %s was not asked for (%s); giving it back failed, so it returns only "
                  "by the server's own path: %s", job, request.handler, why, err)
        return NotAskedFor(job, why, given_back=False)
    log.warning("job %s pulled for %s was not asked for (%s); given back untouched: not run, no attempt used",
                job, request.handler, why)
    services.events.add("job.not_asked_for", f"job {job} not asked for: {why}", job_id=job)
    return NotAskedFor(job, why, given_back=True)
