"""The one interface the runtime drives, whatever protocol is behind it.

The runtime never branches on a protocol's name: it asks the capability flags below
and calls these methods. Each protocol module translates them to its own endpoints
and maps :class:`~serverless_worker.outcome.Outcome` to its wire form.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from ..outcome import Outcome

__all__ = [
    "WorkerIdentity",
    "SessionState",
    "WorkerStatus",
    "WorkerEvent",
    "PullRequest",
    "Delivery",
    "Lease",
    "ReportReceipt",
    "WorkerProtocol",
]


class WorkerIdentity(BaseModel):
    """Who this worker says it is when it opens a session."""

    worker_name: str = "serverless-worker"
    instance_id: str
    handlers: list[str]
    version: str = "0"
    environment: str | None = None


class SessionState(BaseModel):
    """A worker session as stored in DynamoDB and restored by every Lambda.

    Only Pipelogiq has one; the others return ``None`` from ``open_session``.
    ``expires_at`` is computed from the configured TTL when the server does not say.
    """

    worker_id: str
    token: SecretStr
    issued_at: float
    expires_at: float
    heartbeat_interval: float = 15.0
    offline_after: float = 45.0
    attributes: dict[str, Any] = Field(default_factory=dict)  # e.g. appId, queue pattern

    def expires_within(self, seconds: float, now: float | None = None) -> bool:
        return (now if now is not None else time.time()) + seconds >= self.expires_at

    def to_record(self) -> dict[str, Any]:
        """Plain dict for storage: the token is revealed here and only here."""
        data = self.model_dump(mode="json")
        data["token"] = self.token.get_secret_value()
        return data


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


class Delivery(BaseModel):
    """One pulled job, protocol-neutral.

    ``ledger_id`` identifies the *execution* (a redelivery of the same execution maps
    to the same id, so the ledger's conditional write spots duplicates). ``wire`` holds
    the non-secret protocol fields needed to act on it later; ``token`` the secret
    delivery token where the protocol has one. ``invalid`` says why a delivery that can be
    addressed cannot be run (a malformed envelope or payload): the handler is never
    called, and the job gets a definite bad-input outcome.
    """

    model_config = ConfigDict(frozen=True)

    protocol: str
    handler: str
    job_id: str
    ledger_id: str
    attempt: int = 1
    retries_left: int | None = None
    payload: Any = None
    timeout_seconds: float | None = None
    lease_expires_at: float | None = None
    created_at: float | None = None
    pulled_at: float = Field(default_factory=time.time)
    token: SecretStr | None = None
    wire: dict[str, Any] = Field(default_factory=dict)
    invalid: str | None = None

    def to_record(self) -> dict[str, Any]:
        """Plain dict for the ledger: the token is revealed here and only here.

        Empty fields are left out (``from_record`` restores their defaults): every ledger
        write is billed by the item's size in 1 KB units, and a Pipelogiq delivery with its
        unused trace fields spelled out crosses 1 KB."""
        data = self.model_dump(mode="json", exclude_none=True)
        data["wire"] = {name: value for name, value in data.get("wire", {}).items() if value is not None}
        if self.token is not None:
            data["token"] = self.token.get_secret_value()
        return data

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> Delivery:
        wire = data.get("wire")
        if isinstance(wire, dict) and "invalid" in wire and "invalid" not in data:
            # recorded before ``invalid`` was a field of its own: it travelled in ``wire``
            wire = dict(wire)
            data = {**data, "wire": wire, "invalid": str(wire.pop("invalid"))}
        return cls.model_validate(data)


class Lease(BaseModel):
    """Permission to run a delivery until ``expires_at`` (``None``: no expiry, e.g. Priostack)."""

    expires_at: float | None = None
    attempt: int | None = None
    renewable: bool = False


class ReportReceipt(BaseModel):
    """What the server said about a reported outcome.

    ``already_applied`` is set when a retried report got 404 (Priostack): the first try
    most likely went through. ``detail`` carries any reconciliation read.
    """

    accepted: bool = True
    status: str | None = None
    already_applied: bool = False
    detail: dict[str, Any] = Field(default_factory=dict)


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

    def take_unaddressable(self) -> list[str]:
        """What each delivery pulled since the last call and left without an outcome,
        because no request could name it, lacked (``"no executionId"``): the runtime counts
        these as answers it could not use (the local run's summary and exit status)."""
        return []

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
