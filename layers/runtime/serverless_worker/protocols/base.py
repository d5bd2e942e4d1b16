"""The one interface the runtime drives, whatever protocol is behind it.

The runtime never branches on a protocol's name: it asks the capability flags below
and calls these methods. Each protocol module translates them to its own endpoints
and maps :class:`~serverless_worker.model.Outcome` to its wire form. What the methods
take and return (``Delivery``, ``Lease``...) is the shared model, ``serverless_worker.model``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from ..logsafety import server_text
from ..model import Delivery, Lease, Outcome, ReportReceipt, SessionState

__all__ = [
    "WorkerIdentity",
    "WorkerStatus",
    "WorkerEvent",
    "PullRequest",
    "WorkerProtocol",
    "server_value",
]


def server_value(value: object) -> str:
    """A value a server sent, as a log line may quote it: bounded, controls escaped."""
    return repr(server_text(value if isinstance(value, str) else repr(value), (), limit=80))


class WorkerIdentity(BaseModel):
    """Who this worker says it is when it opens a session."""

    worker_name: str = "serverless-worker"
    instance_id: str
    handlers: list[str]
    version: str = "0"
    environment: str | None = None


class WorkerStatus(BaseModel):
    """What a heartbeat reports."""

    state: str = "ready"  # starting|ready|degraded|draining|stopped|error|offline
    in_flight: int = 0
    processed: int = 0
    failed: int = 0
    uptime_seconds: float | None = None


class WorkerEvent(BaseModel):
    """One lifecycle event for ``/workers/events`` (ignored where the protocol has none)."""

    level: str = "INFO"
    event_type: str
    message: str
    attributes: dict[str, Any] = Field(default_factory=dict)


class PullRequest(BaseModel):
    """A bounded pull for one handler: never more than ``max_items`` deliveries."""

    handler: str
    max_items: int = Field(ge=1)
    wait_seconds: float = 0.0
    criteria: dict[str, Any] | None = None  # claim queue only


class WorkerProtocol(ABC):
    """Template for a protocol client. One instance owns one pooled HTTP session.

    Capability flags let the runtime decide without naming the protocol.
    """

    name: ClassVar[str]
    needs_session: ClassVar[bool] = False      # open_session must be called before work
    has_lease: ClassVar[bool] = False          # acquire is a server call that can refuse
    lease_renewable: ClassVar[bool] = False    # renew extends the lease
    late_results: ClassVar[bool] = False       # a result after the lease lapsed still counts (if first)
    supports_events: ClassVar[bool] = False    # send_events reaches the server
    long_poll: ClassVar[bool] = False          # pull waits server-side for work (no idle sleep needed)
    empty_poll_backoff: ClassVar[float] = 1.0  # longest wait between empty pulls when not long-polling
    parallel_pulls: ClassVar[int] = 1          # pull calls at once while a backlog lasts (one item per call)
    batch_pull: ClassVar[bool] = False         # one pull call hands out up to a whole batch
    max_events_per_batch: ClassVar[int] = 200
    # A ledger id whose delivery settled comes back only from a server that forgot it (a
    # reset or re-created server reusing its ids): new work, to be recorded and run. False
    # where every execution gets a fresh id, so a settled one delivered again is a duplicate.
    settled_id_returns_as_new: ClassVar[bool] = True

    # -- session -------------------------------------------------------------
    def open_session(self, identity: WorkerIdentity) -> SessionState | None:
        """Bootstrap (Pipelogiq) and return the session to store; ``None`` when there is none."""
        return None

    def use_session(self, session: SessionState | None) -> None:
        """Adopt a session restored from the state store."""

    def session_confirmed(self, session: SessionState) -> bool:
        """Whether a call that checks the session went through with ``session``: its later
        rejection is then an expiry, not a server refusing the sessions it issues."""
        return False

    def heartbeat(self, status: WorkerStatus) -> None:
        """Report liveness; a no-op where the protocol has no heartbeat."""

    # -- work ----------------------------------------------------------------
    @abstractmethod
    def pull(self, request: PullRequest) -> list[Delivery]:
        """Take at most ``request.max_items`` deliveries. Never blindly retried."""

    def acquire(self, delivery: Delivery) -> Lease:
        """Take the execution lease; raises LeaseRefusedError with its reason."""
        return Lease(expires_at=delivery.lease_expires_at, attempt=delivery.attempt)

    def renew(self, delivery: Delivery) -> Lease:
        """Extend the lease; raises LeaseRefusedError on a definitive refusal."""
        return Lease(expires_at=delivery.lease_expires_at, attempt=delivery.attempt)

    def progress(self, delivery: Delivery, value: Any) -> None:
        """Report progress where the protocol can; otherwise ignore."""

    @abstractmethod
    def report(self, delivery: Delivery, outcome: Outcome) -> ReportReceipt:
        """Send the outcome, retrying ambiguous failures with the same body."""

    def acknowledge(self, delivery: Delivery) -> None:
        """Settle the delivery after a report (Pipelogiq ack requeue:false)."""

    def discard(self, delivery: Delivery) -> None:
        """Drop a stale or duplicate delivery without running it."""

    @abstractmethod
    def hand_back(self, delivery: Delivery) -> None:
        """Return an unstarted delivery without using an attempt (``not_started`` in docs/outcomes.md)."""

    # -- lifecycle -------------------------------------------------------------
    def send_events(self, events: Sequence[WorkerEvent]) -> None:
        """Send lifecycle events in batches; a no-op where there is no endpoint."""

    def shutdown(self, reason: str) -> None:
        """Mark the worker stopped (Pipelogiq); a no-op elsewhere."""

    def not_asked_for(self, request: PullRequest, delivery: Delivery) -> str | None:
        """Why ``delivery`` is not what ``request`` asked for, in words quoting the server's
        values (``type 'b', asked for 'a'``); ``None`` when it is. The runtime gives such a
        delivery back untouched (``runtime/pulling.py``): no handler runs, no attempt is used."""
        if delivery.handler != request.handler:
            return f"handler {server_value(delivery.handler)}, asked for {request.handler!r}"
        return None

    def take_unaddressable(self) -> list[str]:
        """What each delivery pulled since the last call and left without an outcome,
        because no request could name it, lacked (``"no executionId"``): the runtime counts
        these as answers it could not use (the local run's summary and exit status)."""
        return []

    def lease_untaken(self, delivery: Delivery) -> bool:
        """Whether the server shows ``delivery``'s execution as never leased: a run that died
        between its ledger record and its lease is then handed back, not settled as a
        timeout (a result without a lease is refused, and an ack would drop the job).
        ``False`` where the pull itself took the lease, or the server cannot tell."""
        return False

    def reconcile(self, delivery: Delivery) -> dict[str, Any] | None:
        """Read back what the server holds for ``delivery`` when the effect of a settling
        call is in doubt (an acknowledgement answered "not found"); ``None`` where the
        protocol offers no such read. Never raises for a failed read: says so instead."""
        return None

    @abstractmethod
    def close(self) -> None:
        """Release the pooled HTTP session."""

    def __enter__(self) -> WorkerProtocol:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
