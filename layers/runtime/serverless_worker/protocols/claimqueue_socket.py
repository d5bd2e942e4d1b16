"""The claim queue's ``GET /<queue>/work`` WebSocket: claim, progress and result over one
connection, shared by threads.

Message shapes (the document shows ``claim``, ``result``, ``item``, ``empty`` and
``result-ack``; the rest are chosen here to mirror them):

- ``{"claim": {"worker", "criteria"}}`` -> ``{"type": "item", id, item, attempts, lease}``
  or ``{"type": "empty"}``
- ``{"progress": {"id", "value"}}`` -> ``{"type": "progress-ack", id, accepted, status}``
- ``{"result": {"id", "value"}}`` -> ``{"type": "result-ack", id, accepted, status}``
- any request -> ``{"type": "error", "error": "..."}`` when the server refuses it

One request is in flight at a time (a lock around each send/receive pair), so answers
need no correlation beyond the item id the acks carry. A connection whose answer did
not arrive in time is closed rather than reused: a late answer would otherwise be read
as the answer to the next request.

The server re-queues every item still leased to a connection the moment it closes.
So a dropped connection voids the leases taken on it (its id goes into ``lost``), a
claim whose answer was lost with the connection is *not* stranded (unlike over HTTP),
and closing the socket is how items are handed back at once. The next request opens
a fresh connection.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from typing import Any, TypeVar

from pydantic import BaseModel, SecretStr, ValidationError
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.protocol import State
from websockets.sync.client import ClientConnection, connect

from .. import logsafety
from ..errors import ProtocolViolationError, ServerUnavailableError
from ._http import DEFAULT_MAX_RESPONSE_BYTES
from .claimqueue_models import SocketAck, SocketItem, raise_for_answer

__all__ = ["ClaimQueueSocket", "UnreadableItemError"]

log = logging.getLogger("serverless_worker.protocols.claimqueue")
_Message = TypeVar("_Message", bound=BaseModel)

# websockets logs the handshake's request headers (our Authorization header) and every
# frame at DEBUG. Its connections log to logsafety's wire logger instead, held at INFO and
# redacted, so that turning on DEBUG logging never prints the bearer token.
_WIRE_LOG = logging.getLogger(logsafety.WIRE_LOGGER)

_KNOWN_TYPES = frozenset({"item", "empty", "progress-ack", "result-ack", "error"})


class UnreadableItemError(ProtocolViolationError):
    """A claimed item whose id is usable but whose other fields are not: it stays leased
    on ``connection`` so that it can be finished with an error result."""

    def __init__(self, message: str, *, item_id: str, item: Any, connection: str) -> None:
        super().__init__(message, endpoint="claim")
        self.item_id, self.item, self.connection = item_id, item, connection


class ClaimQueueSocket:
    """One ``work`` socket for one queue.

    ``url`` is the ``ws(s)://`` URL of ``/<queue>/work``; the token travels in the
    ``Authorization`` header of the handshake, never in the URL. ``proxy`` is the one the
    client's HTTP transport chose (``protocols/_proxy.py``: none for loopback), never
    websockets' own reading of the environment, which would proxy a loopback server.
    """

    def __init__(self, url: str, token: SecretStr, *, connect_timeout: float = 3.05,
                 read_timeout: float = 10.0, max_size: int = DEFAULT_MAX_RESPONSE_BYTES,
                 proxy: str | None = None) -> None:
        self._url = url
        self._proxy = proxy
        self._token = token
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._max_size = max_size
        self._lock = threading.Lock()
        self._conn: ClientConnection | None = None
        self._conn_id: str | None = None
        self._leased: set[str] = set()
        self._lost: set[str] = set()
        self.connects = 0

    def __repr__(self) -> str:
        state = "open" if self._conn is not None else "closed"
        return f"ClaimQueueSocket(url={self._url!r}, {state}, token=SecretStr('**********'))"

    # -- operations ------------------------------------------------------------------
    def claim(self, worker: str | None, criteria: dict[str, Any] | None) -> tuple[SocketItem | None, str]:
        """Claim one item; returns it (``None`` when empty) and the id of the connection
        that holds its lease."""
        body: dict[str, Any] = {}
        if worker is not None:
            body["worker"] = worker
        if criteria is not None:
            body["criteria"] = criteria
        with self._lock:
            data, conn_id = self._exchange({"claim": body}, endpoint="claim", expect={"item", "empty"})
            if data["type"] == "empty":
                return None, conn_id
            try:
                item = self._model(SocketItem, data, endpoint="claim")
            except ProtocolViolationError as err:
                item_id = data.get("id")
                if isinstance(item_id, int) and not isinstance(item_id, bool):
                    item_id = str(item_id)
                if isinstance(item_id, str) and item_id:
                    # Addressable: keep its lease, so the caller finishes it with an error result.
                    self._leased.add(item_id)
                    raise UnreadableItemError(str(err), item_id=item_id, item=data.get("item"),
                                              connection=conn_id) from None
                self._drop()  # re-queues the unreadable item now instead of at lease expiry
                raise
            self._leased.add(item.id)
            return item, conn_id

    def progress(self, item_id: str, value: Any) -> SocketAck:
        with self._lock:
            data, _ = self._exchange({"progress": {"id": item_id, "value": value}}, endpoint="progress",
                                     expect={"progress-ack"}, item_id=item_id)
            return self._model(SocketAck, data, endpoint="progress")

    def result(self, item_id: str, value: Any) -> SocketAck:
        with self._lock:
            data, _ = self._exchange({"result": {"id": item_id, "value": value}}, endpoint="result",
                                     expect={"result-ack"}, item_id=item_id)
            ack = self._model(SocketAck, data, endpoint="result")
            self._leased.discard(item_id)  # finished, or terminal anyway: no lease left to void
            return ack

    def hand_back(self, item_id: str, connection_id: str | None) -> bool:
        """Give up one item's lease; returns True when that re-queued it right away.

        The server only re-queues by closing the connection, which re-queues *every*
        item leased on it, so the socket is closed only once this was the last one.
        Otherwise the lease lapses (or is released with the socket later).
        """
        with self._lock:
            if connection_id is None or connection_id != self._conn_id:
                return False  # that connection is gone: the item was re-queued already
            self._leased.discard(item_id)
            if self._leased:
                return False
            self._drop()
            return True

    def is_lost(self, connection_id: str | None) -> bool:
        """True when ``connection_id`` is a connection of ours that has since closed."""
        return connection_id is not None and connection_id in self._lost

    @property
    def connection_id(self) -> str | None:
        return self._conn_id

    def close(self) -> None:
        """Close the connection; the server re-queues every item still leased to it."""
        with self._lock:
            self._drop()

    # -- plumbing --------------------------------------------------------------------
    def _exchange(self, message: dict[str, Any], *, endpoint: str, expect: set[str],
                  item_id: str | None = None) -> tuple[dict[str, Any], str]:
        """Send one request and read its answer; the caller holds the lock."""
        conn, conn_id = self._ensure(endpoint)
        try:
            conn.send(json.dumps(message, separators=(",", ":")))
        except (ConnectionClosed, OSError) as err:
            # A frame never completed is never acted on: nothing happened.
            self._drop()
            raise ServerUnavailableError("work socket closed before the request was sent",
                                         endpoint=endpoint, ambiguous=False) from err
        deadline = time.monotonic() + self._read_timeout
        while True:
            try:
                raw = conn.recv(timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError as err:
                self._drop()
                raise ServerUnavailableError("no answer on the work socket within the read timeout; "
                                             "socket closed", endpoint=endpoint, ambiguous=True) from err
            except (ConnectionClosed, OSError) as err:
                self._drop()
                raise ServerUnavailableError("work socket closed before the answer arrived",
                                             endpoint=endpoint, ambiguous=True) from err
            try:
                data = json.loads(raw)
            except (ValueError, RecursionError) as err:
                self._drop()
                raise ProtocolViolationError("work socket message is not JSON (or nests too deep)",
                                             endpoint=endpoint) from err
            kind = data.get("type") if isinstance(data, dict) else None
            if kind not in _KNOWN_TYPES:
                log.debug("ignoring work socket message of unknown type on %s", endpoint)
                continue  # tolerated: a newer server may send notices we do not know
            if kind == "error":
                raise_for_answer(None, data, endpoint=endpoint, job_id=item_id or "",
                                  secrets=(self._token.get_secret_value(),))
            if kind not in expect or (item_id is not None and data.get("id") not in (None, item_id)):
                self._drop()  # out of step with the server: nothing further can be trusted
                raise ProtocolViolationError(f"unexpected {kind!r} message on the work socket",
                                             endpoint=endpoint)
            return data, conn_id

    def _ensure(self, endpoint: str) -> tuple[ClientConnection, str]:
        """The open connection, reconnecting when the previous one dropped."""
        if self._conn is not None and self._conn_id is not None and self._conn.state is State.OPEN:
            return self._conn, self._conn_id
        if self._conn is not None:
            log.info("work socket dropped; reconnecting: the server re-queued the items leased on it and hands "
                     "them out again, so no item is lost (only the work of a handler still running one)")
            self._drop()
        token = self._token.get_secret_value()
        try:
            # legacy=True: a plain long-lived connection; reconnecting is ours to do (above).
            conn = connect(self._url, additional_headers={"Authorization": f"Bearer {token}"},
                           open_timeout=self._connect_timeout, close_timeout=min(self._connect_timeout, 2.0),
                           max_size=self._max_size, logger=_WIRE_LOG,
                           user_agent_header="serverless-worker", legacy=True, proxy=self._proxy)
        except InvalidStatus as err:
            response = err.response
            try:
                body = json.loads(response.body or b"")
            except (ValueError, RecursionError):
                body = None
            raise_for_answer(response.status_code, body, endpoint=endpoint, secrets=(token,))
            raise ProtocolViolationError("work socket handshake refused", endpoint=endpoint,
                                         status=response.status_code) from err
        except (InvalidHandshake, InvalidURI) as err:
            raise ProtocolViolationError(f"work socket handshake failed ({type(err).__name__})",
                                         endpoint=endpoint) from None
        except (TimeoutError, OSError) as err:
            raise ServerUnavailableError(f"could not open the work socket ({type(err).__name__})",
                                         endpoint=endpoint, ambiguous=False) from err
        self._conn, self._conn_id = conn, uuid.uuid4().hex
        self._leased = set()
        self.connects += 1
        return conn, self._conn_id

    def _drop(self) -> None:
        """Close and forget the connection; leases taken on it are void from now on."""
        conn, self._conn = self._conn, None
        if self._conn_id is not None:
            self._lost.add(self._conn_id)
        self._conn_id = None
        self._leased = set()
        if conn is not None:
            try:
                conn.close()
            except Exception as err:  # closing a broken socket must not mask the real error
                log.debug("closing the work socket failed: %s", type(err).__name__)

    @staticmethod
    def _model(model: type[_Message], data: dict[str, Any], *, endpoint: str) -> _Message:
        try:
            return model.model_validate(data)
        except ValidationError as err:
            # `from None`: pydantic's error quotes the message, item payload included; the
            # fields and problems are named here without their values.
            kind = str(data.get("type"))[:40]
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(message)'}: {e['msg']}"
                                 for e in err.errors(include_input=False, include_url=False)[:5])
            raise ProtocolViolationError(f"malformed {kind!r} message on the work socket ({problems})",
                                         endpoint=endpoint) from None
