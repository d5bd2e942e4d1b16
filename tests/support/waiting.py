"""Waiting on observable state instead of sleeping: every tier polls the sandbox's admin
API, the ledger or a process through these two functions, so a slow machine only makes a
test slower, never wrong, and a condition that never holds fails naming what was awaited.

``wait_for``'s limit only bounds a hang: ``HANG_SECONDS`` unless the wait has a reason of its
own for another, generous on CI's loaded 2-core machine, where what takes a tenth of a
second on a quiet one may take several. What a test asserts never depends on it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["HANG_SECONDS", "poll", "wait_for"]

# The longest a condition that must come true is waited for before the test fails.
HANG_SECONDS = 60.0


def poll(predicate: Callable[[], Any], timeout: float, interval: float = 0.05) -> Any:
    """Call ``predicate`` until it returns something true and return that, or return the
    last (false) value after ``timeout`` seconds: for loops that try again on a miss."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def wait_for(predicate: Callable[[], Any], timeout: float = HANG_SECONDS, what: str = "condition",
             interval: float = 0.05) -> Any:
    """Like ``poll``, but a condition still false after ``timeout`` seconds fails the test."""
    value = poll(predicate, timeout, interval)
    assert value, f"timed out after {timeout}s waiting for {what}"
    return value
