"""A handler whose declared timeout can never fit a delivery's limits: say so, loudly, once.

The executor hands back a delivery whose time budget cannot hold the handler's timeout
(docs/outcomes.md: it is returned unstarted, no attempt used), which is right when the budget was
short this time. When the limit is fixed (a lease the protocol does not renew, the
job's own timeout, the executor's Lambda timeout), every delivery of that handler meets
the same limit: handing back would cycle the work forever without running it. This
module, for the second (told apart by ``budget.never_fits``), stops pulling for that handler (a flag
in the control item the scheduler reads), logs one error naming the handler, its
timeout and the limit, and counts the ``HandlerCannotFit`` metric (alarmed in
template.yaml). ``docs/timeouts.md`` says how to fix it.
"""

from __future__ import annotations

import logging
import threading

from ..registry import HandlerSpec
from .services import Services

__all__ = ["LEASE_STRIKES", "lease_bound_confirmed", "lease_fitted", "report_unfit"]

log = logging.getLogger("serverless_worker.fit")

# A lease too short for a handler is taken as the queue's fixed length only when this many
# of its deliveries in a row (in this container) meet it: one delivery's lease may be an
# older one a late duplicate carries (budget.lease_never_fits), which only looks short.
LEASE_STRIKES = 2
_lease_strikes: dict[str, int] = {}
_strikes_lock = threading.Lock()


def lease_bound_confirmed(handler: str) -> bool:
    """One more delivery of ``handler`` met a lease too short for it: whether that makes
    :data:`LEASE_STRIKES` in a row."""
    with _strikes_lock:
        _lease_strikes[handler] = _lease_strikes.get(handler, 0) + 1
        return _lease_strikes[handler] >= LEASE_STRIKES


def lease_fitted(handler: str) -> None:
    """A delivery of ``handler`` fitted: the strikes start over."""
    with _strikes_lock:
        _lease_strikes.pop(handler, None)


def report_unfit(services: Services, spec: HandlerSpec, why: str) -> None:
    """Stop pulling for ``spec``'s handler and say why: one ERROR (the first executor to
    find it), the metric and an event every time."""
    from .metrics import metrics

    metrics.add("HandlerCannotFit", 1)
    first = services.store.set_unfit(services.protocol_name, services.instance, spec.name, why)
    if first:
        log.error("%s: no delivery of it can ever run, so the worker stops pulling for it; raise the "
                  "lease or Lambda timeout, or lower the handler's timeout (docs/timeouts.md)", why)
    else:
        log.info("another delivery of unfit handler %r handed back", spec.name)
    services.events.add("worker.handler_cannot_fit", why, level="ERROR", handler=spec.name)
