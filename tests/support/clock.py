"""Controlled clocks: tests move time forward instead of sleeping, on the server's side
(``SandboxClock``: a lease or a session lapses on the sandbox) and on the client's
(``TickClock``: a tick's window, a drain's quiet time, a store's deadlines).

The sandboxes run in a thread of the test process and read the time only through their
module's ``time.time()``; ``SandboxClock`` stands in for that module, so an expiry is
decided exactly when the test says, however loaded the machine is; the client side keeps
the real clock there: what is tested is the server's verdict, which the client reads off the wire.
"""

from __future__ import annotations

import threading
import time

__all__ = ["SANDBOX_MODULES", "SandboxClock", "TickClock"]

# The sandbox modules whose ``time`` a test replaces (each calls only ``time.time()``).
SANDBOX_MODULES = (
    "serverless_worker.sandbox.pipelogiq",
    "serverless_worker.sandbox.priostack",
    "serverless_worker.sandbox.claimqueue",
)


class SandboxClock:
    """The wall clock plus an offset the test advances: ``clock.advance(0.6)``."""

    def __init__(self) -> None:
        self._offset = 0.0
        self._lock = threading.Lock()  # the server thread reads while the test writes

    def time(self) -> float:
        with self._lock:
            return time.time() + self._offset

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._offset += seconds


class TickClock:
    """The time of the code under test on the client side (a scheduler tick, a drain, a store):
    it moves only when that code waits (its sleeps are noted in ``waits``, not slept) or when
    the test calls ``advance``, so "stops within N seconds" and "N waits fit the window" read
    the code's own time, however loaded the machine is. The ``tick_clock`` fixture gives one.

    Pass ``clock`` as the code's clock and ``clock.sleep`` as its sleep: a loop that waits
    on it runs at once, and one that never waits never sees its window end (pytest's
    timeout then names it), so what a test counts can only depend on what the code did.
    """

    def __init__(self, start: float | None = None) -> None:
        self.now = time.time() if start is None else start
        self.waits: list[float] = []  # every sleep asked for, in order

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += max(0.0, seconds)

    def advance(self, seconds: float) -> float:
        """Time passing without a wait of the code's (a lease or a deadline running out)."""
        self.now += seconds
        return self.now
