"""The protocol-neutral outcome of one handler run, and the Pipelogiq result extras.

The runtime stores an :class:`Outcome` in the ledger before reporting it, so a retried
report sends exactly what was computed the first time. Each protocol module maps it to
its wire form as docs/outcomes.md says.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DETERMINISTIC_FAILURES", "OutcomeKind", "Outcome", "ResultLog", "ContextUpdate", "AppendedStage",
           "ResultExtras"]


class OutcomeKind(StrEnum):
    SUCCESS = "success"              # handler returned a value
    BUSINESS_ERROR = "business_error"  # handler raised BusinessError
    BAD_INPUT = "bad_input"          # payload failed the handler's input model / could not be decoded
    FAILURE = "failure"              # any other exception
    TIMEOUT = "timeout"              # ran past its time budget
    NOT_STARTED = "not_started"      # never started: shutdown, throttled fan-out, reaped
    LEASE_LOST = "lease_lost"        # renewal refused mid-run: report nothing; server recovery decides


# Failure codes a second run cannot change: the handler returned a value that cannot be
# reported (not JSON, or over a size cap). Each protocol reports them as not retryable
# (docs/outcomes.md), so the server does not hand the job out again only to fail alike.
DETERMINISTIC_FAILURES = frozenset({"RESULT_TOO_LARGE", "INVALID_RESULT"})


class ResultLog(BaseModel):
    """A Pipelogiq stage-result log line (``created`` is RFC 3339)."""

    message: str
    logLevel: str = "INFO"
    created: str


class ContextUpdate(BaseModel):
    """A Pipelogiq context item update, or a tombstone when ``isDeleted``."""

    key: str
    value: str | None = None
    valueType: str | None = None
    isSensitive: bool | None = None
    isDeleted: bool | None = None


class AppendedStage(BaseModel):
    """A Pipelogiq stage appended dynamically; ``input`` is a string as the server wants."""

    model_config = ConfigDict(extra="allow")
    stageName: str
    stageHandlerName: str
    input: str = ""
    options: dict[str, Any] | None = None


class ResultExtras(BaseModel):
    """Pipelogiq-only additions to a result; other protocols ignore them."""

    logs: list[ResultLog] = Field(default_factory=list)
    context: list[ContextUpdate] = Field(default_factory=list)
    appended_stages: list[AppendedStage] = Field(default_factory=list)
    wait_for_approval: bool = False


class Outcome(BaseModel):
    """What a handler run came to, in the form stored in the ledger."""

    kind: OutcomeKind
    value: Any = None                 # the return value (SUCCESS) or business variables
    error_code: str | None = None
    message: str | None = None
    extras: ResultExtras | None = None

    @property
    def is_success(self) -> bool:
        return self.kind is OutcomeKind.SUCCESS

    @property
    def retryable(self) -> bool:
        """Whether running the handler again could end otherwise: not for a business
        rejection, bad input, or a failure in :data:`DETERMINISTIC_FAILURES`."""
        if self.kind is OutcomeKind.FAILURE:
            return self.error_code not in DETERMINISTIC_FAILURES
        return self.kind is OutcomeKind.TIMEOUT
