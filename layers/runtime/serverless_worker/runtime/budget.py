"""How long a handler may run: the one place the runtime sizes a run's time.

Every path of a delivery (the executor in one go, the state machine's steps one at a
time, the check that a handler can never fit) asks here, so the margin kept before a
lease that cannot be renewed, the least time a run may start with and the rule that
combines the limits are written once. ``docs/timeouts.md`` explains them to operators.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..model import Delivery, Lease

if TYPE_CHECKING:
    from ..registry import HandlerSpec

__all__ = ["LEASE_MARGIN_SECONDS", "MIN_RUN_SECONDS", "PULL_ALLOWANCE_SECONDS", "budget_fits", "callback_budget",
           "lapsed_at_grant", "lease_never_fits", "lease_room", "never_fits", "self_pull_fits", "time_budget"]

# A run under a lease that cannot be renewed stops this long before the lease lapses: past
# the lapse the server may hand the job to someone else.
LEASE_MARGIN_SECONDS = 2.0

# The least time a handler run may start with (``budget_fits``), and so the least a lease
# just granted must have left for a run to start under it (``lapsed_at_grant``).
MIN_RUN_SECONDS = 1.0

# What an executor that keeps pulling spends before the next handler starts: the pull, the
# ledger write that records the delivery and the lease.
PULL_ALLOWANCE_SECONDS = 2.0


def lease_room(lease: Lease | None, since: float) -> float | None:
    """Seconds from ``since`` that a run may use of a lease that cannot be renewed (its
    expiry less the margin; negative once past it), or ``None`` when the lease bounds nothing
    (none, renewable, or without an expiry)."""
    if lease is None or lease.renewable or lease.expires_at is None:
        return None
    return lease.expires_at - since - LEASE_MARGIN_SECONDS


def time_budget(*, remaining_lambda: float, report_margin: float, handler_timeout: float | None,
                job_timeout: float | None, lease: Lease | None, now: float) -> float:
    """Seconds the handler may run: the tightest of Lambda time (less room to store and
    report), the handler's and the job's own timeouts, and a lease that cannot be renewed."""
    budget = remaining_lambda - report_margin
    for limit in (handler_timeout, job_timeout):
        if limit is not None and limit > 0:
            budget = min(budget, limit)
    room = lease_room(lease, now)
    if room is not None:
        budget = min(budget, room)
    return max(0.0, budget)


def budget_fits(budget: float, handler_timeout: float | None) -> bool:
    """Whether a run of ``budget`` seconds may start: at least a second, and not less than
    the handler's declared timeout (a shorter run is handed back rather than cut short)."""
    return not (budget < MIN_RUN_SECONDS or (handler_timeout is not None and budget < handler_timeout))


def self_pull_fits(*, remaining_lambda: float, next_budget: float, report_margin: float,
                   allowance: float = PULL_ALLOWANCE_SECONDS) -> bool:
    """Whether an executor may pull one more delivery: its remaining time must hold the next
    handler's whole budget, the report margin after it and the pull before it, so a delivery
    it takes is never handed back for lack of time (docs/limits.md)."""
    return remaining_lambda >= next_budget + report_margin + allowance


def callback_budget(*, remaining_lambda: float, report_margin: float) -> float:
    """Seconds a callback handler may take to *start* its external work: Lambda time less
    the report margin, never under a second (the work itself is bounded by the task's timeout)."""
    return max(MIN_RUN_SECONDS, remaining_lambda - report_margin)


def lapsed_at_grant(lease: Lease, now: float, minimum: float = MIN_RUN_SECONDS) -> str | None:
    """Why a lease just granted must not be run under, or ``None``.

    A lease whose expiry is already past (or too near for any run) when it is granted (a
    server whose clock is behind ours, or one that answers so) gives no time to run: past
    its expiry the server may hand the job to another worker, and a renewal cannot revive
    what has lapsed. The delivery is then settled as a lost lease (docs/protocols.md):
    never run, left to the server's recovery (Pipelogiq) or to lapse (the claim queue)."""
    if lease.expires_at is None:
        return None
    left = lease.expires_at - now
    if left >= minimum:
        return None
    if left <= 0:
        return f"lease granted already expired ({-left:.1f}s ago)"
    return f"lease granted with {left:.1f}s left, under the {minimum:g}s a run needs"


def lease_never_fits(spec: HandlerSpec, delivery: Delivery, lease: Lease | None) -> str | None:
    """:func:`never_fits`' lease rule alone: the handler's timeout is longer than the lease
    lasts from the pull. Only a lower bound of the lease's length (it was granted before the
    pull: a late duplicate carries an older, shorter-looking one), so the caller confirms it
    with a second delivery (``fit.lease_bound_confirmed``)."""
    timeout = spec.timeout
    if timeout is None or timeout <= 0:
        return None
    usable = lease_room(lease, delivery.pulled_at)
    if usable is not None and timeout > usable:
        return (f"handler {spec.name!r} declares timeout={timeout:g}s, but the {delivery.protocol} "
                f"lease it runs under lasts {usable + LEASE_MARGIN_SECONDS:.0f}s and cannot be renewed "
                f"(at most {max(0.0, usable):.0f}s of it can be used)")
    return None


def never_fits(spec: HandlerSpec, delivery: Delivery, lease: Lease | None, *, lambda_limit: float,
               report_margin: float) -> str | None:
    """Why ``spec.timeout`` can never fit any delivery like this one, or ``None``.

    ``lambda_limit`` is the executor invocation's whole time (its remaining time when it
    started). The lease bound is the lease's whole length (expiry less the pull time)."""
    timeout = spec.timeout
    if timeout is None or timeout <= 0:
        return None
    by_lease = lease_never_fits(spec, delivery, lease)
    if by_lease is not None:
        return by_lease
    job_timeout = delivery.timeout_seconds
    if job_timeout is not None and 0 < job_timeout < timeout:
        return (f"handler {spec.name!r} declares timeout={timeout:g}s, but the job's own timeout "
                f"is {job_timeout:g}s")
    if not spec.long_running and timeout > lambda_limit - report_margin:
        return (f"handler {spec.name!r} declares timeout={timeout:g}s, but the executor's Lambda "
                f"timeout of {lambda_limit:.0f}s less the report margin of {report_margin:g}s leaves "
                f"{max(0.0, lambda_limit - report_margin):.0f}s")
    return None
