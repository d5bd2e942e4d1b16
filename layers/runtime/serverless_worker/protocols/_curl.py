"""One HTTP exchange over libcurl (``pycurl``), and what a failed one means.

Why libcurl: the local worker is bound by its own CPU, and on loopback a call through
urllib3 cost the client 340-440 µs of CPU, through libcurl 95-120 µs (``python -m
benchmarks.http_calls``): http.client parses every response's headers with the email
package, in Python. libcurl does the whole exchange in C, with the GIL released, and is
as well kept as HTTP clients come: connection reuse, TLS verification, proxies (CONNECT
tunnels included), timeouts and gzip, with no Python left on the path.

An easy handle is one connection's worth of state and is used by one thread at a time:
:class:`HandlePool` lends them out, as urllib3's pool lent connections. Options that
never change are set once per handle (:func:`new_handle`); each request sets only its
own. libcurl never reads ``.netrc`` and never follows a redirect unless told to, and it
is told neither.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pycurl

from .. import logsafety

__all__ = ["CurlSettings", "Exchange", "HandlePool", "Headers", "ResponseTooLargeError", "TransportError",
           "perform"]

# Connect-phase failures: nothing was sent, so the request certainly did not reach the server.
_TLS_CODES = frozenset({35, 53, 54, 58, 59, 64, 66, 77, 80, 82, 83, 90, 91})
_DROPPED = {52: "the server closed the connection without answering", 55: "sending failed",
            56: "the connection was reset", 18: "response truncated"}
_ECONNREFUSED, _EHOSTUNREACH, _ENETUNREACH = 111, 113, 101
_PREREQ_OK: int = int(pycurl.PREREQFUNC_OK)
_PREREQ_ABORT: int = int(pycurl.PREREQFUNC_ABORT)


class TransportError(Exception):
    """What went wrong below HTTP, in words: only ever the ``__cause__`` of the
    ``ServerUnavailableError`` the transport raises (so outside the project's error tree,
    which callers catch), where ``local.first_contact`` reads it.

    ``kind`` is one of ``unresolved``, ``refused``, ``unreachable``, ``connect_timeout``,
    ``proxy``, ``tls_certificate``, ``tls``, ``read_timeout``, ``body_timeout``,
    ``dropped`` or ``other``; ``sent`` is whether the request may have reached the server;
    ``detail`` is libcurl's message with any credential cut out.
    """

    def __init__(self, kind: str, words: str, detail: str, *, sent: bool) -> None:
        super().__init__(f"{words} ({detail})" if detail else words)
        self.kind = kind
        self.words = words
        self.detail = detail
        self.sent = sent


class ResponseTooLargeError(Exception):
    """The body passed the transport's size limit; the exchange was cut there."""


