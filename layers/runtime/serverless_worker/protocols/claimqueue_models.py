"""Typed wire models of the claim queue ("task" service), HTTP and WebSocket.

Unknown fields are ignored everywhere. Item ids are opaque strings; an integer id is
read as its decimal string because it addresses the same path segment either way.
Errors arrive as ``{"ok": false, "error": "..."}``, as an HTTP 4xx/5xx, or on the socket
as ``{"type": "error", "error": "..."}``; :func:`raise_for_answer` is the one place that
turns any of them into the project's error tree, for both transports.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool

from ..errors import (
    BadRequestError,
    ForbiddenError,
    InvalidApiKeyError,
    NotFoundError,
    ProtocolViolationError,
    RateLimitedError,
    ServerUnavailableError,
)
from ..logsafety import server_text

__all__ = [
    "TERMINAL_STATUSES",
    "ClaimAnswer",
    "ClaimRequest",
    "ItemLease",
    "ItemStatus",
    "ProgressAnswer",
    "ResultAnswer",
    "SocketAck",
    "SocketEmpty",
    "SocketError",
    "SocketItem",
    "raise_for_answer",
]

TERMINAL_STATUSES = frozenset({"finished", "failed"})

# A server's error text is echoed into exception messages; cut it so a huge body never
# becomes a huge log line.
_MAX_ERROR_TEXT = 300


def _id_string(value: Any) -> Any:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


ItemId = Annotated[str, BeforeValidator(_id_string)]


class _Wire(BaseModel):
    # Validators are built on first use: a function uses only some endpoints' models.
    model_config = ConfigDict(extra="ignore", defer_build=True)


class ClaimRequest(_Wire):
    """``POST /<queue>/claim``. Both fields are optional on the wire; ``None`` is omitted."""

    worker: str | None = None
    criteria: dict[str, Any] | None = None


class ItemLease(_Wire):
    """Who holds the item and until when (``until`` in epoch milliseconds)."""

    worker: str | None = None
    until: int | float

    @property
    def expires_at(self) -> float:
        """``until`` in epoch seconds, the unit the rest of the project uses."""
        return self.until / 1000.0


class ClaimAnswer(_Wire):
    """A claim answer: either an item with its lease, or ``{"ok": true, "empty": true}``."""

    ok: StrictBool = True
    empty: bool = False
    id: ItemId | None = None
    item: Any = None
    attempts: int | None = Field(default=None, ge=1)
    lease: ItemLease | None = None

    def require_item(self, endpoint: str) -> ClaimAnswer:
        """An answer that is neither empty nor a complete item breaks the protocol."""
        if not self.empty and (self.id is None or self.attempts is None):
            raise ProtocolViolationError("claim answer has neither empty:true nor id and attempts",
                                         endpoint=endpoint, status=200)
        return self


class ProgressAnswer(_Wire):
    """``accepted`` is false when the item is already terminal (the value was ignored)."""

    ok: StrictBool = True
    accepted: StrictBool
    status: str | None = None


class ResultAnswer(_Wire):
    """``accepted`` tells whether this result was the one that counted."""

    ok: StrictBool = True
    accepted: StrictBool
    status: str | None = None


class ItemStatus(BaseModel):
    """An item as read back for reconciliation (an assumed producer-side read path).

    Everything beyond ``status`` is optional and any extra field is kept.
    """

    model_config = ConfigDict(extra="allow")

    id: ItemId | None = None
    status: str
    attempts: int | None = None
    result: Any = None
    error: Any = None
    progress: Any = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


class SocketItem(_Wire):
    """``{"type": "item", id, item, attempts, lease}``: the socket's claim answer."""

    type: Literal["item"]
    id: ItemId
    item: Any = None
    attempts: int = Field(ge=1)
    lease: ItemLease | None = None


class SocketEmpty(_Wire):
    type: Literal["empty"]


class SocketAck(_Wire):
    """``progress-ack`` / ``result-ack`` for the item ``id``."""

    type: Literal["progress-ack", "result-ack"]
    id: ItemId | None = None
    accepted: StrictBool
    status: str | None = None


class SocketError(_Wire):
    type: Literal["error"]
    error: Any = None
    id: ItemId | None = None


def _error_text(body: Any, secrets: tuple[str, ...]) -> str:
    """The server's own error text, shortened, secrets cut out and controls escaped
    (``logsafety.server_text``)."""
    text = body.get("error") if isinstance(body, dict) else None
    if text is None:
        return ""
    return server_text(str(text), secrets, limit=_MAX_ERROR_TEXT)


def raise_for_answer(
    status: int | None,
    body: Any,
    *,
    endpoint: str,
    job_id: str = "",
    retry_after: float | None = None,
    secrets: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Return a successful answer as a dict, or raise the matching domain error.

    ``status`` is the HTTP status, or ``None`` for a socket message (which has none).
    429, 5xx and network failures are the retryable ones; a 2xx ``ok:false`` or a socket
    ``error`` is the server refusing this request, which a retry would not change.
    """
    said = _error_text(body, secrets)
    what = f"server said '{said}'" if said else "no error text"  # escaped already: no repr
    about = f" for item {job_id}" if job_id else ""
    if status is not None and not 200 <= status < 300:
        if status == 429:
            raise RateLimitedError(f"rate limited{about}", endpoint=endpoint, retry_after=retry_after)
        if status >= 500:
            raise ServerUnavailableError(f"server error{about}; {what}", endpoint=endpoint, status=status,
                                         ambiguous=True)
        if status == 401:
            raise InvalidApiKeyError(f"bearer token rejected; {what}", endpoint=endpoint, status=status)
        if status == 403:
            raise ForbiddenError(f"token not allowed on this queue; {what}", endpoint=endpoint, status=status)
        if status == 404:
            raise NotFoundError(f"unknown queue or item{about}; {what}", endpoint=endpoint, status=status)
        if 400 <= status < 500:
            raise BadRequestError(f"request rejected{about}; {what}", endpoint=endpoint, status=status)
        raise ProtocolViolationError(f"unexpected status{about}", endpoint=endpoint, status=status)
    if not isinstance(body, dict):
        raise ProtocolViolationError(f"answer{about} is not a JSON object", endpoint=endpoint, status=status)
    if body.get("ok") is False or body.get("type") == "error":
        raise BadRequestError(f"request refused{about}; {what}", endpoint=endpoint, status=status)
    return body
