"""HTTP plumbing shared by the protocol clients: one pooled session, timeouts on every
call, transport failures translated to domain errors in one place, and retries.

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
from urllib.parse import urlsplit

import requests
from pydantic import SecretStr
from requests.adapters import HTTPAdapter
from requests.structures import CaseInsensitiveDict
from requests.utils import get_environ_proxies, select_proxy

from ..errors import (
    ConfigurationError,
    ProtocolViolationError,
    RateLimitedError,
    ServerUnavailableError,
)
from ..loopback import is_loopback_url

__all__ = ["HttpResponse", "HttpTransport", "RetryPolicy", "display_url", "retry_call", "is_loopback_url",
           "header_credential"]

log = logging.getLogger("serverless_worker.http")
# Every transport, so a SnapStart restore can renew each one's connections (runtime/snapstart.py).
_TRANSPORTS: weakref.WeakSet[HttpTransport] = weakref.WeakSet()

DEFAULT_MAX_RESPONSE_BYTES = 8 * 1024 * 1024


# Printable ASCII without spaces: anything else could be echoed by `requests` (or
# `websockets`) in an "invalid header value" error, credential included.
_HEADER_SAFE = re.compile(r"[\x21-\x7e]+")


def header_credential(value: SecretStr | str, what: str) -> SecretStr:
    """The credential as a SecretStr, refused with ConfigurationError when it cannot be a header value."""
    secret = value if isinstance(value, SecretStr) else SecretStr(value)
    if not _HEADER_SAFE.fullmatch(secret.get_secret_value()):
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
        """Decode the body as JSON or raise ProtocolViolationError (never a bare ValueError)."""
        try:
            return json.loads(self.body)
        except ValueError as err:
            raise ProtocolViolationError("response body is not JSON", endpoint=self.endpoint,
                                         status=self.status) from err

    def json_or_none(self) -> Any:
        return self.json() if self.body.strip() else None

    @property
    def retry_after(self) -> float | None:
        value = self.headers.get("Retry-After")
        try:
            return max(0.0, float(value)) if value is not None else None
        except ValueError:
            return None


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff for reporting calls: exponential with jitter, bounded in attempts and time."""

    attempts: int = 6
    timeout: float = 30.0
    wait_initial: float = 0.2
    wait_max: float = 5.0
    wait_jitter: float = 0.5


def _retry_hook(exc: Exception) -> bool | float:
    """Retry 5xx, 429 and unknown network outcomes; honour Retry-After when given."""
    if isinstance(exc, RateLimitedError):
        return exc.retry_after if exc.retry_after is not None else True
    return isinstance(exc, ServerUnavailableError)


