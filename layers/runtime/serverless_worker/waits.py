"""Every wait on a server's word is bounded: ``Retry-After`` read as the standard says,
cut to the time left, and ended when the process gives up on what it was waiting for.

A server chooses its ``Retry-After``; the worker chooses how long it can afford. A
value that is not a number or a date (``inf``, ``nan``, ``-5``, garbage) is treated as
absent, never as "wait forever" or "retry at once". A valid one is honoured only when it
fits the time left, the earliest of: the retry budget (``protocols/_http.py``, the
``max_wait_seconds`` setting), each limit a caller set with :func:`time_limit` (a Lambda
invocation's deadline, a job's lease end less the report margin, a tick, a drain's
grace), and the process's own end (:func:`end_waits_by`: the local worker's stop, a few
seconds after Ctrl-C, SIGTERM or a drain; :func:`abandon_waits`: at once). A wait that
does not fit is not waited at all: the call gives up at once, and its caller leaves the
outcome stored for the reaper or the next run. :func:`limit` says which limit binds, in
words, for that one log line.

Example::

    parse_retry_after("120")                            # 120.0
    parse_retry_after("Wed, 21 Oct 2026 07:28:00 GMT")  # seconds until then, 0.0 if past
    with time_limit(lambda: context.get_remaining_time_in_millis() / 1000, what="the invocation's deadline"):
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
from dataclasses import dataclass
from datetime import UTC

__all__ = ["Limit", "abandon_waits", "allow_waits", "end_waits_by", "limit", "parse_retry_after", "pause",
           "time_left", "time_limit", "waits_abandoned"]

# delta-seconds (RFC 9110 §10.2.3: digits). A decimal fraction is accepted too: the
# sandboxes and some servers send "0.5".
_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]+)?", re.ASCII)
# How often a long pause re-reads the time left (a limit may end early: a stop requested).
_RECHECK_SECONDS = 0.25

_limits: contextvars.ContextVar[tuple[tuple[Callable[[], float], str], ...]] = contextvars.ContextVar(
    "serverless_worker_wait_limits", default=())
# The process's own end of every wait (time.monotonic), inf while none is set; _changed wakes
# the pauses in progress when it moves.
_end_by = math.inf
_ENDED_BY = "the worker stopping"
_changed = threading.Event()


@dataclass(frozen=True)
class Limit:
    """The time left for a wait and the limit that sets it, in words."""

    seconds: float
    what: str


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
def time_limit(seconds_left: Callable[[], float], *, what: str = "a time limit") -> Iterator[None]:
    """Within the block, no retry wait in this thread outlasts ``seconds_left()`` (read each
    time it is needed; nested limits all apply). ``what`` names it in the log line of a
    wait it cuts ("the invocation's deadline")."""
    token = _limits.set((*_limits.get(), (seconds_left, what)))
    try:
        yield
    finally:
        _limits.reset(token)


def limit() -> Limit:
    """The least time left of the limits this thread is in, and which one it is
    (``inf`` outside any); 0 once the process's end (:func:`end_waits_by`) has come."""
    ends_in = _end_by - time.monotonic()
    least = Limit(max(0.0, ends_in), _ENDED_BY) if ends_in < math.inf else Limit(math.inf, "no limit")
    for seconds_left, what in _limits.get():
        value = seconds_left()
        if math.isnan(value):  # a limit that cannot be read leaves no time
            value = 0.0
        if value < least.seconds:
            least = Limit(value, what)
    return least


def time_left() -> float:
    """:func:`limit`'s seconds."""
    return limit().seconds


def pause(seconds: float) -> bool:
    """Wait ``seconds``, or less when the time left runs out first; ``False`` when the wait
    was cut short (the time is up, or the process's end came)."""
    end = time.monotonic() + seconds
    while True:
        now = time.monotonic()
        left = time_left()
        if left <= 0:
            return False
        if now >= end:
            return True
        _changed.wait(min(end - now, left, _RECHECK_SECONDS))


def end_waits_by(deadline: float) -> None:
    """Every wait of this process, in every thread, ends by ``deadline`` (``time.monotonic``)
    at the latest, and no call is retried after it (the local worker, once a stop is
    requested). Only ever moves the end earlier."""
    global _end_by
    if deadline < _end_by:
        _end_by = deadline
        _changed.set()
        _changed.clear()


def abandon_waits() -> None:
    """The process is giving up on whatever still waits: every retry wait ends now, and no
    call is retried again (the local worker, once its drain's grace is over)."""
    end_waits_by(time.monotonic())


def allow_waits() -> None:
    """Undo :func:`end_waits_by` and :func:`abandon_waits` (a new run in the same process)."""
    global _end_by
    _end_by = math.inf


def waits_abandoned() -> bool:
    """The process's end of waits has come: no call is retried now."""
    return time.monotonic() >= _end_by
