"""HTTP plumbing shared by the protocol clients: one connection pool, timeouts on every
call, transport failures translated to domain errors in one place, and retries.

The pool is urllib3's (the transport under ``requests``, pinned in the layer) used
directly, one pool for the one host: on loopback a call through ``requests`` costs the
client about 470 µs of CPU, through this transport 210 µs (``python -m
benchmarks.http_calls``), and the local worker is bound by its own CPU. None of what
``requests`` adds is wanted here: cookies, redirects and ``.netrc`` credentials are all
things a worker must not follow, and the environment's proxy and CA bundle are read once,
below (with ``requests``' own rules for them).

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

import urllib3
from pydantic import SecretStr
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError, ProxyError
from urllib3.response import BaseHTTPResponse

from ..errors import (
    ConfigurationError,
    ProtocolViolationError,
    RateLimitedError,
    ServerUnavailableError,
)
from ..loopback import is_loopback_url

__all__ = ["HttpResponse", "HttpTransport", "RetryPolicy", "display_url", "retry_call", "is_loopback_url",
           "header_credential", "open_connections"]

log = logging.getLogger("serverless_worker.http")
# Every transport, so a SnapStart restore can renew each one's connections (runtime/snapstart.py).
_TRANSPORTS: weakref.WeakSet[HttpTransport] = weakref.WeakSet()

DEFAULT_MAX_RESPONSE_BYTES = 8 * 1024 * 1024


# Printable ASCII without spaces: anything else could be echoed by the HTTP library (or
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

    The first attempt runs before stamina is entered: most calls succeed at once, and
    stamina's retry context (a tenacity ``Retrying`` built per call) cost a tenth of a
    report's CPU. Once it failed retryably, stamina takes over with the policy's whole
    attempt count and what is left of its time, and is handed that failure as its own
    first attempt, so its backoff, jitter and ``Retry-After`` apply as before.
    """
    started = time.monotonic()
    try:
        return fn(1)
    except Exception as err:
        if policy.attempts <= 1 or _retry_hook(err) is False:
            raise
        first: Exception | None = err
        log.warning("retrying %s%s (up to %d attempts within %g s): %s",
                    getattr(err, "endpoint", None) or "a call", f" at {where}" if where else "",
                    policy.attempts, policy.timeout, err)
    import stamina  # here, not at import: stamina and tenacity (asyncio) stay out of a cold start

    _quiet_stamina(stamina)
    number = 1
    for attempt in stamina.retry_context(
        on=_retry_hook,
        attempts=policy.attempts,
        timeout=max(0.0, policy.timeout - (time.monotonic() - started)),
        wait_initial=policy.wait_initial,
        wait_max=policy.wait_max,
        wait_jitter=policy.wait_jitter,
    ):
        with attempt:
            if first is not None:  # the attempt made above, as stamina's first
                failed, first = first, None
                raise failed
            number += 1
            return fn(number)
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
    """One urllib3 connection pool per client with explicit connect/read timeouts.

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
        self._headers = {"User-Agent": self.user_agent, "Accept": "*/*", "Accept-Encoding": "gzip, deflate"}
        self._prefix = urlsplit(self.base_url).path  # what a direct pool is sent: the path only
        self._pool = self._new_pool()
        self._lock = threading.Lock()
        _TRANSPORTS.add(self)

    def _new_pool(self) -> urllib3.PoolManager | urllib3.HTTPConnectionPool:
        """The pool for the one host every call goes to (no per-call URL routing), or a
        proxy manager when a proxy applies."""
        options: dict[str, Any] = {"maxsize": self.pool_maxsize, "block": False, "retries": False}
        if self.base_url.startswith("https:"):
            options["cert_reqs"] = "CERT_REQUIRED"
            bundle = self.ca_bundle or _default_ca_bundle()
            options["ca_cert_dir" if os.path.isdir(bundle) else "ca_certs"] = bundle
        if self.proxy:
            return urllib3.ProxyManager(self.proxy, num_pools=4, **options)
        return urllib3.connection_from_url(self.base_url, **options)

    @property
    def pooled_connections(self) -> int:
        """Connections held open (SnapStart's restore must leave none of before)."""
        return open_connections(self._pool)

    def renew(self) -> None:
        """Close every pooled connection and start a new pool with the same settings.

        For a SnapStart restore: environments restored from one snapshot must not share
        the sockets (or TLS sessions) the snapshot's environment had open.
        """
        old, self._pool = self._pool, self._new_pool()
        _close_pool(old)

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
        sent = {**self._headers, **(headers or {})}
        if json_body is not None:
            data = json.dumps(json_body, separators=(",", ":")).encode()
            sent["Content-Type"] = "application/json"
        if isinstance(self._pool, urllib3.PoolManager):
            url = self.base_url + path
        else:  # a pool for the one host is sent the request target only
            url = self._prefix + path
            url = url if url.startswith("/") else "/" + url
        if params:
            url += "?" + urlencode([(k, v) for k, v in params.items() if v is not None], doseq=True)
        read = read_timeout if read_timeout is not None else self.read_timeout
        started = time.monotonic()
        try:
            # No retries and no redirects here: retries are retry_call's, and a credential
            # must never follow a redirect.
            resp = self._pool.urlopen(method, url, body=data, headers=sent, retries=False, redirect=False,
                                      timeout=urllib3.Timeout(connect=self.connect_timeout, read=read),
                                      preload_content=False, decode_content=True)
            complete = False
            try:
                body = self._read_body(resp, read, endpoint)
                wire_bytes = resp.tell()
                complete = True
            finally:
                if not complete:
                    resp.close()  # a half-read connection must not go back to the pool
                resp.release_conn()
        except ServerUnavailableError:
            raise
        except NewConnectionError as err:  # refused, or the name does not resolve: nothing was sent
            raise ServerUnavailableError(_describe(err), endpoint=endpoint, ambiguous=False) from err
        except (ConnectTimeoutError, ProxyError) as err:
            raise ServerUnavailableError("could not connect", endpoint=endpoint, ambiguous=False) from err
        except Exception as err:  # read timeouts, resets, TLS and protocol errors: it may have arrived
            raise ServerUnavailableError(_describe(err), endpoint=endpoint, ambiguous=True) from err
        if len(body) > self.max_response_bytes:
            raise ProtocolViolationError(f"response larger than {self.max_response_bytes} bytes",
                                         endpoint=endpoint, status=resp.status)
        declared = resp.headers.get("Content-Length")
        # Content-Length counts the bytes on the wire, before any Content-Encoding is undone.
        if declared is not None and declared.isdigit() and int(declared) != wire_bytes:
            raise ServerUnavailableError("response truncated", endpoint=endpoint, ambiguous=True)
        log.debug("http %s %s -> %s in %.1f ms", method, endpoint, resp.status,
                  (time.monotonic() - started) * 1000)
        return HttpResponse(resp.status, resp.headers.copy(), body, endpoint)

    def _read_body(self, resp: BaseHTTPResponse, read_timeout: float, endpoint: str) -> bytes:
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
            chunk = resp.read1(min(65536, limit - size), decode_content=True)
            if chunk:
                chunks.append(chunk)
                size += len(chunk)
            elif resp.closed:  # the whole body is in
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
        _close_pool(self._pool)


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


def open_connections(pool: urllib3.PoolManager | urllib3.HTTPConnectionPool) -> int:
    """How many connections ``pool`` holds open."""
    if isinstance(pool, urllib3.PoolManager):
        return sum(open_connections(host_pool) for host_pool in list(pool.pools.values()))
    queue = pool.pool
    if queue is None:  # closed
        return 0
    return sum(1 for connection in list(queue.queue) if connection is not None and connection.sock is not None)


def _close_pool(pool: urllib3.PoolManager | urllib3.HTTPConnectionPool) -> None:
    if isinstance(pool, urllib3.PoolManager):
        pool.clear()
    else:
        pool.close()


def _default_ca_bundle() -> str:
    """certifi's bundle, as ``requests`` uses (certifi is pinned in the layer)."""
    import certifi

    return str(certifi.where())


def _describe(err: BaseException) -> str:
    """A short cause without URLs (which could carry query credentials)."""
    return f"transport failure ({type(err).__name__})"