def retry_call[T](fn: Callable[[int], T], policy: RetryPolicy, *, where: str = "") -> T:
    """Call ``fn(attempt_number)`` until it succeeds or the policy gives up.

    The attempt number lets a caller read a 404 on a *retry* as "already applied".
    The first retry is logged once, saying what is retried, where and why, and the
    policy's bounds; stamina's own per-attempt warning is switched off (a refused
    connection used to print a line every backoff step for half a minute).
    """
    import stamina  # here, not at import: stamina and tenacity (asyncio) stay out of a cold start

    _quiet_stamina(stamina)
    number = 0
    for attempt in stamina.retry_context(
        on=_retry_hook,
        attempts=policy.attempts,
        timeout=policy.timeout,
        wait_initial=policy.wait_initial,
        wait_max=policy.wait_max,
        wait_jitter=policy.wait_jitter,
    ):
        with attempt:
            number += 1
            try:
                return fn(number)
            except Exception as err:
                if number == 1 and policy.attempts > 1 and _retry_hook(err) is not False:
                    log.warning("retrying %s%s (up to %d attempts within %g s): %s",
                                getattr(err, "endpoint", None) or "a call", f" at {where}" if where else "",
                                policy.attempts, policy.timeout, err)
                raise
    raise AssertionError("unreachable: stamina re-raises the last error")  # pragma: no cover


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
    """One pooled ``requests.Session`` per client with explicit connect/read timeouts.

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
        self._session = self._new_session()
        self._lock = threading.Lock()
        _TRANSPORTS.add(self)

    def _new_session(self) -> requests.Session:
        session = requests.Session()
        adapter = HTTPAdapter(pool_connections=4, pool_maxsize=self.pool_maxsize, max_retries=0)
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        session.headers["User-Agent"] = self.user_agent
        session.trust_env = False
        proxies, verify = _environment_settings(self.base_url)
        session.proxies.update(proxies)
        if verify is not None:
            session.verify = verify
        return session

    def renew(self) -> None:
        """Close every pooled connection and start a new session with the same settings.

        For a SnapStart restore: environments restored from one snapshot must not share
        the sockets (or TLS sessions) the snapshot's environment had open.
        """
        old, self._session = self._session, self._new_session()
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
        if json_body is not None:
            data = json.dumps(json_body, separators=(",", ":")).encode()
            headers = {**(headers or {}), "Content-Type": "application/json"}
        timeout = (self.connect_timeout, read_timeout if read_timeout is not None else self.read_timeout)
        started = time.monotonic()
        try:
            resp = self._session.request(method, self.base_url + path, data=data, headers=headers,
                                         params=params, timeout=timeout, stream=True,
                                         allow_redirects=False)  # credentials must not follow a redirect
            try:
                body = self._read_body(resp, timeout[1], endpoint)
                wire_bytes = resp.raw.tell()
            finally:
                resp.close()
        except ServerUnavailableError:
            raise
        except (requests.exceptions.ConnectTimeout, requests.exceptions.ProxyError) as err:
            raise ServerUnavailableError("could not connect", endpoint=endpoint, ambiguous=False) from err
        except requests.exceptions.ConnectionError as err:
            # A refused connection never reached the server; anything else may have.
            ambiguous = not _is_connect_refused(err)
            raise ServerUnavailableError(_describe(err), endpoint=endpoint, ambiguous=ambiguous) from err
        except (requests.exceptions.Timeout, requests.exceptions.RequestException, OSError) as err:
            raise ServerUnavailableError(_describe(err), endpoint=endpoint, ambiguous=True) from err
        except Exception as err:  # urllib3 ProtocolError/IncompleteRead surface here when streaming
            raise ServerUnavailableError(_describe(err), endpoint=endpoint, ambiguous=True) from err
        if len(body) > self.max_response_bytes:
            raise ProtocolViolationError(f"response larger than {self.max_response_bytes} bytes",
                                         endpoint=endpoint, status=resp.status_code)
        declared = resp.headers.get("Content-Length")
        # Content-Length counts the bytes on the wire, before any Content-Encoding is undone.
        if declared is not None and declared.isdigit() and int(declared) != wire_bytes:
            raise ServerUnavailableError("response truncated", endpoint=endpoint, ambiguous=True)
        log.debug("http %s %s -> %s in %.1f ms", method, endpoint, resp.status_code,
                  (time.monotonic() - started) * 1000)
        return HttpResponse(resp.status_code, CaseInsensitiveDict(resp.headers), body, endpoint)

    def _read_body(self, resp: requests.Response, read_timeout: float, endpoint: str) -> bytes:
        """At most ``max_response_bytes + 1`` bytes of the body, decoded, within ``read_timeout``.

        The socket timeout alone bounds only the gap between two bytes: a server that
        trickles a byte every few seconds would hold the call for ever. So the whole body
        must arrive within the read timeout of its headers (a long poll waits before the
        headers, so its wait is not counted here).
        """
        limit = self.max_response_bytes + 1
        deadline = time.monotonic() + read_timeout
        chunks: list[bytes] = []
        size = 0
        while size < limit:
            chunk = resp.raw.read1(min(65536, limit - size), decode_content=True)
            if chunk:
                chunks.append(chunk)
                size += len(chunk)
            elif resp.raw.closed:  # the whole body is in
                break
            if time.monotonic() > deadline:
                raise ServerUnavailableError(
                    f"response body not complete {read_timeout:g}s after its headers", endpoint=endpoint,
                    ambiguous=True)
        return b"".join(chunks)

    def raise_for_transient(self, response: HttpResponse) -> None:
        """Raise RateLimitedError for 429 and ServerUnavailableError for 5xx."""
        if response.status == 429:
            raise RateLimitedError("rate limited", endpoint=response.endpoint,
                                   retry_after=response.retry_after)
        if response.status >= 500:
            # 502/504 come from a proxy that may have forwarded the request; 500/503 may
            # also follow a partial effect: treat all as ambiguous.
            raise ServerUnavailableError("server error", endpoint=response.endpoint,
                                         status=response.status, ambiguous=True)

    def close(self) -> None:
        self._session.close()


def _environment_settings(base_url: str) -> tuple[dict[str, str], str | None]:
    """The proxy and CA bundle ``trust_env`` would apply to ``base_url``, resolved once.

    With ``trust_env`` on, requests re-reads the environment, stats ``~/.netrc`` and the
    CA bundle on every call (about a tenth of the local runtime's time); every call goes
    to one base URL, so the answer cannot change between calls. ``.netrc`` is left out on
    purpose: its password would replace the credential headers the clients send.
    """
    scheme = urlsplit(base_url).scheme
    proxy = select_proxy(base_url, get_environ_proxies(base_url))  # honours NO_PROXY
    proxies = {scheme: proxy} if proxy else {}
    verify = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or None
    return proxies, verify


def _is_connect_refused(err: BaseException) -> bool:
    seen: set[int] = set()
    cur: BaseException | None = err
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ConnectionRefusedError):
            return True
        if "NewConnectionError" in type(cur).__name__ or "Connection refused" in str(type(cur)):
            return True
        first_arg = cur.args[0] if cur.args and isinstance(cur.args[0], BaseException) else None
        cur = cur.__cause__ or cur.__context__ or first_arg
    return False


def _describe(err: BaseException) -> str:
    """A short cause without URLs (which could carry query credentials)."""
    return f"transport failure ({type(err).__name__})"
