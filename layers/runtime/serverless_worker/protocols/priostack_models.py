"""Typed wire models of the Priostack job-worker API.

Job keys are opaque JSON strings and never numbers: the job model uses strict strings
so a numeric key is a decoding error, never silently converted (a converted key would
address a different job, or none). Unknown response fields are ignored everywhere.
Informational fields (``deadline``, ``createdAt``) never make a job invalid.
The reconciliation reads (process instances, incidents) tolerate any shape beyond the
few fields the client uses.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, StrictInt, StrictStr

__all__ = [
    "ActivateRequest",
    "ActivateResponse",
    "CompleteRequest",
    "FailRequest",
    "HeartbeatResponse",
    "Incident",
    "PriostackJob",
    "ProcessInstance",
    "WorkerList",
    "WorkerRecord",
    "WorkerRegistration",
]


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


class _Wire(BaseModel):
    # Validators are built on first use: a function uses only some endpoints' models.
    model_config = ConfigDict(extra="ignore", defer_build=True)


class PriostackJob(_Wire):
    """One activated job. ``retries`` is the absolute count of attempts left."""

    key: StrictStr
    type: StrictStr
    processInstanceKey: StrictStr
    processDefinitionKey: StrictStr
    variables: dict[str, Any]
    retries: StrictInt
    # Informational only (jobs never expire); a malformed value reads as None.
    deadline: Annotated[int | None, BeforeValidator(_int_or_none)] = None
    createdAt: Annotated[str | None, BeforeValidator(_str_or_none)] = None


class ActivateRequest(_Wire):
    """``type`` is always sent: without it the server hands out jobs of every type."""

    type: str
    maxJobsToActivate: int = Field(ge=1)


class ActivateResponse(_Wire):
    """Jobs stay raw here so each one is decoded (and possibly rejected) on its own."""

    jobs: list[Any]


class CompleteRequest(_Wire):
    """``variables`` are merged into the process instance; omitted when there are none."""

    variables: dict[str, Any] | None = None


class FailRequest(_Wire):
    """Always carries ``retries``: an omitted value counts as 0 and raises an incident."""

    retries: int
    errorMessage: str


class WorkerRegistration(_Wire):
    topics: list[str]
    group_name: str | None = None


class WorkerRecord(_Wire):
    """A registered worker. The echoed ``api_key`` is a secret: masked and never dumped."""

    id: StrictStr
    api_key: SecretStr | None = Field(default=None, exclude=True, repr=False)
    topics: list[str] = Field(default_factory=list)
    last_heartbeat: str | None = None
    registered_at: str | None = None
    active: bool | None = None
    group_name: str | None = None


class HeartbeatResponse(_Wire):
    status: str
    worker_id: StrictStr | None = None


class WorkerList(_Wire):
    items: list[WorkerRecord]
    total: int | None = None


class ProcessInstance(BaseModel):
    """A process instance as read to reconcile a report; any extra field is kept."""

    model_config = ConfigDict(extra="allow")

    key: str | int | None = None
    state: str | None = None
    variables: dict[str, Any] | None = None


class Incident(BaseModel):
    """An incident record (``error_code`` JOB_FAILED for a job failed at 0 retries)."""

    model_config = ConfigDict(extra="allow")

    id: str | int | None = None
    key: str | int | None = None
    state: str | None = None
    error_code: str | None = None
