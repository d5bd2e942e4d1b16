"""HTTP plumbing shared by the protocol clients: pooled connections, timeouts on every
call, transport failures translated to domain errors in one place, and retries.

The exchange itself is ``requests``' (``_session.py``): one session per transport, its
pool sized to the client's concurrency, with no retries of its own, no redirects, no
cookies and nothing read from the environment but what :func:`_environment_settings`
reads once (the proxy and CA bundle, by ``requests``' rules for them).

Retries use `stamina` (a small, well-kept layer over tenacity: exponential backoff with
jitter, an explicit predicate, and ``stamina.set_testing`` to turn backoff off in
tests). Only reporting calls go through :func:`retry_call`; pulls never do, because a
pull whose answer was lost has already handed a delivery to nobody, and a blind second
pull would take more work than we can account for.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit

import requests
from pydantic import SecretStr

from ..errors import (
    ConfigurationError,
    ProtocolViolationError,
    RateLimitedError,
    ServerUnavailableError,
)
from ..loopback import is_loopback_url
from ..waits import limit, parse_retry_after, pause, time_left, waits_abandoned
from ._proxy import checked_proxy
from ._session import ResponseTooLargeError, TransportError, exchange, new_session, open_connections

__all__ = ["HttpResponse", "HttpTransport", "RetryPolicy", "display_url", "retry_call", "is_loopback_url",
           "header_credential", "header_safe", "open_connections", "TransportError"]

log = logging.getLogger("serverless_worker.http")
# Every transport, so a SnapStart restore can renew each one's connections (runtime/snapstart.py).
_TRANSPORTS: weakref.WeakSet[HttpTransport] = weakref.WeakSet()

DEFAULT_MAX_RESPONSE_BYTES = 8 * 1024 * 1024


# Printable ASCII without spaces: anything else could be echoed by the HTTP library (or
# `websockets`) in an "invalid header value" error, credential included.
_HEADER_SAFE = re.compile(r"[\x21-\x7e]+")


def header_safe(value: str) -> bool:
    """Whether ``value`` may be sent as a header value as it is (no CR, LF, NUL or space:
    nothing that could end the header or start another)."""
    return _HEADER_SAFE.fullmatch(value) is not None


def header_credential(value: SecretStr | str, what: str) -> SecretStr:
    """The credential as a SecretStr, refused with ConfigurationError when it cannot be a header value."""
    secret = value if isinstance(value, SecretStr) else SecretStr(value)
    if not header_safe(secret.get_secret_value()):
        raise ConfigurationError(f"{what} is empty or contains whitespace/control characters")
    return secret


@dataclass(frozen=True)
class HttpResponse:
    """A fully read response (bounded in size), detached from the connection."""

    status: int
    headers: Mapping[str, str]
    body: bytes
    endpoint: str

    def json(self) -> Any:
        """Decode the body as JSON or raise ProtocolViolationError (never a bare ValueError,
        nor the RecursionError of an answer nested deeper than the decoder goes)."""
        try:
            return json.loads(self.body)
        except ValueError as err:
            raise ProtocolViolationError("response body is not JSON", endpoint=self.endpoint,
                                         status=self.status) from err
        except RecursionError:
            raise ProtocolViolationError("response body nests too deep to decode", endpoint=self.endpoint,
                                         status=self.status) from None

    def json_or_none(self) -> Any:
        return self.json() if self.body.strip() else None

    @property
    def retry_after(self) -> float | None:
        """The ``Retry-After`` header in seconds (``waits.parse_retry_after``), ``None`` when
        absent or unusable."""
        return parse_retry_after(self.headers.get("Retry-After"))


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff for reporting calls: exponential with jitter, bounded in attempts and time."""

    attempts: int = 6
    timeout: float = 30.0
    wait_initial: float = 0.2
    wait_max: float = 5.0
    wait_jitter: float = 0.5


def _retry_hook(exc: Exception) -> bool | float:
    """Retry 5xx, 429 and unknown network outcomes; a 429's ``Retry-After`` (seconds) when given."""
    if isinstance(exc, RateLimitedError):
        return exc.retry_after if exc.retry_after is not None else True
    return isinstance(exc, ServerUnavailableError)


