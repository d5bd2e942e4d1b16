"""A handler whose declared timeout can never fit a delivery's limits: say so, loudly, once.

The executor hands back a delivery whose time budget cannot hold the handler's timeout
(docs/outcomes.md: it is returned unstarted, no attempt used), which is right when the budget was
short this time. When the limit is fixed (a lease the protocol does not renew, the
job's own timeout, the executor's Lambda timeout), every delivery of that handler meets
the same limit: handing back would cycle the work forever without running it. This
module tells the two apart and, for the second, stops pulling for that handler (a flag
in the control item the scheduler reads), logs one error naming the handler, its
timeout and the limit, and counts the ``HandlerCannotFit`` metric (alarmed in
template.yaml). ``docs/timeouts.md`` says how to fix it.
"""

from __future__ import annotations

import logging

from ..protocols.base import Delivery, Lease
from ..registry import HandlerSpec
from .budget import LEASE_MARGIN_SECONDS, lease_room
from .services import Services

__all__ = ["never_fits", "report_unfit"]

log = logging.getLogger("serverless_worker.fit")


def never_fits(spec: HandlerSpec, delivery: Delivery, lease: Lease | None, *, lambda_limit: float,
               report_margin: float) -> str | None:
    """Why ``spec.timeout`` can never fit any delivery like this one, or ``None``.

    ``lambda_limit`` is the executor invocation's whole time (its remaining time when it
    started). The lease bound is the lease's whole length (expiry less the pull time)."""
    timeout = spec.timeout
    if timeout is None or timeout <= 0:
        return None
    usable = lease_room(lease, delivery.pulled_at)
    if usable is not None and timeout > usable:
        return (f"handler {spec.name!r} declares timeout={timeout:g}s, but the {delivery.protocol} "
                f"lease it runs under lasts {usable + LEASE_MARGIN_SECONDS:.0f}s and cannot be renewed "
                f"(at most {max(0.0, usable):.0f}s of it can be used)")
    job_timeout = delivery.timeout_seconds
    if job_timeout is not None and 0 < job_timeout < timeout:
        return (f"handler {spec.name!r} declares timeout={timeout:g}s, but the job's own timeout "
                f"is {job_timeout:g}s")
    if not spec.long_running and timeout > lambda_limit - report_margin:
        return (f"handler {spec.name!r} declares timeout={timeout:g}s, but the executor's Lambda "
                f"timeout of {lambda_limit:.0f}s less the report margin of {report_margin:g}s leaves "
                f"{max(0.0, lambda_limit - report_margin):.0f}s")
    return None


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
