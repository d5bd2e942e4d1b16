"""``job.progress`` values to the job server, for the executor and the state machine's steps.

Best effort: a progress report that fails is logged and the handler goes on. One answer
is different: the claim queue's ``accepted:false`` says the item is already terminal
(another worker finished it, or the queue timed it out). Its result would be discarded,
so the handler is stopped as if its lease were lost and nothing is reported for it
(docs/protocols.md, claim queue).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import ProtocolError, ResultNotAcceptedError

if TYPE_CHECKING:
    from ..model import Delivery
    from .events import EventBuffer
    from .protocol_client import ProtocolCaller
    from .watcher import DeliveryWatcher

__all__ = ["progress_reporter"]

log = logging.getLogger("serverless_worker.runtime")


def progress_reporter(client: ProtocolCaller, events: EventBuffer, delivery: Delivery,
                      on_terminal: Callable[[str], None] | None,
                      watcher: DeliveryWatcher | None = None) -> Callable[[Any], None]:
    """The ``progress`` callback for one run: one try through ``client``'s protocol, and
    ``events`` told of a job finished elsewhere; ``on_terminal(why)`` cancels it. ``watcher``
    (the local runner's) is told of every value, whether the protocol has progress or not."""

    def report(value: Any) -> None:
        if watcher is not None:
            watcher.progress(delivery, value)
        try:
            client.protocol.progress(delivery, value)
        except ResultNotAcceptedError as err:
            why = f"the server no longer accepts work on job {delivery.job_id}: it is {err.item_status}"
            log.warning("%s%s", why, "; stopping the handler" if on_terminal is not None else "")
            events.add("job.terminal_elsewhere", why, level="WARN", job_id=delivery.job_id, status=err.item_status)
            if on_terminal is not None:
                on_terminal(why)
        except ProtocolError as err:
            log.info("progress not reported: %s", err)

    return report