def retry_call[T](fn: Callable[[int], T], policy: RetryPolicy, *, where: str = "",
                  clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], object] | None = None) -> T:
    """Call ``fn(attempt_number)`` until it succeeds or the policy gives up.

    The attempt number lets a caller read a 404 on a *retry* as "already applied".
    The first retry is logged once, saying what is retried, where and why, and the
    policy's bounds; stamina's own per-attempt warning is switched off (a refused
    connection used to print a line every backoff step for half a minute).

    The first attempt runs before stamina is entered: most calls succeed at once, and
    stamina's retry context (a tenacity ``Retrying`` built per call) cost a tenth of a
    report's CPU. Once it failed retryably, stamina takes over with the policy's whole
    attempt count and what is left of its time, and is handed that failure as its own
    first attempt, so its backoff and jitter apply as before.

    A server's ``Retry-After`` is honoured only when it fits the time left: what is left of
    the policy's timeout and of every ``waits`` limit this thread is in (the invocation's
    deadline, a job's lease, the process's stop). One that does not fit is not waited at
    all: the call gives up at once, and the error says why in ``not_waited`` (the caller
    logs it once, with the job, and leaves the stored outcome to the reaper or the next
    run). It is waited here, not by stamina, so that the process's stop ends it.
    ``clock`` and ``sleep`` (default: ``waits.pause``) are for tests.
    """
    started = clock()
    try:
        return fn(1)
    except Exception as err:
        if policy.attempts <= 1 or _retry_hook(err) is False or _beyond_time_left(err, policy, started, clock):
            raise
        last: Exception = err
    left = _left(policy, started, clock)
    if left <= 0:
        raise last
    log.warning("retrying %s%s (up to %d attempts within %g s): %s",
                getattr(last, "endpoint", None) or "a call", f" at {where}" if where else "",
                policy.attempts, policy.timeout, last)
    import stamina  # here, not at import: stamina and tenacity (asyncio) stay out of a cold start

    _quiet_stamina(stamina)

    def backoff(exc: BaseException) -> bool | float:
        if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: never retried
            return False
        asked = _retry_hook(exc)
        left = _left(policy, started, clock)
        if asked is False or left <= 0 or _beyond_time_left(exc, policy, started, clock):
            return False
        if asked is True or number >= policy.attempts:
            # stamina's own backoff (short: policy.wait_max), or the last attempt failed: stamina
            # stops without waiting.
            return True
        if sleep is not None:
            sleep(asked)
        elif not stamina.is_testing() and not pause(asked):
            return False  # the time ran out or the process's stop came meanwhile
        return 0.0  # waited already: stamina adds nothing

    number, replayed = 1, False
    for attempt in stamina.retry_context(
        on=backoff,
        attempts=policy.attempts,
        timeout=left,
        wait_initial=policy.wait_initial,
        wait_max=policy.wait_max,
        wait_jitter=policy.wait_jitter,
    ):
        with attempt:
            # stamina's first attempt is the one made above; none is made once waits are abandoned.
            if not replayed or waits_abandoned():
                replayed = True
                raise last
            number += 1
            try:
                return fn(number)
            except Exception as err:
                last = err
                raise
    raise AssertionError("unreachable: stamina re-raises the last error")  # pragma: no cover


def _left(policy: RetryPolicy, started: float, clock: Callable[[], float]) -> float:
    """What is left of the policy's timeout and of this thread's time limits."""
    return min(policy.timeout - (clock() - started), time_left())


def _beyond_time_left(err: Exception, policy: RetryPolicy, started: float, clock: Callable[[], float]) -> bool:
    """A 429 whose Retry-After does not fit the time left: noted on ``err.not_waited`` (which
    limit, how long), so the give-up says why in one line, and not waited."""
    if not isinstance(err, RateLimitedError) or err.retry_after is None:
        return False
    binding = limit()
    budget = policy.timeout - (clock() - started)
    seconds, what = (budget, f"the retry budget ({policy.timeout:g} s)") if budget <= binding.seconds \
        else (binding.seconds, binding.what)
    if err.retry_after <= seconds:
        return False
    err.not_waited = (f"the server asked to wait {err.retry_after:.10g} s (Retry-After); {max(0.0, seconds):.1f} s "
                      f"were left before {what}, so it was not waited")
    return True


_STAMINA_QUIETED = False


def _quiet_stamina(stamina: Any) -> None:
    """Remove stamina's default hook, which logs every scheduled retry (retry_call logs once)."""
    global _STAMINA_QUIETED
    if not _STAMINA_QUIETED:
        stamina.instrumentation.set_on_retry_hooks([])
        _STAMINA_QUIETED = True


