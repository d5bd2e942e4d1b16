"""One HTTP exchange over a ``requests`` session, and what a failed one means.

A session is built once per transport (:func:`new_session`): one ``HTTPAdapter`` whose
pool holds as many connections as the client runs calls at once, and which never
retries (``max_retries=0``: urllib3 makes one attempt, so a request whose reused
connection closed without an answer is not sent again, however the server may have
acted on it). The environment is not trusted (``trust_env=False``): the proxy and CA
bundle are the transport's, read once by its own rules, and ``.netrc`` is never read.
No cookie is kept and no redirect followed.

:func:`exchange` sends one request and reads its answer in chunks as they come,
decompressed as they come, so that neither a large body nor a small compressed one
that expands past the limit is held whole, and the whole answer must be complete
within the read timeout however slowly it trickles. ``http.client`` reads the status line
and headers with a timeout per socket read only, so a server trickling its headers a byte
at a time could hold a call for ever: :class:`_Watchdog` shuts a connection whose headers
are not in by the read timeout.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from http.client import RemoteDisconnected
from http.cookiejar import DefaultCookiePolicy
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from requests.cookies import RequestsCookieJar
from urllib3 import BaseHTTPResponse, HTTPConnectionPool, HTTPResponse, HTTPSConnectionPool
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import ConnectionPool
from urllib3.exceptions import (
    DecodeError,
    MaxRetryError,
    NameResolutionError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
)

from .. import logsafety

__all__ = ["ResponseTooLargeError", "TransportError", "exchange", "new_session", "open_connections"]

_CHUNK = 64 * 1024


class TransportError(Exception):
    """What went wrong below HTTP, in words: only ever the ``__cause__`` of the
    ``ServerUnavailableError`` the transport raises (so outside the project's error tree,
    which callers catch), where ``local.first_contact`` reads it.

    ``kind`` is one of ``unresolved``, ``refused``, ``unreachable``, ``connect_timeout``,
    ``proxy``, ``tls_certificate``, ``tls``, ``read_timeout``, ``body_timeout``,
    ``dropped`` or ``other``; ``sent`` is whether the request may have reached the server;
    ``detail`` is the library's message with any credential cut out.
    """

    def __init__(self, kind: str, words: str, detail: str, *, sent: bool) -> None:
        super().__init__(f"{words} ({detail})" if detail else words)
        self.kind = kind
        self.words = words
        self.detail = detail
        self.sent = sent


class ResponseTooLargeError(Exception):
    """The body, decompressed, passed the transport's size limit; the exchange was cut there."""


class _Watchdog:
    """Shuts the socket of a connection whose answer's headers are not in by their
    deadline, so that the thread reading them stops; the thread is then told so
    (:meth:`fired`) and reports a read timeout. One thread per process, asleep while no
    call waits for headers; a call costs it a dictionary entry under a lock."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[HTTPConnection, tuple[float, int]] = {}
        self._fired: set[int] = set()
        self._next = float("inf")
        self._pid = 0  # the process whose thread runs (a forked child starts its own)

    def watch(self, conn: HTTPConnection, seconds: float) -> None:
        due = time.monotonic() + seconds
        with self._cond:
            self._due[conn] = (due, threading.get_ident())
            if self._pid != os.getpid():
                self._pid = os.getpid()
                threading.Thread(target=self._run, name="http-header-deadline", daemon=True).start()
            if due < self._next:
                self._next = due
                self._cond.notify()

    def unwatch(self, conn: HTTPConnection) -> None:
        with self._cond:
            self._due.pop(conn, None)

    def fired(self) -> bool:
        """Whether this thread's last call was cut by the watchdog (and forget it)."""
        ident = threading.get_ident()
        with self._cond:
            if ident in self._fired:
                self._fired.discard(ident)
                return True
        return False

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for conn, (due, ident) in list(self._due.items()):
                    if due <= now:
                        del self._due[conn]
                        self._fired.add(ident)
                        if conn.sock is not None:
                            with contextlib.suppress(OSError):
                                conn.sock.shutdown(socket.SHUT_RDWR)
                self._next = min((due for due, _ in self._due.values()), default=float("inf"))
                self._cond.wait(None if self._next == float("inf") else max(self._next - now, 0.01))


_WATCHDOG = _Watchdog()


class _HeaderDeadline(HTTPConnection):
    """A connection whose answer's status line and headers must come within its read timeout."""

    def getresponse(self) -> HTTPResponse:  # type: ignore[override]
        seconds = self.timeout if isinstance(self.timeout, int | float) else None
        if seconds is None:
            return super().getresponse()
        _WATCHDOG.watch(self, seconds)
        try:
            return super().getresponse()
        finally:
            _WATCHDOG.unwatch(self)


class _Connection(_HeaderDeadline, HTTPConnection):
    pass


class _TlsConnection(_HeaderDeadline, HTTPSConnection):
    pass


class _Pool(HTTPConnectionPool):
    ConnectionCls = _Connection


class _TlsPool(HTTPSConnectionPool):
    ConnectionCls = _TlsConnection


_POOLS = {"http": _Pool, "https": _TlsPool}


