"""Typed wire models of the Pipelogiq 0.5.0 custom HTTP worker API.

Field names are the document's, exactly. Answers ignore unknown fields; request bodies
are built from models with exact names and dumped without ``None`` fields (except
``isSuccess``, which is always a bool and therefore always sent: omitted, the server
reads ``false``). Numeric identifiers the document calls numbers are strict ints, so a
string there is a protocol violation rather than a silent conversion. The bootstrap
answer's ``messageBroker`` holds a connection string (a secret the HTTP worker does not
need): no model has a field for it, so it is dropped on decoding and never stored.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import (
    AliasChoices,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    StrictBool,
    StrictInt,
    StrictStr,
)

__all__ = [
    "DEFAULT_STAGE_NEXT_PATTERN",
    "MAX_RESULT_BYTES",
    "MAX_RESULT_REQUEST_BYTES",
    "MAX_WAIT_SECONDS",
    "AckBody",
    "ApplicationInfo",
    "BootstrapRequest",
    "BootstrapResponse",
    "ContextItem",
    "CreatePipelineBody",
    "EventItem",
    "EventsBody",
    "HeartbeatInfo",
    "HeartbeatRequest",
    "LeaseAnswer",
    "LeaseBody",
    "PipelineCreated",
    "PipelineRef",
    "PipelineStatus",
    "PullBody",
    "PullEnvelope",
    "ResultContextItem",
    "ResultLogItem",
    "ResultRequest",
    "ShutdownBody",
    "StageAddress",
    "StageOptions",
    "StagePayload",
    "StageSpec",
]

MAX_RESULT_BYTES = 262_144            # `result` string, UTF-8
MAX_RESULT_REQUEST_BYTES = 327_680    # whole result request JSON
MAX_WAIT_SECONDS = 20                 # pull long-poll range is 0-20
DEFAULT_STAGE_NEXT_PATTERN = "{appId}_{handler}_StageNext"


def _id_to_str(value: Any) -> Any:
    """Worker ids are sent as JSON strings (the document builds bodies with ``--arg``);
    accept a numeric id in an answer and keep it as text."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


class _Answer(BaseModel):
    """A server answer: unknown fields are ignored. Like every wire model, its validator is
    built on first use (``defer_build``): a function uses only some endpoints' models."""

    model_config = ConfigDict(extra="ignore", defer_build=True)


class _Body(BaseModel):
    """A request body: exact names only, ``None`` fields left out."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    def wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


# -- bootstrap and heartbeat ----------------------------------------------------------
class BootstrapRequest(_Body):
    """``workerName`` is required; the rest is optional and informational."""

    workerName: str
    instanceId: str | None = None
    supportedHandlers: list[str] | None = None
    workerVersion: str | None = None
    sdkVersion: str | None = None
    environment: str | None = None
    hostName: str | None = None
    pid: int | None = None
    capabilities: list[str] | None = None
    metadata: dict[str, Any] | None = None


class ApplicationInfo(_Answer):
    applicationId: StrictInt          # numeric; a string here is a protocol violation
    applicationName: str = ""
    appId: StrictStr                  # queue prefix such as "app_12"


class HeartbeatInfo(_Answer):
    intervalSec: float = 15.0
    offlineAfterSec: float = 45.0


class BootstrapResponse(_Answer):
    """The bootstrap answer without ``messageBroker`` (see the module docstring)."""

    workerId: Annotated[StrictStr, BeforeValidator(_id_to_str)]
    workerSessionToken: SecretStr
    configVersion: str | int | None = None
    application: ApplicationInfo
    queues: dict[str, Any] = Field(default_factory=dict)
    heartbeat: HeartbeatInfo = Field(default_factory=HeartbeatInfo)
    observability: dict[str, Any] = Field(default_factory=dict)
    # Not in the document; honoured when a server states the session expiry.
    sessionExpiresAt: AwareDatetime | None = Field(
        default=None, validation_alias=AliasChoices("sessionExpiresAt", "workerSessionExpiresAt"))

    @property
    def stage_next_pattern(self) -> str:
        pattern = self.queues.get("stageNextPattern")
        return pattern if isinstance(pattern, str) and pattern else DEFAULT_STAGE_NEXT_PATTERN


class HeartbeatRequest(_Body):
    workerId: str
    state: str | None = None  # starting|ready|degraded|draining|stopped|error|offline
    inFlightJobs: int | None = None
    jobsProcessed: int | None = None
    jobsFailed: int | None = None
    uptimeSeconds: int | None = None  # whole seconds: the server's counters are integers


# -- pull ---------------------------------------------------------------------------
class PullBody(_Body):
    queue: str
    waitSeconds: int = Field(default=0, ge=0, le=MAX_WAIT_SECONDS)


class ContextItem(_Answer):
    key: str
    value: str | None = None
    valueType: str | None = None
    isSensitive: bool | None = None


class StageAddress(_Answer):
    """The fields without which a delivery cannot be leased or reported at all."""

    stageId: StrictInt
    pipelineId: StrictInt
    executionId: StrictStr = Field(min_length=1)
    attempt: StrictInt = Field(default=1, ge=1)


class StagePayload(_Answer):
    """The stage message inside a delivery. ``input`` and ``prevStageOutput`` are strings
    the application parses by its own contract."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    stageId: StrictInt
    pipelineId: StrictInt
    executionId: StrictStr = Field(min_length=1)
    attempt: StrictInt = Field(default=1, ge=1)
    stageHandlerName: str | None = Field(
        default=None, validation_alias=AliasChoices("stageHandlerName", "handlerName"))
    stageName: str | None = None
    input: str | None = None
    prevStageOutput: str | None = None
    context: list[ContextItem] = Field(default_factory=list)
    idempotencyKey: str | None = Field(
        default=None, validation_alias=AliasChoices("idempotencyKey", "pipelineIdempotencyKey"))
    timeoutSeconds: float | None = Field(default=None, gt=0)
    traceId: str | None = None
    spanId: str | None = None
    traceparent: str | None = None


