"""Deliveries a client cannot address, and when they mean the server speaks something else.

A delivery without the fields a protocol needs to report on it (Pipelogiq's stage
address, Priostack's key, the claim queue's item id) can be given no outcome. It is
never acknowledged away: each client leaves it to the server's own return path (a
visibility timeout, a lease lapse) or hands it back. One such delivery among good ones
is a broken message; a server *none* of whose deliveries can be addressed speaks
another version of the protocol, and pulling from it again only takes more work nobody
can do. :class:`AddressTally` tells the two apart (docs/protocols.md, "Older Pipelogiq
servers").
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence

__all__ = ["UNADDRESSABLE_PER_PULL", "AddressTally"]

# How many unaddressable deliveries one pull takes beyond what it was asked for: they use
# no capacity (nothing runs), so a broken message never hides the good ones behind it, but
# a pull stays bounded against a server that hands out nothing else.
UNADDRESSABLE_PER_PULL = 10


class AddressTally:
    """Counts addressable and unaddressable deliveries over a client's life.

    The server is judged unworkable only while *no* delivery so far could be addressed:
    once one could, later broken ones are single bad messages, whatever their number.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # claims run in parallel threads
        self.addressed = 0
        self.unaddressable = 0
        self._untaken: list[str] = []  # what each one lacked, until take_unaddressable()

    def note(self, addressed: int, lacks: Sequence[str]) -> str | None:
        """Record one pull's deliveries (``lacks``: what each unaddressable one lacks).
        Returns what the server lacks when every delivery so far lacked something."""
        with self._lock:
            self.addressed += addressed
            self.unaddressable += len(lacks)
            self._untaken.extend(lacks)
            if self.addressed or not lacks:
                return None
        return Counter(lacks).most_common(1)[0][0]

    def take_unaddressable(self) -> list[str]:
        """What each unaddressable delivery noted since the last call lacked (``no
        executionId``), once: the runtime reports them as answers it could not use."""
        with self._lock:
            taken, self._untaken = self._untaken, []
        return taken
