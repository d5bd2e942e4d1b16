"""What a process may be told of each delivery it handles: the local runner's live status
and its idle edge are built on it (``local/observe.py``). Lambda has no watcher.

A protocol of its own so the settling code and the services that hold a watcher both
depend on it, and not on each other.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..model import Delivery

__all__ = ["DeliveryWatcher"]


class DeliveryWatcher(Protocol):
    """Told of each delivery as it is recorded and as it settles, in this process, with no
    I/O: the local runner's live status counts jobs from it. Lambda has none."""

    def recorded(self, delivery: Delivery) -> None:
        """The delivery is in the ledger and about to be dispatched."""

    def settled(self, delivery: Delivery, how: str) -> None:
        """It settled: ``done``, ``failed`` (a result reported), ``handed_back`` or ``discarded``."""

    def unsettled(self, job_id: str, reason: str) -> None:
        """The delivery of ``job_id`` could not be recorded nor given an outcome
        (``runtime/poison.py``): left to the server's timeout, never to be settled by this run."""

    def progress(self, delivery: Delivery, value: Any) -> None:
        """The handler reported ``value`` through ``job.progress`` (on the handler's thread:
        keep it, format it later)."""

    def pull_begins(self) -> bool:
        """A pull is about to be sent; ``False``: the run is ending, send none. Paired with
        :meth:`pull_ended`, so a run that ends when idle never ends with a pull in flight."""

    def pull_ended(self, deliveries: int) -> None:
        """The pull begun is over and brought ``deliveries`` (counted as work at once, before
        they are recorded and dispatched, so no idle edge falls between)."""

