"""Daemon threads that run handlers, reused from one run to the next.

Every run needs a thread of its own (the caller watches the time budget and may have to
abandon a handler that ignores cancellation), but starting and ending one per job was a
measurable share of the local worker's CPU. A thread that finished its run waits for the
next instead; one whose handler was abandoned simply comes back when (if ever) the
handler returns. While it runs a handler a thread is named ``sw-handler-<handler>``, and
``sw-handler-idle`` while it waits, so a thread dump shows what runs.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

__all__ = ["HandlerThreads", "handler_threads"]

_IDLE_NAME = "sw-handler-idle"

Task = tuple[str, Callable[[], None]]


class HandlerThreads:
    """Runs each task on an idle thread, or on a new one when none is idle.

    At most ``max_idle`` threads wait for work; one more finishing its run ends instead.
    """

    def __init__(self, max_idle: int = 64) -> None:
        self._max_idle = max_idle
        self._idle = 0
        self._lock = threading.Lock()
        self._work: queue.SimpleQueue[Task] = queue.SimpleQueue()

    def run(self, name: str, task: Callable[[], None]) -> None:
        """Start ``task`` on a thread named ``name``; raises RuntimeError when no thread can start.

        ``task`` must not raise: an error would end its thread (the handler runner's own
        task records every exception for the caller)."""
        with self._lock:
            if self._idle:
                self._idle -= 1
                self._work.put((name, task))
                return
        threading.Thread(target=self._serve, args=((name, task),), name=name, daemon=True).start()

    def idle(self) -> int:
        with self._lock:
            return self._idle

    def _serve(self, first: Task) -> None:
        current = threading.current_thread()
        name, task = first
        while True:
            current.name = name
            task()
            current.name = _IDLE_NAME
            with self._lock:
                if self._idle >= self._max_idle:
                    return
                self._idle += 1
            name, task = self._work.get()


handler_threads = HandlerThreads()