class Headers(Mapping[str, str]):
    """Response headers, looked up without regard to case (repeated ones joined by ``, ``)."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: dict[str, tuple[str, str]] = {}  # lower-case name -> (name, value)

    def add(self, name: str, value: str) -> None:
        key = name.lower()
        old = self._items.get(key)
        self._items[key] = (name, f"{old[1]}, {value}" if old else value)

    def __getitem__(self, name: str) -> str:
        return self._items[name.lower()][1]

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Headers({dict(self.items())!r})"


class Exchange:
    """What one request collects: its raw header lines and its body, up to ``limit`` bytes,
    all of it within ``read_timeout`` of the connection being ready.

    libcurl hands over every header line on its own; appending it is all that happens
    then (``list.append`` is C, so no Python frame runs per line), and the lines are
    read once, after the exchange (:meth:`headers`). The body comes in chunks, each
    checked against the size limit and against the read timeout, counted from the moment
    the connection was ready (:meth:`ready`): libcurl's own timeout also counts a new
    connection's connect time, which would give a trickling answer that much more.

    A request is sent once. libcurl sends it again on a new connection when a reused one
    closed without a byte of answer; but the server may have read it and acted before it
    closed (a pull that took jobs, a report that was applied), so the second connection's
    :meth:`ready` refuses, and the exchange fails as ``dropped``, possibly sent.
    """

    __slots__ = ("chunks", "header_lines", "late", "limit", "prepared", "read_timeout", "ready_at", "resent",
                 "size", "too_large")

    def __init__(self, limit: int, read_timeout: float) -> None:
        self.limit = limit
        self.read_timeout = read_timeout
        self.ready_at = time.monotonic()
        self.size = 0
        self.chunks: list[bytes] = []
        self.header_lines: list[bytes] = []
        self.too_large = False
        self.late = False
        self.prepared = False
        self.resent = False

    def write(self, chunk: bytes) -> int | None:
        self.size += len(chunk)
        if self.size > self.limit:
            self.too_large = True
            return 0  # anything but len(chunk) makes libcurl stop the transfer
        if time.monotonic() - self.ready_at > self.read_timeout:
            self.late = True
            return 0
        self.chunks.append(chunk)
        return None

    def ready(self, *connection: object) -> int:
        """libcurl's PREREQFUNCTION: the connection is made (or reused); the request goes
        next, unless it already went out on another connection."""
        if self.prepared:
            self.resent = True
            return _PREREQ_ABORT
        self.prepared = True
        self.ready_at = time.monotonic()
        return _PREREQ_OK

    @property
    def answered(self) -> bool:
        """Whether a status line came (the server began its answer)."""
        return bool(self.header_lines)

    def headers(self) -> Headers:
        """The last response's headers: a ``100 Continue`` or a proxy's CONNECT answer
        comes first, each with a status line of its own."""
        headers = Headers()
        for line in self.header_lines:
            if line.startswith(b"HTTP/"):
                headers = Headers()
                continue
            name, colon, value = line.decode("latin-1").partition(":")
            if colon:
                headers.add(name.strip(), value.strip())
        return headers

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)


@dataclass(frozen=True)
class CurlSettings:
    """What every handle of one transport shares."""

    connect_timeout: float
    proxy: str | None
    ca_bundle: str | None  # a file or a directory; only for https


def new_handle(settings: CurlSettings) -> pycurl.Curl:
    """An easy handle with the options no request changes."""
    handle = pycurl.Curl()
    handle.setopt(pycurl.NOSIGNAL, 1)  # threads: no SIGALRM for timeouts
    handle.setopt(pycurl.TCP_NODELAY, 1)
    handle.setopt(pycurl.MAXCONNECTS, 1)  # one thread's calls, one at a time: one connection
    handle.setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_1_1)
    handle.setopt(pycurl.PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
    handle.setopt(pycurl.FOLLOWLOCATION, 0)  # a credential must never follow a redirect
    handle.setopt(pycurl.PATH_AS_IS, 1)  # no dot-segment collapsing: ids are paths' segments (_paths.py)
    handle.setopt(pycurl.CONNECTTIMEOUT_MS, max(1, int(settings.connect_timeout * 1000)))
    # The proxy chosen from the environment by requests' rules, or "" for none: libcurl
    # must not apply its own reading of the proxy variables on top.
    handle.setopt(pycurl.PROXY, settings.proxy or "")
    handle.setopt(pycurl.ACCEPT_ENCODING, "gzip, deflate")  # sent, and undone before the body is seen
    if settings.ca_bundle:
        handle.setopt(pycurl.CAPATH if os.path.isdir(settings.ca_bundle) else pycurl.CAINFO, settings.ca_bundle)
    return handle


class HandlePool:
    """Idle easy handles, newest first; at most ``maxsize`` are kept (more may be lent)."""

    def __init__(self, settings: CurlSettings, maxsize: int) -> None:
        self.settings = settings
        self._maxsize = max(1, maxsize)
        self._idle: list[pycurl.Curl] = []
        self._lock = threading.Lock()
        self._closed = False

    def take(self) -> pycurl.Curl:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return new_handle(self.settings)

    def give(self, handle: pycurl.Curl) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._maxsize:
                self._idle.append(handle)
                return
        handle.close()

    def open_connections(self) -> int:
        """Idle handles holding a connection open."""
        with self._lock:
            return sum(1 for handle in self._idle if handle.getinfo(pycurl.ACTIVESOCKET) != -1)

    def close(self) -> None:
        """Close every idle handle (and its connections); handles lent out close when given back."""
        with self._lock:
            self._closed, idle, self._idle = True, self._idle, []
        for handle in idle:
            handle.close()


def perform(handle: pycurl.Curl, method: str, url: str, headers: list[str], body: bytes | None, *,
            settings: CurlSettings, read_timeout: float, limit: int) -> tuple[int, Headers, bytes]:
    """One request on ``handle``: ``(status, headers, body)``, or :class:`TransportError`
    / :class:`ResponseTooLargeError`.

    The whole answer, a long poll's wait included, must come within ``read_timeout`` of
    the connection being ready (a server trickling a byte at a time cannot hold the call
    for ever); a handle without a connection open may first take the connect timeout.
    """
    fd = handle.getinfo(pycurl.ACTIVESOCKET)
    connected = fd != -1 and not _closed_by_peer(fd)
    handle.setopt(pycurl.FRESH_CONNECT, 0 if connected or fd == -1 else 1)  # the closed one is let go
    budget = read_timeout if connected else settings.connect_timeout + read_timeout
    exchange = Exchange(limit, read_timeout)
    handle.setopt(pycurl.URL, url)
    handle.setopt(pycurl.HTTPHEADER, headers)
    handle.setopt(pycurl.CUSTOMREQUEST, method)
    if body is None and method in ("GET", "DELETE"):
        handle.setopt(pycurl.HTTPGET, 1)
    else:
        handle.setopt(pycurl.POSTFIELDS, body or b"")
    handle.setopt(pycurl.WRITEFUNCTION, exchange.write)
    handle.setopt(pycurl.HEADERFUNCTION, exchange.header_lines.append)
    handle.setopt(pycurl.PREREQFUNCTION, exchange.ready)
    handle.setopt(pycurl.TIMEOUT_MS, max(1, int(1000 * budget)))
    try:
        handle.perform()
    except pycurl.error as err:
        if exchange.too_large:
            raise ResponseTooLargeError from None
        code, message = (*err.args, 0, "")[:2]
        if exchange.late:
            code, message = pycurl.E_OPERATION_TIMEDOUT, ""
        if exchange.resent:
            raise TransportError("dropped", "the connection closed without an answer (not sent again)", "",
                                 sent=True) from None
        raise failure(handle, int(code), str(message), read_timeout=read_timeout,
                      answered=exchange.answered, proxied=bool(settings.proxy)) from None
    finally:
        # The callbacks hold the exchange; drop them so an idle handle keeps no response alive.
        handle.setopt(pycurl.WRITEFUNCTION, _discard)
        handle.setopt(pycurl.HEADERFUNCTION, _discard)
        handle.setopt(pycurl.PREREQFUNCTION, _ready)
    return int(handle.getinfo(pycurl.RESPONSE_CODE)), exchange.headers(), exchange.body


def _closed_by_peer(fd: int) -> bool:
    """Whether an idle connection has anything to read: the server closed it (or sent
    what no request asked for). libcurl looks only at connections idle for a second or
    more before reusing one, and a request sent on a closed one fails without an answer,
    which cannot be told from a server that read it and went away (see :class:`Exchange`)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def _discard(data: bytes) -> None:
    return None


