"""First contact with the job server: a run that can never work ends at once, in one line.

Why: pointed at a URL where nothing listens, ``serverless-worker local`` used to retry
each tick's bootstrap or pull for half a minute, tick after tick, then drain (a shutdown
call against the server it never reached) and print a summary of zeros. A worker that
has never reached its server has nothing to wait for: the URL, the host or the
credential is wrong, and only the operator can fix it.

Two checks, before anything is taken from the server:

- :func:`probe`: one request without credentials to the base URL, before the first
  tick. Any HTTP answer, whatever its status, means something listens there; a refused
  connection, an unknown host, no answer within the connect timeout or a failed TLS
  handshake ends the run with :class:`FirstContactError`.
- :func:`refusal`: the first tick's bootstrap or pull meets a 401, 403, 400 or 404
  before any pull went through: the server is there but refuses this configuration;
  or every delivery it handed out lacks what this worker needs to address it
  (UnsupportedServerError): it speaks another protocol version, and the line says
  what it lacks.

Once the server has been reached, later transient errors keep the runtime's retries.
Messages name the URL (without user info or query, see ``display_url``) and the setting
to fix, never a credential.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from ..errors import (
    AuthenticationError,
    BadRequestError,
    ConfigurationError,
    ForbiddenError,
    NotFoundError,
    ServerUnavailableError,
    UnsupportedServerError,
)
from ..protocols.transport import HttpTransport, TransportError, display_url
from ..settings import Settings

__all__ = ["FirstContactError", "HeldLogs", "describe_unreachable", "probe", "refusal", "unsupported_detail"]

_KEY_SETTINGS = "--api-key-env NAME, SW_API_KEY, SW_API_KEY_SECRET_ARN or SW_API_KEY_PARAMETER"


class FirstContactError(ConfigurationError):
    """The job server was never reached, or refused this configuration on first contact."""


def probe(settings: Settings) -> None:
    """Raise :class:`FirstContactError` unless an HTTP server answers at ``settings.base_url``."""
    transport = HttpTransport(settings.base_url, connect_timeout=settings.connect_timeout,
                              read_timeout=settings.read_timeout,
                              allow_insecure_http=settings.allow_insecure_http, pool_maxsize=1)
    try:
        transport.request("GET", "", endpoint="probe")
    except ServerUnavailableError as err:
        raise FirstContactError(f"cannot reach the job server at {display_url(settings.base_url)} "
                                f"(--url, SW_BASE_URL): {describe_unreachable(err, settings)}") from None
    finally:
        transport.close()


def describe_unreachable(err: BaseException, settings: Settings) -> str:
    """The cause of a failed connection in words: refused, unknown host, no answer, TLS."""
    failure = next((e for e in _causes(err) if isinstance(e, TransportError)), None)
    if failure is None:
        return str(err)
    if failure.kind == "connect_timeout":
        return f"no answer within the connect timeout of {settings.connect_timeout:g} s (--connect-timeout)"
    if failure.kind == "unresolved":
        return "the host name does not resolve"
    if failure.kind == "refused":
        return "connection refused (nothing listens on that port)"
    if failure.kind == "unreachable":
        return "no route to the host (the network or the host is unreachable)"
    if failure.kind == "tls_certificate":
        return f"its TLS certificate was refused ({failure.detail or 'verification failed'})"
    if failure.kind == "tls":
        return f"the TLS handshake failed ({failure.detail})" if failure.detail else "the TLS handshake failed"
    if failure.kind == "read_timeout":
        return f"connected, but no answer within the read timeout of {settings.read_timeout:g} s (--read-timeout)"
    return f"transport failure ({failure})"


def refusal(settings: Settings, cause: type[BaseException], detail: str,
            handlers: Sequence[str]) -> FirstContactError:
    """The one-line error for a server that refused the first bootstrap or pull.

    ``cause`` is the error's class (the tick report names it), ``detail`` the report's
    error text, which names the endpoint and the HTTP status, never a credential.
    """
    url = display_url(settings.base_url)
    if issubclass(cause, UnsupportedServerError):
        return FirstContactError(f"the job server at {url} cannot be worked: {unsupported_detail(detail)}")
    if issubclass(cause, AuthenticationError):
        why = f"refused the credential; check the key ({_KEY_SETTINGS})"
    elif issubclass(cause, ForbiddenError):
        why = (f"refused access for handlers {', '.join(handlers)}; the credential is not allowed for "
               "them (--handlers, --queue)")
    elif issubclass(cause, BadRequestError | NotFoundError):
        # The likeliest cause of a 404 on the very first call is a server of another protocol.
        why = (f"rejected the requests for handlers {', '.join(handlers)}; is it a {settings.protocol} server? "
               "check --protocol (pipelogiq, priostack or claimqueue), --handlers, --queue, --criteria and "
               "the URL's path (--url)")
    else:
        why = "refused the configuration"
    return FirstContactError(f"the job server at {url} {why}: {_call_detail(detail)}")


# The scheduler's step names, which it puts before a call's own error text (``pull: pull: ...``).
_STEP_PREFIXES = ("pull:", "session:")


def _call_detail(detail: str) -> str:
    """A tick's error text without the scheduler's step (``pull:``, ``session:``): the
    call's own text names the endpoint (``activate: API key rejected (HTTP 401)``)."""
    for prefix in _STEP_PREFIXES:
        if detail.startswith(prefix):
            return detail.removeprefix(prefix).strip()
    return detail


def unsupported_detail(detail: str) -> str:
    """A tick's UnsupportedServerError text without the scheduler's ``pull:`` prefix."""
    return _call_detail(detail)


def _causes(err: BaseException) -> list[BaseException]:
    """``err`` and what caused it, through ``__cause__`` and ``__context__``."""
    seen: list[BaseException] = []
    current: BaseException | None = err
    while current is not None and all(current is not e for e in seen):
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


class HeldLogs(logging.Filter):
    """The runtime's log lines while the first contact is undecided, held back.

    Shown (in order) once the server is reached, dropped when it refused the first
    contact: the one-line error says it all, and the scheduler's own "pull rejected,
    ending tick" line before it would make two lines saying one thing. Attached as a
    filter to the console's handlers, so nothing else about logging changes.
    """

    def __init__(self) -> None:
        super().__init__("first-contact")
        self._lock = threading.Lock()
        self._holding = True
        self._held: list[logging.LogRecord] = []
        self._handlers: list[logging.Handler] = []

    def attach(self, handlers: Sequence[logging.Handler]) -> HeldLogs:
        self._handlers = list(handlers)
        for handler in self._handlers:
            handler.addFilter(self)
        return self

    def filter(self, record: logging.LogRecord) -> bool:
        with self._lock:
            if not self._holding:
                return True
            if not self._held or self._held[-1] is not record:  # one copy, whatever the handlers
                self._held.append(record)
            return False

    def release(self) -> None:
        """Stop holding and emit what was held, each record to the handlers whose level it meets."""
        with self._lock:
            self._holding, held, self._held = False, self._held, []
        for record in held:
            for handler in self._handlers:
                if record.levelno >= handler.level:
                    handler.handle(record)

    def drop(self) -> None:
        """Stop holding and forget what was held."""
        with self._lock:
            self._holding, self._held = False, []

    def detach(self) -> None:
        self.release()
        for handler in self._handlers:
            handler.removeFilter(self)
