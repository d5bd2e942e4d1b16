"""A controlled clock for the sandboxes: tests move the server's time forward instead of
sleeping until a lease or a session lapses on it.

The sandboxes run in a thread of the test process and read the time only through their
module's ``time.time()``; ``SandboxClock`` stands in for that module, so an expiry is
decided exactly when the test says, however loaded the machine is. The client side keeps
the real clock: what is tested is the server's verdict, which the client reads off the wire.
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
    """A scheduler tick's time on the client side: it moves only when the tick waits (its
    sleeps are not slept), so a test of "stops within N seconds" reads the tick's own time."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)