def _ready(*connection: object) -> int:
    return _PREREQ_OK


def failure(handle: pycurl.Curl, code: int, message: str, *, read_timeout: float, answered: bool,
            proxied: bool) -> TransportError:
    """libcurl's error ``code`` as a :class:`TransportError`: what happened, and whether
    the request may have reached the server."""
    detail = logsafety.redact(message)
    if code == pycurl.E_COULDNT_RESOLVE_HOST:
        return TransportError("unresolved", "the host name does not resolve", detail, sent=False)
    if code == pycurl.E_COULDNT_RESOLVE_PROXY:
        return TransportError("proxy", "the proxy's host name does not resolve", detail, sent=False)
    if code == pycurl.E_COULDNT_CONNECT:
        if proxied:
            return TransportError("proxy", "could not connect to the proxy", detail, sent=False)
        errno = handle.getinfo(pycurl.OS_ERRNO)
        if errno == _ECONNREFUSED:
            return TransportError("refused", "connection refused", detail, sent=False)
        if errno in (_EHOSTUNREACH, _ENETUNREACH):
            return TransportError("unreachable", "no route to the host", detail, sent=False)
        return TransportError("refused", "could not connect", detail, sent=False)
    if code == pycurl.E_PEER_FAILED_VERIFICATION:
        return TransportError("tls_certificate", "TLS certificate refused", detail, sent=False)
    if code in _TLS_CODES:
        return TransportError("tls", "TLS handshake failed", detail, sent=False)
    if code == pycurl.E_OPERATION_TIMEDOUT:
        if handle.getinfo(pycurl.PRETRANSFER_TIME) <= 0:
            return TransportError("connect_timeout", "could not connect in time", detail, sent=False)
        if answered:
            return TransportError("body_timeout", f"response body not complete within the read timeout "
                                    f"of {read_timeout:g} s", detail, sent=True)
        return TransportError("read_timeout", "no answer within the read timeout", detail, sent=True)
    if code in _DROPPED:
        return TransportError("dropped", _DROPPED[code], detail, sent=True)
    return TransportError("other", f"curl error {code}", detail, sent=True)
