"""The HTTP transport (requests) against a raw loopback server that misbehaves on purpose:
each transport failure says what happened and whether the request may have been sent,
a request is never sent twice (urllib3 makes one attempt), and no answer, however slow
or however compressed, holds a call past its read timeout or memory past the size limit."""

from __future__ import annotations

import contextlib
import gzip
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from serverless_worker.errors import ProtocolViolationError, ServerUnavailableError
from serverless_worker.protocols._http import HttpTransport, TransportError
from support.raw_http import read_request

# What the server does with a request, chosen by its body: answer it, or misbehave.
Behaviour = Callable[[socket.socket], bool]  # returns whether the connection stays open


@dataclass
class RawServer:
    """HTTP/1.1 by hand on loopback, one thread a connection; records every request body."""

    behaviours: dict[bytes, Behaviour] = field(default_factory=dict)
    bodies: list[bytes] = field(default_factory=list)
    connections: int = 0
    # released once for each connection the server has closed (its FIN sent)
    closed: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))

    def __post_init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):  # the client gave up (a timeout, a size limit)
            self._exchange(conn)
        self.closed.release()

    def _exchange(self, conn: socket.socket) -> None:
        rest = b""
        with conn:
            while (request := read_request(conn, rest)) is not None:
                body, rest = request
                self.bodies.append(body)
                if not self.behaviours.get(body, answer)(conn):
                    return

    def close(self) -> None:
        self._listener.close()


def answer(conn: socket.socket, extra: bytes = b"") -> bool:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n" + extra + b"\r\nok")
    return True


def close_without_answer(conn: socket.socket) -> bool:
    return False


def never_answer(conn: socket.socket) -> bool:
    time.sleep(5)
    return False


@pytest.fixture
def server() -> Iterator[RawServer]:
    served = RawServer()
    yield served
    served.close()


def cause(info: pytest.ExceptionInfo[ServerUnavailableError]) -> TransportError:
    assert isinstance(info.value.__cause__, TransportError), info.value.__cause__
    return info.value.__cause__


def test_calls_share_one_connection_and_headers_are_read_without_regard_to_case(server: RawServer) -> None:
    server.behaviours[b"twice"] = lambda conn: answer(conn, b"x-Thing: a\r\nX-THING: b\r\n")
    transport = HttpTransport(server.url)
    first = transport.request("POST", "/a", endpoint="a", data=b"once")
    second = transport.request("POST", "/a", endpoint="a", data=b"twice")
    assert (first.status, first.body, second.body) == (200, b"ok", b"ok")
    assert second.headers["x-thing"] == "a, b" and second.headers["Content-Length"] == "2"
    assert server.connections == 1 and transport.pooled_connections == 1


def test_a_request_the_server_read_and_dropped_is_not_sent_again_on_a_new_connection(
        server: RawServer) -> None:
    # A client that retries would resend a request whose reused connection closed without
    # a byte of answer; the server may have acted on it, so the transport sends it once.
    server.behaviours[b"drop"] = close_without_answer
    transport = HttpTransport(server.url)
    transport.request("POST", "/pull", endpoint="pull", data=b"warm")  # the connection is now reused
    with pytest.raises(ServerUnavailableError) as info:
        transport.request("POST", "/pull", endpoint="pull", data=b"drop")
    assert server.bodies == [b"warm", b"drop"]
    assert info.value.ambiguous and cause(info).kind == "dropped" and cause(info).sent
    # The transport is still usable: the next call takes a new connection.
    assert transport.request("POST", "/pull", endpoint="pull", data=b"after").status == 200
    assert server.bodies == [b"warm", b"drop", b"after"]


def test_a_drop_on_a_new_connection_is_ambiguous_and_sent_once(server: RawServer) -> None:
    server.behaviours[b"drop"] = close_without_answer
    with pytest.raises(ServerUnavailableError) as info:
        HttpTransport(server.url).request("POST", "/r", endpoint="r", data=b"drop")
    assert server.bodies == [b"drop"] and info.value.ambiguous and cause(info).kind == "dropped"