class PullEnvelope(_Answer):
    """A 200 pull answer. ``payload`` stays raw so a bad payload can be told apart from
    a missing token (see ``PipelogiqClient._decode``)."""

    token: SecretStr
    queue: str = ""
    messageId: str | int | None = None
    payload: Any = None
    headers: dict[str, Any] = Field(default_factory=dict)


# -- lease ----------------------------------------------------------------------------
class LeaseBody(_Body):
    executionId: str
    workerId: str


class LeaseAnswer(_Answer):
    acquired: StrictBool
    reason: str | None = None
    attempt: int | None = None
    # Any date-time here; one without a time zone is refused by the client, naming it
    # (docs/protocols.md, "Pacing empty pulls and refusals").
    leaseExpiresAt: datetime | None = None


# -- result -----------------------------------------------------------------------------
class ResultLogItem(_Body):
    message: str
    logLevel: str = "INFO"
    created: str  # RFC 3339


class ResultContextItem(_Body):
    """A context update, or a tombstone ``{"key": ..., "isDeleted": true}``."""

    key: str
    value: str | None = None
    valueType: str | None = None
    isSensitive: bool | None = None
    isDeleted: bool | None = None


class StageOptions(_Body):
    model_config = ConfigDict(extra="allow")

    maxRetries: int | None = Field(default=None, ge=0)
    retryInterval: float | None = Field(default=None, ge=0)


class StageSpec(_Body):
    """A stage of a new pipeline or a dynamically appended one; ``input`` is a string."""

    model_config = ConfigDict(extra="allow")

    stageName: str
    stageHandlerName: str
    input: str = ""
    options: StageOptions | None = None


class ResultRequest(_Body):
    pipelineId: int
    stageId: int
    executionId: str
    attempt: int
    isSuccess: bool                   # always sent: omission decodes as false
    result: str = ""
    errorCode: str | None = None
    retryable: bool | None = None
    logs: list[ResultLogItem] | None = None
    context: list[ResultContextItem] | None = None
    appendedStages: list[StageSpec] | None = None
    isWaitingForApproval: bool | None = None


# -- ack, events, shutdown -------------------------------------------------------------
class AckBody(_Body):
    """The delivery token is the only credential ack checks; revealed only in ``wire``."""

    token: SecretStr
    requeue: bool = False

    def wire(self) -> dict[str, Any]:
        return {"token": self.token.get_secret_value(), "requeue": self.requeue}


class EventItem(_Body):
    level: str = "INFO"
    eventType: str
    message: str
    metadata: dict[str, Any] | None = None


class EventsBody(_Body):
    workerId: str
    events: list[EventItem] = Field(min_length=1)


class ShutdownBody(_Body):
    workerId: str
    reason: str = ""


# -- pipelines (tests, demo, reconciliation) -----------------------------------------------
class CreatePipelineBody(_Body):
    idempotencyKey: str
    name: str
    stages: list[StageSpec] = Field(min_length=1)


class PipelineRef(_Answer):
    model_config = ConfigDict(extra="allow")

    id: StrictInt


class PipelineCreated(_Answer):
    pipeline: PipelineRef


class PipelineStatus(_Answer):
    model_config = ConfigDict(extra="allow")

    id: StrictInt
    status: str
    stages: list[dict[str, Any]] = Field(default_factory=list)