class _Adapter(HTTPAdapter):
    """``HTTPAdapter`` whose pools make :class:`_HeaderDeadline` connections, proxied or not."""

    _origin_pool: tuple[str, bool | str | None, ConnectionPool] | None = None

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        self._origin_pool = None
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _POOLS

    def get_connection_with_tls_context(self, request: requests.PreparedRequest, verify: bool | str | None,
                                        proxies: Mapping[str, str] | None = None,
                                        cert: Any = None) -> ConnectionPool:
        """The pool for the request's origin, found once: a transport speaks to one base URL,
        and finding it again (URL parsing and a pool key built per call) cost a fifth of what
        ``requests`` adds to a call. The session's proxies and TLS settings never change."""
        url = request.url or ""
        origin = url[:url.find("/", url.find("//") + 2)] if url.count("/") > 2 else url
        cached = self._origin_pool
        if cached is not None and cached[0] == origin and cached[1] is verify:
            return cached[2]
        pool = super().get_connection_with_tls_context(request, verify, proxies=dict(proxies or {}), cert=cert)
        self._origin_pool = (origin, verify, pool)
        return pool

    def close(self) -> None:
        self._origin_pool = None
        super().close()

    def build_response(self, req: requests.PreparedRequest, resp: BaseHTTPResponse) -> requests.Response:
        """The status and urllib3's response, unread: no headers copied, no cookies taken."""
        response = requests.Response()
        response.status_code = resp.status
        response.raw = resp
        response.request = req
        response.connection = self
        return response

    def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **kwargs)
        manager.pool_classes_by_scheme = _POOLS
        return manager


def new_session(*, pool_maxsize: int, proxy: str | None, ca_bundle: str | None, user_agent: str) -> requests.Session:
    """A session for one base URL: pooled, never retrying, trusting nothing from the environment."""
    session = requests.Session()
    session.trust_env = False  # proxies and CA bundle are ours (passed below), .netrc never read
    session.cookies = RequestsCookieJar(DefaultCookiePolicy(allowed_domains=()))  # keeps none
    session.max_redirects = 0
    adapter = _Adapter(pool_connections=1, pool_maxsize=max(1, pool_maxsize), max_retries=0)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    session.proxies = {"http": proxy, "https": proxy} if proxy else {}
    session.verify = ca_bundle or True
    session.headers = requests.structures.CaseInsensitiveDict(
        {"User-Agent": user_agent, "Accept": "*/*", "Accept-Encoding": "gzip, deflate"})
    return session


def open_connections(session: requests.Session) -> int:
    """Idle pooled connections of ``session`` that hold a socket open."""
    count = 0
    for adapter in {id(a): a for a in session.adapters.values() if isinstance(a, HTTPAdapter)}.values():
        managers = [adapter.poolmanager, *adapter.proxy_manager.values()]
        for manager in managers:
            if manager is None:
                continue
            for key in list(manager.pools.keys()):
                pool = manager.pools.get(key)
                idle = list(getattr(getattr(pool, "pool", None), "queue", ()) or ())
                count += sum(1 for conn in idle if conn is not None and getattr(conn, "sock", None) is not None)
    return count


def exchange(session: requests.Session, method: str, url: str, headers: Mapping[str, str], body: bytes | None, *,
             connect_timeout: float, read_timeout: float, limit: int) -> tuple[int, Mapping[str, str], bytes]:
    """One request: ``(status, headers, body)``, or :class:`TransportError` /
    :class:`ResponseTooLargeError`.

    ``url`` is sent as given: it is set on the prepared request after preparing, so
    that neither ``requests`` nor urllib3 turns an encoded ``%2E%2E`` back into a dot
    segment that would then be collapsed (``_paths.py``). The answer must be complete
    within ``read_timeout`` of the request going out (a server trickling a byte at a
    time cannot hold the call for ever); the connect timeout comes before that.
    """
    prepared = requests.PreparedRequest()
    prepared.prepare_method(method)
    prepared.url = url  # as given: not re-quoted, no dot segment collapsed
    try:
        prepared.prepare_headers({**session.headers, **headers})
    except requests.exceptions.InvalidHeader:  # its message quotes the value: a credential, maybe
        raise TransportError("other", "a header value that cannot be sent (not sent)", "", sent=False) from None
    prepared.prepare_body(body or None, None)  # Content-Length (0 for a POST without a body)
    started = time.monotonic()
    _WATCHDOG.fired()  # nothing of an earlier call
    try:
        # The adapter's own send: what Session.send adds (hooks, cookies, redirects, the
        # environment) is nothing this transport wants, and cost a sixth of a call's CPU.
        verify = session.verify if session.verify is not None else True
        response = session.get_adapter(url).send(prepared, stream=True, timeout=(connect_timeout, read_timeout),
                                                 verify=verify, cert=None, proxies=session.proxies)
    except requests.RequestException as err:
        if _WATCHDOG.fired():
            raise _no_answer() from None
        raise failure(err) from None
    raw = response.raw
    if _WATCHDOG.fired():  # http.client may take headers cut short for a whole answer
        raw.close()
        raise _no_answer()
    try:
        content = _read(raw, started + read_timeout, limit, read_timeout)
    except BaseException:
        raw.close()  # cut off: the connection is not reused
        raise
    raw.release_conn()
    return response.status_code, raw.headers, content