def test_an_idle_connection_the_server_closed_is_replaced_without_a_failure(server: RawServer) -> None:
    # A keep-alive connection the server closed while idle is the everyday case, not a
    # failure: urllib3 sees it closed before sending and connects anew.
    server.behaviours[b"last"] = lambda conn: answer(conn) and False
    transport = HttpTransport(server.url)
    transport.request("POST", "/r", endpoint="r", data=b"last")
    # the server has closed it (on loopback its FIN is with us)
    assert server.closed.acquire(timeout=10)
    assert transport.request("POST", "/r", endpoint="r", data=b"next").status == 200
    assert transport.request("POST", "/r", endpoint="r", data=b"again").status == 200
    assert server.bodies == [b"last", b"next", b"again"] and server.connections == 2
    assert transport.pooled_connections == 1


def test_a_refused_connection_was_certainly_not_sent() -> None:
    with socket.create_server(("127.0.0.1", 0)) as reserved:
        port = reserved.getsockname()[1]
    with pytest.raises(ServerUnavailableError) as info:
        HttpTransport(f"http://127.0.0.1:{port}").request("GET", "/", endpoint="pull")
    assert not info.value.ambiguous and cause(info).kind == "refused"


def test_no_answer_within_the_read_timeout_may_have_been_sent(server: RawServer) -> None:
    server.behaviours[b"slow"] = never_answer
    transport = HttpTransport(server.url, read_timeout=0.3)
    transport.request("POST", "/r", endpoint="r", data=b"warm")  # a new connection may add its connect time
    started = time.monotonic()
    with pytest.raises(ServerUnavailableError) as info:
        transport.request("POST", "/r", endpoint="r", data=b"slow")
    # The kind says the read timeout ended it (the server would have closed without an answer,
    # "dropped", after 5 s); the time is the same fact with room for a loaded machine.
    assert info.value.ambiguous and cause(info).kind == "read_timeout"
    assert time.monotonic() - started < 4  # the read timeout, not the server's 5 s


def test_a_trickling_body_must_be_complete_within_the_read_timeout(server: RawServer) -> None:
    def trickle(conn: socket.socket) -> bool:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
        for _ in range(100):  # a byte every 50 ms: each read is quick, the whole takes 5 s
            conn.sendall(b"x")
            time.sleep(0.05)
        return False

    server.behaviours[b"trickle"] = trickle
    transport = HttpTransport(server.url, read_timeout=0.4)
    transport.request("POST", "/r", endpoint="r", data=b"warm")
    started = time.monotonic()
    with pytest.raises(ServerUnavailableError) as info:
        transport.request("POST", "/r", endpoint="r", data=b"trickle")
    # The kind says the whole-body limit ended it (a per-read timeout alone would have let the
    # 5 s body complete); the time is the same fact with room for a loaded machine.
    assert info.value.ambiguous and cause(info).kind == "body_timeout"
    assert time.monotonic() - started < 4  # not the 5 s the whole body takes


def test_a_body_over_the_limit_is_cut_off_and_refused(server: RawServer) -> None:
    def large(conn: socket.socket) -> bool:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 4096\r\n\r\n" + b"x" * 4096)
        return True

    server.behaviours[b"large"] = large
    transport = HttpTransport(server.url, max_response_bytes=1024)
    with pytest.raises(ProtocolViolationError, match="larger than 1024 bytes"):
        transport.request("POST", "/r", endpoint="r", data=b"large")
    assert transport.request("POST", "/r", endpoint="r", data=b"small").body == b"ok"


