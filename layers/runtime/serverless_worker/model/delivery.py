"""A delivery and what the worker holds about it: the lease, the server's receipt, the session.

Protocol clients make these from their wire forms and the state store keeps them, so
they belong to neither: both import them from here (docs/contributing/architecture.md).
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr

__all__ = ["Delivery", "Lease", "ReportReceipt", "SessionState"]


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