def display_url(url: str) -> str:
    """``url`` as it may be shown in logs and errors: scheme, host, port and path only (no
    user info or query, which could carry a credential)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{host}{port}{parts.path}".rstrip("/") if parts.scheme else "(not a URL)"


def renew_transports() -> int:
    """:meth:`HttpTransport.renew` on every transport that exists; returns how many."""
    transports = list(_TRANSPORTS)
    for transport in transports:
        transport.renew()
    return len(transports)


@dataclass(eq=False)  # compared by identity: transports live in a WeakSet
class HttpTransport:
    """Pooled connections to one base URL, with explicit connect/read timeouts.

    Refuses plain ``http://`` to anything but loopback unless ``allow_insecure_http``.
    Counts calls per endpoint label so the runtime can report HTTP calls per job.
    What the environment says (proxy, CA bundle) is read once here, not on every call
    (see :func:`_environment_settings`).
    """

    base_url: str
    connect_timeout: float = 3.05
    read_timeout: float = 10.0
    pool_maxsize: int = 64
    allow_insecure_http: bool = False
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    user_agent: str = "serverless-worker"
    calls: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigurationError(
                f"base URL must be http(s)://host[:port][/path], got {parts.scheme or 'no'} scheme")
        if parts.scheme == "http" and not self.allow_insecure_http and not is_loopback_url(self.base_url):
            raise ConfigurationError(
                f"refusing plain http:// to non-loopback host {parts.hostname}; use https:// "
                "or set allow_insecure_http explicitly")
        self.base_url = self.base_url.rstrip("/")
        self.proxy, self.ca_bundle = _environment_settings(self.base_url)
        self.proxy = checked_proxy(self.base_url, self.proxy, allow_insecure_http=self.allow_insecure_http)
        self._pool = self._new_session()
        self._lock = threading.Lock()
        _TRANSPORTS.add(self)

    def _new_session(self) -> requests.Session:
        https = self.base_url.startswith("https:")
        return new_session(pool_maxsize=self.pool_maxsize, proxy=self.proxy, user_agent=self.user_agent,
                           ca_bundle=(self.ca_bundle or None) if https else None)

    @property
    def pooled_connections(self) -> int:
        """Connections held open (SnapStart's restore must leave none of before)."""
        return open_connections(self._pool)

    def renew(self) -> None:
        """Close every pooled connection and start a new session with the same settings.

        For a SnapStart restore: environments restored from one snapshot must not share
        the sockets (or TLS sessions) the snapshot's environment had open.
        """
        old, self._pool = self._pool, self._new_session()
        old.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        endpoint: str,
        json_body: Any = None,
        data: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, Any] | None = None,
        read_timeout: float | None = None,
    ) -> HttpResponse:
        """Send one request; translate transport failures; return any HTTP status as-is.

        ``endpoint`` is a label without identifiers or credentials, used in errors,
        logs and call counts.
        """
        with self._lock:
            self.calls[endpoint] += 1
        sent = dict(headers or {})
        if json_body is not None:
            data = json.dumps(json_body, separators=(",", ":")).encode()
            sent["Content-Type"] = "application/json"
        url = self.base_url + path
        if params:
            url += "?" + urlencode([(k, v) for k, v in params.items() if v is not None], doseq=True)
        read = read_timeout if read_timeout is not None else self.read_timeout
        started = time.monotonic()
        try:
            # No retries and no redirects here: retries are retry_call's, and a credential
            # must never follow a redirect.
            status, received, body = exchange(self._pool, method, url, sent, data,
                                              connect_timeout=self.connect_timeout, read_timeout=read,
                                              limit=self.max_response_bytes)
        except ResponseTooLargeError:
            raise ProtocolViolationError(f"response larger than {self.max_response_bytes} bytes",
                                         endpoint=endpoint) from None
        except TransportError as err:
            raise ServerUnavailableError(f"transport failure ({err.words})", endpoint=endpoint,
                                         ambiguous=err.sent) from err
        log.debug("http %s %s -> %s in %.1f ms", method, endpoint, status, (time.monotonic() - started) * 1000)
        return HttpResponse(status, received, body, endpoint)

    def close(self) -> None:
        self._pool.close()


def _environment_settings(base_url: str) -> tuple[str | None, str | None]:
    """The proxy URL and CA bundle for ``base_url``, read from the environment once.

    Proxies as ``requests`` reads them (``HTTP(S)_PROXY``, ``ALL_PROXY``, ``NO_PROXY``
    with its CIDR ranges), through its own functions, imported only when a proxy variable
    is set (``NO_PROXY`` alone names no proxy); ``REQUESTS_CA_BUNDLE`` or ``CURL_CA_BUNDLE``
    for the CA bundle. Every call goes to one base URL, so the answer cannot change
    between calls. ``.netrc`` is never read: its password would replace the credential
    headers the clients send.
    """
    proxy = None
    if any(name.lower().endswith("_proxy") and name.lower() != "no_proxy" for name in os.environ):
        from requests.utils import get_environ_proxies, select_proxy

        proxy = select_proxy(base_url, get_environ_proxies(base_url))  # honours NO_PROXY
    verify = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or None
    return proxy, verify
