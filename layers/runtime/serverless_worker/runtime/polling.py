"""How a scheduler tick spends time without work: the wait after an empty pull, and how
long a tick stays when no pull returns anything (its liveness mode).

Both are pure arithmetic, shared by the scheduler and the cost model, so the model prices
exactly what a tick does.

Example::

    backoff = EmptyPollBackoff(first=0.2, cap=5.0)
    backoff.next_wait()   # 0.1-0.2 s after the first empty pull, then 0.2-0.4 s, ... up to 2.5-5 s
    backoff.reset()       # a pull returned work: poll again at once

A long poll is only as good as the server that holds it: ``answered_early`` tells the
scheduler that an empty answer came back sooner than the wait it asked for (a server
that ignores ``waitSeconds``, or answers ``204`` at once), and such pulls are paced by
the same back-off as a protocol without a long poll. ``KeyedBackoff`` paces what a
server refuses over and over, per key (a job handed back or refused, then delivered
again).
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Literal, get_args

__all__ = [
    "LIVENESS_MARGIN_SECONDS",
    "WORK_LINGER_SECONDS",
    "EARLY_ANSWER_FRACTION",
    "EmptyPollBackoff",
    "KeyedBackoff",
    "answered_early",
    "backoff_step",
    "upper_half",
    "Liveness",
    "LIVENESS_MODES",
    "idle_polls",
    "idle_window",
]

Liveness = Literal["full-window", "continuous", "while-work"]
LIVENESS_MODES: tuple[str, ...] = get_args(Liveness)

# A tick's last heartbeat comes this long after the latest moment that keeps the gap to the
# next tick's first heartbeat under the server's offline threshold: the next tick may start
# late (schedule jitter, a cold start) and heartbeats only after loading its session.
LIVENESS_MARGIN_SECONDS = 4.0
# Outside the full-window mode, a tick that got work goes on until no pull has returned
# anything for this long (or its poll window ends): a trickle of jobs is taken at once,
# and a finished burst does not keep the tick billing for the rest of its window.
WORK_LINGER_SECONDS = 10.0
# An empty long poll that came back in less than this share of the wait it asked for was
# not held by the server (a conforming one answers empty only at its deadline).
EARLY_ANSWER_FRACTION = 0.5


def backoff_step(first: float, cap: float, failures: int) -> float:
    """The upper bound of the wait after the ``failures``-th failure in a row, without
    jitter: ``first * 2**(failures-1)``, capped at ``cap`` (0 before any failure)."""
    if failures <= 0:
        return 0.0
    return min(cap, first * 2.0 ** min(failures - 1, 30))


def upper_half(step: float, rng: Callable[[], float]) -> float:
    """A wait drawn from the upper half of ``step`` (``rng`` in [0, 1)): many workers that
    back off together do not retry in step, and none waits less than half the step."""
    return step * (0.5 + 0.5 * rng())


def answered_early(asked_seconds: float, took_seconds: float) -> bool:
    """Whether an empty answer to a long poll of ``asked_seconds`` that took
    ``took_seconds`` came back too soon to have been held: the server has no long poll."""
    return asked_seconds > 0 and took_seconds < asked_seconds * EARLY_ANSWER_FRACTION


class EmptyPollBackoff:
    """The wait before the next pull of a protocol without a long poll.

    Poll again at once while pulls return work; after the n-th empty pull in a row wait
    ``first * 2**(n-1)``, capped at ``cap``, each wait drawn from its upper half (so many
    workers do not poll in step). Jobs arriving one by one are taken within a few tenths
    of a second, and an idle server sees about one poll per ``cap`` seconds.
    """

    def __init__(self, first: float, cap: float, *, rng: Callable[[], float] = random.random) -> None:
        if first <= 0:
            raise ValueError("the first wait after an empty pull must be positive")
        self.first = min(first, cap)
        self.cap = max(0.0, cap)
        self._rng = rng
        self._empties = 0

    def reset(self) -> None:
        """A pull returned work."""
        self._empties = 0

    def step(self) -> float:
        """The upper bound of the next wait, without jitter."""
        return backoff_step(self.first, self.cap, self._empties + 1)

    def next_wait(self) -> float:
        """Note one more empty pull and return how long to wait before the next one."""
        step = self.step()
        self._empties += 1
        return upper_half(step, self._rng)

    @property
    def empties(self) -> int:
        return self._empties


class KeyedBackoff:
    """A bounded, jittered back-off per key, for what a server refuses over and over.

    ``note(key)`` records one more refusal of ``key`` (a job handed back, a lease
    refused, a session the server rejected) and returns the wait it earned, drawn from
    the upper half of ``backoff_step`` so that many workers do not retry in step;
    ``pause(key)`` is what is left of that wait now; ``clear(key)`` forgets it once the
    key went through. Keys are forgotten ``forget_after`` seconds after their last
    refusal, and at most ``max_keys`` are kept (the oldest go first): memory stays
    bounded however many jobs a server refuses. Thread-safe.
    """

    def __init__(self, first: float, cap: float, *, forget_after: float = 300.0, max_keys: int = 10_000,
                 rng: Callable[[], float] = random.random, clock: Callable[[], float] = time.monotonic) -> None:
        if first <= 0:
            raise ValueError("the first wait after a refusal must be positive")
        self.first = min(first, cap)
        self.cap = max(0.0, cap)
        self._forget_after = forget_after
        self._max_keys = max(1, max_keys)
        self._rng = rng
        self._clock = clock
        self._lock = threading.Lock()
        self._keys: OrderedDict[Hashable, tuple[int, float, float]] = OrderedDict()  # refusals, at, due

    def note(self, key: Hashable) -> float:
        """One more refusal of ``key``; returns the wait before it should be tried again."""
        now = self._clock()
        with self._lock:
            refusals, at, _ = self._keys.pop(key, (0, now, now))
            if now - at >= self._forget_after:
                refusals = 0
            refusals += 1
            wait = upper_half(backoff_step(self.first, self.cap, refusals), self._rng)
            self._keys[key] = (refusals, now, now + wait)
            while len(self._keys) > self._max_keys:
                self._keys.popitem(last=False)
            return wait

    def pause(self, key: Hashable) -> float:
        """Seconds until ``key`` may be tried again (0 when it may now)."""
        now = self._clock()
        with self._lock:
            entry = self._keys.get(key)
            if entry is None:
                return 0.0
            if now - entry[1] >= self._forget_after:
                del self._keys[key]
                return 0.0
            return max(0.0, entry[2] - now)

    def refusals(self, key: Hashable) -> int:
        with self._lock:
            entry = self._keys.get(key)
            return entry[0] if entry is not None else 0

    def clear(self, key: Hashable) -> None:
        """``key`` went through: its next refusal starts from the first wait again."""
        with self._lock:
            self._keys.pop(key, None)


def idle_window(mode: str, *, window: float, schedule_seconds: float, heartbeat_interval: float | None,
                offline_after: float | None) -> float:
    """Seconds a tick stays in its window while no pull returns work (at least one round of
    pulls is always made).

    ``full-window``: the whole poll window. ``while-work``: none (one round of pulls).
    ``continuous``: the shortest window whose closing heartbeat keeps the silence until the
    next tick's first heartbeat under the server's offline threshold; none where the
    protocol has no heartbeat to keep (``heartbeat_interval`` ``None``).
    """
    if mode == "full-window":
        return max(0.0, window)
    if mode == "while-work" or heartbeat_interval is None or offline_after is None:
        return 0.0
    if mode != "continuous":
        raise ValueError(f"unknown liveness mode {mode!r}; expected one of {', '.join(LIVENESS_MODES)}")
    needed = schedule_seconds - offline_after + LIVENESS_MARGIN_SECONDS
    return max(0.0, min(window, needed))


def idle_polls(seconds: float, *, first: float, cap: float, long_poll_seconds: float | None = None) -> float:
    """Pull calls an idle tick makes in ``seconds`` of window (the expected count, jitter
    at its mean): one per long poll, or the first pull plus one per backoff wait."""
    if seconds <= 0:
        return 1.0
    if long_poll_seconds is not None:
        return float(max(1, math.ceil(seconds / max(1.0, long_poll_seconds))))
    backoff = EmptyPollBackoff(first, cap, rng=lambda: 0.5)
    polls, spent = 1.0, 0.0
    while True:
        wait = backoff.next_wait()
        if wait <= 0 or spent + wait > seconds:
            return polls
        spent += wait
        polls += 1
