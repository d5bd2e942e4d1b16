"""One error tree for the whole project, rooted at :class:`ServerlessWorkerError`.

Protocol clients translate HTTP statuses and transport failures into these in one
place (``protocols/_http.py``), always ``raise ... from err``. Messages name the
endpoint, status and identifiers a caller needs, never a credential.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = [
    "ERROR_PREFIX",
    "AuthenticationError",
    "BadInputError",
    "BadRequestError",
    "BusinessError",
    "ConfigurationError",
    "DispatchError",
    "ForbiddenError",
    "InvalidApiKeyError",
    "JobCancelledError",
    "LeaseRefusedError",
    "NotFoundAfterRetryError",
    "NotJsonSerializableError",
    "NotFoundError",
    "PayloadTooLargeError",
    "ProtocolError",
    "ProtocolViolationError",
    "RateLimitedError",
    "ResultNotAcceptedError",
    "ServerUnavailableError",
    "ServerlessWorkerError",
    "SessionExpiredError",
    "SessionRecoveryPausedError",
    "SessionUnavailableError",
    "UnknownHandlerError",
    "UnsupportedServerError",
]


# How every error line of the command starts, whichever subcommand says it (one voice).
ERROR_PREFIX = "serverless-worker: error: "


class ServerlessWorkerError(Exception):
    """Root of every error this project raises on purpose."""


class ConfigurationError(ServerlessWorkerError):
    """A setting is missing or invalid; the message names each bad setting."""


class UnsupportedServerError(ConfigurationError):
    """Every delivery the server handed out lacks what this worker needs to address it (an
    older or other protocol version); the message names what the server lacks. Its
    deliveries are never acknowledged away: they are handed back or left to the server's
    visibility timeout (docs/protocols.md)."""


class BadInputError(ServerlessWorkerError, ValueError):
    """The payload cannot be given to the handler; the message names fields, never values."""


class NotJsonSerializableError(ServerlessWorkerError, TypeError):
    """A value cannot become JSON; the message names its type, never its content."""


class PayloadTooLargeError(ServerlessWorkerError, ValueError):
    """A request or result exceeds the protocol's documented size cap; nothing was sent."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        self.what, self.size, self.limit = what, size, limit
        super().__init__(f"{what} is {size} bytes, over the protocol's cap of {limit} bytes")


class ProtocolError(ServerlessWorkerError):
    """The job server answered (or failed to answer) in a way the caller must handle."""

    def __init__(self, message: str, *, endpoint: str = "", status: int | None = None) -> None:
        self.endpoint = endpoint
        self.status = status
        prefix = f"{endpoint}: " if endpoint else ""
        suffix = f" (HTTP {status})" if status is not None else ""
        super().__init__(f"{prefix}{message}{suffix}")


class BadRequestError(ProtocolError):
    """400: the server rejected the request body or parameters; fix the caller, do not retry."""


class AuthenticationError(ProtocolError):
    """401: a credential was rejected. See the two subclasses."""


class InvalidApiKeyError(AuthenticationError):
    """The application API key (or bearer token) is wrong or revoked: fix configuration."""


class SessionExpiredError(AuthenticationError):
    """The worker session token expired or was replaced by a newer bootstrap: re-bootstrap."""


class SessionRecoveryPausedError(SessionExpiredError):
    """The server rejected a session it issued moments ago, and the next bootstrap is not
    due yet: re-bootstrapping at once would only be rejected again (a refusal loop)."""


class SessionUnavailableError(ServerlessWorkerError):
    """No usable worker session could be obtained (the lock holder never produced one)."""


class ForbiddenError(ProtocolError):
    """403: the credential is valid but not for this queue or application."""


class RateLimitedError(ProtocolError):
    """429: back off (``retry_after`` seconds when the server said so: finite and not
    negative, else ``None``; see ``waits.parse_retry_after``)."""

    def __init__(self, message: str, *, endpoint: str = "", status: int | None = 429,
                 retry_after: float | None = None) -> None:
        usable = retry_after is not None and math.isfinite(retry_after) and retry_after >= 0
        self.retry_after = retry_after if usable else None
        # Set by the retry loop when the Retry-After did not fit the time left (which limit,
        # how long), so the give-up's one log line says why (protocols/_http.py).
        self.not_waited: str | None = None
        super().__init__(message, endpoint=endpoint, status=status)


class ServerUnavailableError(ProtocolError):
    """5xx, connection failure or read failure.

    ``ambiguous`` is true when the request may have reached the server and taken
    effect (read timeout, dropped connection after sending, 502/504): the caller must
    not assume it did nothing.
    """

    def __init__(self, message: str, *, endpoint: str = "", status: int | None = None,
                 ambiguous: bool = True) -> None:
        self.ambiguous = ambiguous
        super().__init__(message, endpoint=endpoint, status=status)


class NotFoundError(ProtocolError):
    """404: the server does not know the job, token or action."""


class NotFoundAfterRetryError(NotFoundError):
    """404 on a retried complete/fail/ack: the first attempt most likely went through."""


class LeaseRefusedError(ProtocolError):
    """The server refused a lease with one of its documented reasons.

    ``action`` says what the runtime must do: ``discard`` (acknowledge and drop the
    delivery), ``leave`` (do nothing; server-side recovery redispatches) or ``stop``
    (configuration is wrong: stop consuming).
    """

    def __init__(self, reason: str, *, action: str, endpoint: str = "", job_id: str = "") -> None:
        self.reason, self.action, self.job_id = reason, action, job_id
        super().__init__(f"lease refused for job {job_id}: {reason}", endpoint=endpoint, status=200)


class ResultNotAcceptedError(ProtocolError):
    """The server took the result but did not use it (claim queue ``accepted:false``)."""

    def __init__(self, item_status: str, *, endpoint: str = "", job_id: str = "") -> None:
        self.item_status, self.job_id = item_status, job_id
        super().__init__(f"result for {job_id} not accepted; item is {item_status}",
                         endpoint=endpoint, status=200)


class ProtocolViolationError(ProtocolError):
    """The server answered with a status or body the protocol documents do not allow."""


class DispatchError(ServerlessWorkerError):
    """Starting an executor or an execution failed (throttled, missing permission, ...).

    The state machine's Retry blocks name it (``worker.asl.json``): keep the name."""


class BusinessError(ServerlessWorkerError):
    """Raised by a handler for a business rejection: an outcome, not a technical failure.

    >>> raise BusinessError("CARD_DECLINED", "insufficient funds", {"declineReason": "funds"})
    """

    def __init__(self, code: str, message: str = "", variables: Mapping[str, Any] | None = None) -> None:
        self.code, self.message, self.variables = code, message, dict(variables or {})
        super().__init__(f"{code}: {message}" if message else code)


class UnknownHandlerError(ServerlessWorkerError, LookupError):
    """No handler is registered under ``name``; the message lists the known names."""

    def __init__(self, name: str, known: list[str] | tuple[str, ...] = ()) -> None:
        self.name, self.known = name, tuple(known)
        listed = ", ".join(repr(k) for k in self.known) or "none registered"
        super().__init__(f"no handler named {name!r} (known handlers: {listed})")


class JobCancelledError(ServerlessWorkerError):
    """Raised inside a handler by ``job.raise_if_cancelled()`` once the run is cancelled.

    ``reason`` is ``lease_lost``, ``timeout`` or ``shutdown``. Let it propagate: the
    runner maps it to the cancellation's outcome.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"job cancelled: {reason}")
