"""Every wait on a server's word is bounded: ``Retry-After`` read as the standard says,
cut to the time left, and ended when the process gives up on what it was waiting for.

A server chooses its ``Retry-After``; the worker chooses how long it can afford. A
value that is not a number or a date (``inf``, ``nan``, ``-5``, garbage) is treated as
absent, never as "wait forever" or "retry at once". A valid one is honoured up to the
time left: the retry budget (``protocols/_http.py``), the time a caller set with
:func:`time_limit` (a Lambda invocation's remaining time, a tick, a drain's grace), and
no longer once the process has called :func:`abandon_waits` (the local worker's drain
gave up: the delivery stays unsettled in the ledger, and the next run settles it).

Example::

    parse_retry_after("120")                            # 120.0
    parse_retry_after("Wed, 21 Oct 2026 07:28:00 GMT")  # seconds until then, 0.0 if past
    with time_limit(lambda: context.get_remaining_time_in_millis() / 1000):
        ...  # every retry wait in this thread ends before the invocation does
"""

from __future__ import annotations

import contextvars
import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC

__all__ = ["abandon_waits", "allow_waits", "parse_retry_after", "pause", "time_left", "time_limit",
           "waits_abandoned"]

# delta-seconds (RFC 9110 §10.2.3: digits). A decimal fraction is accepted too: the
# sandboxes and some servers send "0.5".
_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]+)?", re.ASCII)
# How often a long pause re-reads the time left (a limit may end early: a stop requested).
_RECHECK_SECONDS = 0.25

_limits: contextvars.ContextVar[tuple[Callable[[], float], ...]] = contextvars.ContextVar(
    "serverless_worker_wait_limits", default=())
_abandoned = threading.Event()


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds or an HTTP date (a date
    already past is 0). ``None`` when absent or unusable: negative, not finite, too large
    for a float, or neither form."""
    if value is None:
        return None
    text = value.strip()
    if _SECONDS.fullmatch(text):
        seconds = float(text)
        return seconds if math.isfinite(seconds) else None
    from email.utils import parsedate_to_datetime  # here: only a date needs it, not a cold start

    try:
        when = parsedate_to_datetime(text)
        # No zone ("-0000") means UTC, as an HTTP date always is.
        stamp = (when if when.tzinfo is not None else when.replace(tzinfo=UTC)).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    seconds = stamp - (time.time() if now is None else now)
    return max(0.0, seconds) if math.isfinite(seconds) else None


@contextmanager
def time_limit(seconds_left: Callable[[], float]) -> Iterator[None]:
    """Within the block, no retry wait in this thread outlasts ``seconds_left()`` (read each
    time it is needed; nested limits all apply)."""
    token = _limits.set((*_limits.get(), seconds_left))
    try:
        yield
    finally:
        _limits.reset(token)


def time_left() -> float:
    """The least time left of the limits this thread is in (``inf`` outside any); 0 once
    :func:`abandon_waits` was called."""
    if _abandoned.is_set():
        return 0.0
    left = math.inf
    for seconds_left in _limits.get():
        value = seconds_left()
        left = min(left, value) if not math.isnan(value) else 0.0
    return left


def pause(seconds: float) -> bool:
    """Wait ``seconds``, or less when the time left runs out first; ``False`` when the wait
    was cut short (the time is up, or the waits were abandoned)."""
    end = time.monotonic() + seconds
    while True:
        now = time.monotonic()
        left = time_left()
        if left <= 0:
            return False
        if now >= end:
            return True
        if _abandoned.wait(min(end - now, left, _RECHECK_SECONDS)):
            return False


def abandon_waits() -> None:
    """The process is giving up on whatever still waits: every retry wait ends now, and no
    call is retried again (the local worker, once its drain's grace is over)."""
    _abandoned.set()


def allow_waits() -> None:
    """Undo :func:`abandon_waits` (a new run in the same process)."""
    _abandoned.clear()


def waits_abandoned() -> bool:
    return _abandoned.is_set()
