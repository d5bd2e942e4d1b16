"""How a scheduler tick spends time without work: the wait after an empty pull, and how
long a tick stays when no pull returns anything (its liveness mode).

Both are pure arithmetic, shared by the scheduler and the cost model, so the model prices
exactly what a tick does.

Example::

    backoff = EmptyPollBackoff(first=0.2, cap=5.0)
    backoff.next_wait()   # 0.1-0.2 s after the first empty pull, then 0.2-0.4 s, ... up to 2.5-5 s
    backoff.reset()       # a pull returned work: poll again at once
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Literal, get_args

__all__ = [
    "LIVENESS_MARGIN_SECONDS",
    "WORK_LINGER_SECONDS",
    "EmptyPollBackoff",
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
        return min(self.cap, self.first * 2.0 ** min(self._empties, 30))

    def next_wait(self) -> float:
        """Note one more empty pull and return how long to wait before the next one."""
        step = self.step()
        self._empties += 1
        return step * (0.5 + 0.5 * self._rng())

    @property
    def empties(self) -> int:
        return self._empties


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
