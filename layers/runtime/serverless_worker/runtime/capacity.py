"""How many deliveries may be in flight at once: one rule for the scheduler and for
executors that keep pulling, so neither ever takes a slot the other counts as taken.
"""

from __future__ import annotations

from ..settings import Settings

__all__ = ["capacity_limit"]


def capacity_limit(settings: Settings) -> int:
    """``max_in_flight``, or the executor's reserved concurrency when that is lower.

    Throttled async invocations wait and then come back as redeliveries: never pull more
    than the executor can run at once.
    """
    limit = settings.max_in_flight
    if settings.executor_reserved_concurrency:
        limit = min(limit, settings.executor_reserved_concurrency)
    return int(limit)
