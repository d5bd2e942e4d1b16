"""Worker lifecycle events, buffered and sent in batches (``/workers/events``).

Events are only emitted for things an operator wants in the activity feed (session
re-bootstrap, refusals, hand-backs, drain), never per successful job, so they add no
HTTP calls to the hot path.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ..errors import ServerlessWorkerError
from ..protocols.base import WorkerEvent, WorkerProtocol

__all__ = ["EventBuffer"]

log = logging.getLogger("serverless_worker.events")


class EventBuffer:
    """Collects events; ``flush`` sends them in batches of the protocol's maximum."""

    def __init__(self, limit: int = 1000) -> None:
        self._events: list[WorkerEvent] = []
        self._limit = limit
        self._lock = threading.Lock()
        self.dropped = 0

    def add(self, event_type: str, message: str, level: str = "INFO", **attributes: Any) -> None:
        with self._lock:
            if len(self._events) >= self._limit:
                self.dropped += 1
                return
            self._events.append(WorkerEvent(level=level, event_type=event_type, message=message,
                                            attributes=attributes))

    def flush(self, protocol: WorkerProtocol) -> int:
        """Send what is buffered; on failure keep nothing (events are best effort) and log."""
        with self._lock:
            events, self._events = self._events, []
        if not events or not protocol.supports_events:
            return 0
        size = protocol.max_events_per_batch
        sent = 0
        for start in range(0, len(events), size):
            batch = events[start:start + size]
            try:
                protocol.send_events(batch)
                sent += len(batch)
            except ServerlessWorkerError as err:
                log.warning("worker events not sent: %s", err)
        return sent

    def __len__(self) -> int:
        return len(self._events)