def _read(raw: HTTPResponse, deadline: float, limit: int, read_timeout: float) -> bytes:
    """The body, decoded, read one socket read at a time until complete, past ``limit``
    (:class:`ResponseTooLargeError`) or past ``deadline`` (``body_timeout``)."""
    chunks: list[bytes] = []
    size = 0
    try:
        while True:
            sock = getattr(raw.connection, "sock", None)
            if sock is not None:  # each wait ends by the deadline, not a fresh read timeout later
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
            chunk = raw.read1(_CHUNK, decode_content=True)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > limit:
                raise ResponseTooLargeError
            chunks.append(chunk)
            if time.monotonic() > deadline and not _done(raw):
                raise _late(read_timeout)
    except ReadTimeoutError:
        raise _late(read_timeout) from None
    except DecodeError as err:
        raise TransportError("other", "the answer's content encoding does not decode", _detail(err),
                             sent=True) from None
    except (ProtocolError, OSError) as err:
        raise TransportError("dropped", "response truncated", _detail(err), sent=True) from None


def _done(raw: HTTPResponse) -> bool:
    """Whether the whole body has been received (what is left is in our buffers)."""
    fp = raw._fp
    return fp is None or bool(fp.isclosed())


def _no_answer() -> TransportError:
    return TransportError("read_timeout", "no answer within the read timeout", "", sent=True)


def _late(read_timeout: float) -> TransportError:
    return TransportError("body_timeout", f"response body not complete within the read timeout of {read_timeout:g} s",
                          "", sent=True)


def failure(err: requests.RequestException) -> TransportError:
    """``err`` as a :class:`TransportError`: what happened, and whether the request may
    have reached the server. Only the innermost reason's words are kept (redacted): the
    library's own message names the whole URL, query included."""
    reason = _reason(err)
    detail = _detail(reason)
    if isinstance(err, requests.exceptions.InvalidSchema) and "SOCKS" in str(err):
        return TransportError("proxy", "a SOCKS proxy needs PySocks, which is not installed: use an http(s):// "
                              "proxy or NO_PROXY", "", sent=False)
    if isinstance(err, requests.exceptions.ProxyError):
        return TransportError("proxy", "could not reach the proxy", detail, sent=False)
    if isinstance(err, requests.exceptions.ConnectTimeout):
        return TransportError("connect_timeout", "could not connect in time", detail, sent=False)
    if isinstance(err, requests.exceptions.SSLError):
        if _caused_by(reason, ssl.SSLCertVerificationError):
            return TransportError("tls_certificate", "TLS certificate refused", detail, sent=False)
        return TransportError("tls", "TLS handshake failed", detail, sent=False)
    if isinstance(err, requests.exceptions.ReadTimeout):
        return TransportError("read_timeout", "no answer within the read timeout", detail, sent=True)
    if isinstance(reason, NameResolutionError):
        return TransportError("unresolved", "the host name does not resolve", detail, sent=False)
    if isinstance(reason, NewConnectionError):
        code = _errno(reason)
        if code == errno.ECONNREFUSED:
            return TransportError("refused", "connection refused", detail, sent=False)
        if code in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            return TransportError("unreachable", "no route to the host", detail, sent=False)
        return TransportError("refused", "could not connect", detail, sent=False)
    if _caused_by(reason, RemoteDisconnected):
        return TransportError("dropped", "the server closed the connection without answering", detail, sent=True)
    if _caused_by(reason, ConnectionResetError):
        return TransportError("dropped", "the connection was reset", detail, sent=True)
    if _caused_by(reason, BrokenPipeError):
        return TransportError("dropped", "sending failed", detail, sent=True)
    if isinstance(reason, ProtocolError | socket.timeout):
        return TransportError("dropped", "the connection closed without an answer", detail, sent=True)
    return TransportError("other", f"transport failure ({type(reason).__name__})", detail, sent=True)


def _reason(err: BaseException) -> BaseException:
    """The underlying cause of a ``requests`` error: a ``MaxRetryError``'s reason, or the
    urllib3 / socket error it wraps."""
    inner = err.args[0] if err.args and isinstance(err.args[0], BaseException) else err
    if isinstance(inner, MaxRetryError) and inner.reason is not None:
        return inner.reason
    return inner


def _caused_by(err: BaseException | None, kind: type[BaseException]) -> bool:
    seen = 0
    while err is not None and seen < 8:
        if isinstance(err, kind) or any(isinstance(arg, kind) for arg in getattr(err, "args", ())):
            return True
        err, seen = err.__cause__ or err.__context__, seen + 1
    return False


def _errno(err: BaseException | None) -> int | None:
    seen = 0
    while err is not None and seen < 8:
        if isinstance(err, OSError) and err.errno:
            return err.errno
        err, seen = err.__cause__ or err.__context__, seen + 1
    return None


def _detail(err: BaseException) -> str:
    return logsafety.redact(str(err))
