"""Reading HTTP/1.1 requests off a raw socket, for the tests' hand-written servers: they
answer what no sandbox would (garbage, a dropped connection, a trickle), so they cannot
use an HTTP server library, but they share how a request is read."""

from __future__ import annotations

import socket

__all__ = ["read_request"]


def read_request(conn: socket.socket, buffer: bytes = b"") -> tuple[bytes, bytes] | None:
    """Read one request whose first bytes may already be in ``buffer``: return its body and
    what was read past it (the next request's start), or None if the client closed first.
    The whole request is read, since a socket closed with unread bytes sends a reset."""
    while b"\r\n\r\n" not in buffer:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        buffer += chunk
    head, _, buffer = buffer.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(buffer) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        buffer += chunk
    return buffer[:length], buffer[length:]