def test_headers_trickled_a_byte_at_a_time_are_cut_at_the_read_timeout(server: RawServer) -> None:
    # Each byte comes well within the read timeout; the whole header block would take 5 s.
    # Were the timeout per socket read only, the call would wait it out and succeed.
    def trickle_headers(conn: socket.socket) -> bool:
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        for _ in range(100):
            conn.sendall(b"X")
            time.sleep(0.05)
        conn.sendall(b": y\r\nContent-Length: 2\r\n\r\nok")
        return False

    server.behaviours[b"trickle"] = trickle_headers
    transport = HttpTransport(server.url, read_timeout=0.4)
    transport.request("POST", "/r", endpoint="r", data=b"warm")
    with pytest.raises(ServerUnavailableError) as info:
        transport.request("POST", "/r", endpoint="r", data=b"trickle")
    assert info.value.ambiguous and cause(info).kind == "read_timeout"
    assert server.bodies == [b"warm", b"trickle"]  # sent once
    assert transport.request("POST", "/r", endpoint="r", data=b"after").body == b"ok"


def test_a_compressed_body_that_expands_past_the_limit_is_cut_off_and_refused(server: RawServer) -> None:
    # 64 MiB of zeros is 64 KiB gzipped: the limit holds for what it expands to, and the
    # transport never holds the whole of it.
    bomb = gzip.compress(bytes(64 * 1024 * 1024), compresslevel=9)

    def compressed(conn: socket.socket) -> bool:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: "
                     + str(len(bomb)).encode() + b"\r\n\r\n" + bomb)
        return True

    server.behaviours[b"bomb"] = compressed
    transport = HttpTransport(server.url, max_response_bytes=1024 * 1024)
    with pytest.raises(ProtocolViolationError, match="larger than 1048576 bytes"):
        transport.request("POST", "/r", endpoint="r", data=b"bomb")
    assert transport.request("POST", "/r", endpoint="r", data=b"small").body == b"ok"
    assert server.connections == 2  # the cut-off connection was not reused


def test_a_compressed_body_within_the_limit_is_decoded(server: RawServer) -> None:
    body = b'{"jobs": []}' * 1000

    def compressed(conn: socket.socket) -> bool:
        packed = gzip.compress(body)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: "
                     + str(len(packed)).encode() + b"\r\n\r\n" + packed)
        return True

    server.behaviours[b"gzip"] = compressed
    assert HttpTransport(server.url).request("POST", "/r", endpoint="r", data=b"gzip").body == body


def test_a_header_value_that_cannot_be_sent_is_refused_without_quoting_it(server: RawServer) -> None:
    # the clients check credentials before this (header_credential); the transport holds the line too
    with pytest.raises(ServerUnavailableError) as info:
        HttpTransport(server.url).request("POST", "/r", endpoint="r", data=b"x",
                                          headers={"X-API-Key": "k\r\nX-Injected: secret-77"})
    assert not info.value.ambiguous and server.bodies == []
    assert "secret-77" not in f"{info.value} {info.value.__cause__!r} {info.value.__cause__.__cause__!r}"


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_is_never_followed_and_no_credential_goes_where_it_points(server: RawServer, status: int) -> None:
    # given a server answering a redirect to another server (on loopback: the test sends nothing off it)
    elsewhere = RawServer()
    try:
        def redirect(conn: socket.socket) -> bool:
            conn.sendall(f"HTTP/1.1 {status} Moved\r\nLocation: {elsewhere.url}/steal\r\n"
                         "Content-Length: 0\r\n\r\n".encode())
            return True

        server.behaviours[b"report"] = redirect
        transport = HttpTransport(server.url)

        # when a call carrying a credential header is answered so
        response = transport.request("POST", "/r", endpoint="r", data=b"report", headers={"X-API-Key": "k3y"})

        # then the status comes back as it is (each client refuses it as an unexpected answer)
        # and nothing, credential or body, reached where the redirect pointed
        assert response.status == status and response.headers["Location"].endswith("/steal")
        assert elsewhere.connections == 0 and elsewhere.bodies == []
    finally:
        elsewhere.close()
