"""A claim queue ("task" service) in memory, behaving as its worker documentation says.

What it reproduces: a claim hands out the *oldest* pending item matching the criteria,
leased exclusively for the queue's lease seconds, and counts an attempt; a lapsed lease
re-queues the item (in creation order); only the last progress value is kept and
progress on a terminal item is ignored; a result is accepted whenever the item is not
terminal (a late one after a lapse still counts and ends any newer lease), else it is
discarded with ``accepted:false`` and the status; the queue timeout makes an item
terminal ``failed`` with top-level error ``timeout``; the ``work`` socket does claim,
progress and result, and re-queues everything leased to it the moment it closes.

Choices where the document is silent:

- Criteria operators: ``eq ne lt lte gt gte in nin``. A missing field, an unknown
  operator, an operator object with other than one key, an ``in``/``nin`` operand that
  is not a list, and comparisons across types (``"a" < 3``, booleans against numbers)
  never match. Only strings with strings and numbers with numbers are ordered.
- Errors are ``{"ok": false, "error": ...}``: 401 bad token, 400 bad JSON / a progress
  or result body that is not an object / malformed criteria, 404 unknown item. With
  ``known_queues`` set, a claim on another queue gets 404; a queue's ``tokens`` limit
  which tokens may claim from it (403 for the others), over HTTP.
- Progress on a non-terminal item is kept whatever its status (even pending).
- ``GET /<queue>/items/<id>`` (label ``items.get``) reads an item back, as a producer's
  status read would; the client uses it to reconcile retried results.
- Socket messages and acks as in ``protocols/claimqueue_socket``; the token comes from
  the ``Authorization`` header or, as in the document's browser example, ``?token=``.
  Socket faults: ``latency``; ``error_5xx`` closes the socket before acting;
  ``drop_response`` acts, then closes it without an answer; ``rate_limit`` has no
  socket form. Fault labels are the operations' (``claim``, ``progress``, ``result``)
  on both transports.
- ``duplicate_delivery`` on ``claim`` hands out an item already leased to someone, as
  is (same attempt, same lease), when one matches the criteria.
- ``foreign_delivery`` on ``claim`` hands out the oldest pending item of the queue whatever
  the criteria, once per firing (only when an item that fails them is pending).
- ``expired_lease`` on ``claim`` grants the lease already past (``until`` a second ago);
  the item lapses back to pending at the next sweep, as any lapsed lease does.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from ._server import Sandbox, corrupt
from ._validation import validate_body

__all__ = ["ClaimQueueSandbox", "ClaimQueueSandboxConfig", "QueueSettings", "SeedQueue", "matches"]

PENDING, PROCESSING, FINISHED, FAILED = "pending", "processing", "finished", "failed"
TERMINAL = frozenset({FINISHED, FAILED})


class QueueSettings(BaseModel):
    """Per-queue overrides; unset fields inherit the sandbox-wide values."""

    model_config = ConfigDict(extra="forbid")

    lease_seconds: float | None = Field(default=None, gt=0)
    timeout_seconds: float | None = Field(default=None, gt=0)
    no_timeout: bool = False  # this queue never times items out
    # Tokens allowed on this queue (None: every token the server accepts); another valid
    # token gets 403, as a server scoping tokens to queues answers.
    tokens: list[str] | None = None


class ClaimQueueSandboxConfig(BaseModel):
    tokens: list[str] = Field(default_factory=lambda: ["sandbox-token"])
    lease_seconds: float = Field(default=60, gt=0)
    # Queue timeout: an item not finished this long after creation becomes "failed".
    timeout_seconds: float | None = Field(default=3600, gt=0)
    queues: dict[str, QueueSettings] = Field(default_factory=dict)
    # The queues that exist (None: any name is a queue); a claim on another gets 404,
    # as a server with provisioned queues answers a misspelt name.
    known_queues: list[str] | None = None
    sweep_interval: float = Field(default=0.1, gt=0)
    # Item ids from a counter that a reset starts over (a queue on a re-created database):
    # the new items get the ids the last ones had.
    sequential_ids: bool = False


class SeedQueue(BaseModel):
    """``{"queue": "resize", "items": [{...}, ...]}``: items are created oldest first."""

    model_config = ConfigDict(extra="forbid")

    queue: str = Field(min_length=1)
    items: list[dict[str, Any]]
    ids: list[str] | None = None  # each item's id (e.g. ".." or "a/b"), else random ones

    @model_validator(mode="after")
    def _an_id_per_item(self) -> SeedQueue:
        if self.ids is not None and (len(self.ids) != len(self.items) or not all(self.ids)):
            raise ValueError("ids must give one nonempty id per item")
        return self


# -- criteria --------------------------------------------------------------------------

def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _equal(a: Any, b: Any) -> bool:
    """JSON equality: ``true`` is not ``1``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if _is_number(a) and _is_number(b):
        return bool(a == b)
    return type(a) is type(b) and bool(a == b)


def _ordered(a: Any, b: Any) -> bool:
    return (_is_number(a) and _is_number(b)) or (isinstance(a, str) and isinstance(b, str))


_OPERATORS: dict[str, Any] = {
    "eq": _equal,
    "ne": lambda a, b: not _equal(a, b),
    "lt": lambda a, b: _ordered(a, b) and a < b,
    "lte": lambda a, b: _ordered(a, b) and a <= b,
    "gt": lambda a, b: _ordered(a, b) and a > b,
    "gte": lambda a, b: _ordered(a, b) and a >= b,
    "in": lambda a, b: isinstance(b, list) and any(_equal(a, x) for x in b),
    "nin": lambda a, b: isinstance(b, list) and not any(_equal(a, x) for x in b),
}


def matches(item: Any, criteria: dict[str, Any] | None) -> bool:
    """Whether ``item`` satisfies every criterion; anything unclear fails closed."""
    if not criteria:
        return True
    if not isinstance(item, dict):
        return False
    for name, matcher in criteria.items():
        if name not in item:
            return False
        value = item[name]
        if isinstance(matcher, dict):
            if len(matcher) != 1:
                return False
            ((op, operand),) = matcher.items()
            test = _OPERATORS.get(op)
            if test is None:
                return False
            try:
                if not test(value, operand):
                    return False
            except TypeError:
                return False
        elif not _equal(value, matcher):
            return False
    return True


# -- state -----------------------------------------------------------------------------

@dataclass
class _Item:
    id: str
    queue: str
    item: dict[str, Any]
    created_at: float
    status: str = PENDING
    attempts: int = 0
    lease_worker: str | None = None
    lease_until: float | None = None   # epoch seconds
    lease_socket: int | None = None    # the work socket holding the lease, if any
    progress: Any = None
    result: Any = None
    error: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)

    def lease(self) -> dict[str, Any] | None:
        if self.lease_until is None:
            return None
        return {"worker": self.lease_worker, "until": _ms(self.lease_until)}

    def end_lease(self) -> None:
        self.lease_worker, self.lease_until, self.lease_socket = None, None, None

    def record(self, event: str, **details: Any) -> None:
        self.history.append({"at": time.time(), "event": event, **details})


class _Refused(Exception):
    """A request the queue refuses: status and text for the HTTP answer or socket error."""

    def __init__(self, status: int, error: str) -> None:
        super().__init__(error)
        self.status, self.error = status, error


async def _close_quietly(websocket: WebSocket) -> None:
    """Close a work socket as a restarting server does (1012: service restart)."""
    with contextlib.suppress(RuntimeError, OSError):  # already closing
        await websocket.close(code=1012)


def _ms(at: float) -> int:
    return math.floor(at * 1000)


class ClaimQueueSandbox(Sandbox):
    """The claim queue emulator: HTTP routes, the ``work`` socket, sweeps and history."""

    name: ClassVar[str] = "claimqueue"
    config_model: ClassVar[type[BaseModel]] = ClaimQueueSandboxConfig
    config: ClaimQueueSandboxConfig

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        self._items: dict[str, _Item] = {}  # insertion order is creation order
        self._ids = itertools.count(1)  # sequential_ids: the server's id counter
        self._socket_ids = itertools.count(1)
        self._open_sockets: dict[int, WebSocket] = {}  # closed by a restart

    # -- admin -------------------------------------------------------------------------
    def reset(self) -> None:
        self._items.clear()
        self._ids = itertools.count(1)

    def _new_id(self) -> str:
        """A fresh item id: random, or the next of the counter (``sequential_ids``)."""
        return f"item-{next(self._ids)}" if self.config.sequential_ids else secrets.token_hex(8)

    def seed(self, body: Any) -> list[str]:
        seeds = [validate_body(SeedQueue, one) for one in (body if isinstance(body, list) else [body])]
        created: list[str] = []
        for one in seeds:
            for index, payload in enumerate(one.items):
                item_id = one.ids[index] if one.ids is not None else self._new_id()
                if item_id in self._items:
                    raise ValueError(f"item id {item_id!r} is taken")
                item = _Item(id=item_id, queue=one.queue, item=payload, created_at=time.time())
                item.record("created")
                self._items[item.id] = item
                created.append(item.id)
        return created

    def jobs(self) -> list[dict[str, Any]]:
        self._sweep()
        return [{**self._view(item), "queue": item.queue, "created_at": item.created_at,
                 "history": list(item.history)} for item in self._items.values()]

    def periodic(self) -> list[tuple[float, Callable[[], None]]]:
        return [(self.config.sweep_interval, self._sweep)]

    # -- routes ------------------------------------------------------------------------
    def protocol_routes(self) -> list[BaseRoute]:
        return [
            Route("/{queue:id}/claim", self.endpoint("claim", self._http_claim), methods=["POST"]),
            # {item_id:id}: an id may hold a "/" (sent as %2F; see _server._EncodedSlashes).
            Route("/{queue:id}/items/{item_id:id}/progress", self.endpoint("progress", self._http_progress),
                  methods=["POST"]),
            Route("/{queue:id}/items/{item_id:id}/result", self.endpoint("result", self._http_result),
                  methods=["POST"]),
            Route("/{queue:id}/items/{item_id:id}", self.endpoint("items.get", self._http_get), methods=["GET"]),
        ]

    def extra_routes(self) -> list[BaseRoute]:
        return [WebSocketRoute("/{queue:id}/work", self._work)]

    async def _http_claim(self, request: Request) -> Response:
        try:
            self._authorize(request.headers.get("authorization"))
            self._admit(request.path_params["queue"], request.headers.get("authorization"))
            body = await _read_object(request, empty_ok=True)
            worker, criteria = _claim_args(body)
            answer = self._claim(request.path_params["queue"], worker, criteria, socket=None)
        except _Refused as err:
            return _error(err)
        if answer is None:
            return JSONResponse({"ok": True, "empty": True})
        return JSONResponse({"ok": True, **answer})

    async def _http_progress(self, request: Request) -> Response:
        try:
            self._authorize(request.headers.get("authorization"))
            body = await _read_object(request, empty_ok=False)
            answer = self._progress(request.path_params["queue"], request.path_params["item_id"], body,
                                    via="http")
        except _Refused as err:
            return _error(err)
        return JSONResponse({"ok": True, **answer})

    async def _http_result(self, request: Request) -> Response:
        try:
            self._authorize(request.headers.get("authorization"))
            body = await _read_object(request, empty_ok=False)
            answer = self._result(request.path_params["queue"], request.path_params["item_id"], body,
                                  via="http")
        except _Refused as err:
            return _error(err)
        return JSONResponse({"ok": True, **answer})

    async def _http_get(self, request: Request) -> Response:
        try:
            self._authorize(request.headers.get("authorization"))
            self._sweep()
            item = self._find(request.path_params["queue"], request.path_params["item_id"])
        except _Refused as err:
            return _error(err)
        return JSONResponse({"ok": True, **self._view(item)})

    # -- the work socket ------------------------------------------------------------------
    async def _work(self, websocket: WebSocket) -> None:
        queue = websocket.path_params["queue"]
        presented = websocket.headers.get("authorization")
        if presented is None and "token" in websocket.query_params:
            presented = f"Bearer {websocket.query_params['token']}"
        try:
            self._authorize(presented)
        except _Refused as err:
            await websocket.send_denial_response(_error(err))
            return
        await websocket.accept()
        socket_id = next(self._socket_ids)
        self._open_sockets[socket_id] = websocket
        self.calls["work"] += 1
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                text = message.get("text")
                if text is None:
                    text = (message.get("bytes") or b"").decode("utf-8", "replace")
                reply, drop = await self._socket_message(queue, socket_id, text)
                if drop:
                    await websocket.close(code=1011)
                    break
                await websocket.send_text(json.dumps(reply))
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass  # the client went away mid-answer: handled as a drop below
        finally:
            self._open_sockets.pop(socket_id, None)
            self._requeue_socket(socket_id)

    async def _socket_message(self, queue: str, socket_id: int, text: str) -> tuple[dict[str, Any], bool]:
        """The answer to one socket message, and whether to drop the socket instead."""
        try:
            message = json.loads(text)
        except ValueError:
            return {"type": "error", "error": "invalid json"}, False
        if not isinstance(message, dict) or len(message) != 1 or next(iter(message)) not in (
                "claim", "progress", "result"):
            return {"type": "error", "error": "expected exactly one of claim, progress, result"}, False
        ((op, args),) = message.items()
        self.calls[op] += 1
        rule = self.faults.fire("latency", op)
        if rule:
            await asyncio.sleep(rule.latency_ms / 1000)
        if self.faults.fire("error_5xx", op):
            return {}, True
        item_id = args.get("id") if isinstance(args, dict) else None
        try:
            if op == "claim":
                worker, criteria = _claim_args(args if args is not None else {})
                answer = self._claim(queue, worker, criteria, socket=socket_id)
                reply = {"type": "empty"} if answer is None else {"type": "item", **answer}
            else:
                if not isinstance(args, dict) or not isinstance(item_id, str):
                    raise _Refused(400, f"{op} needs an id")
                value = args.get("value")
                if not isinstance(value, dict):
                    raise _Refused(400, f"{op} value must be a JSON object")
                act = self._progress if op == "progress" else self._result
                reply = {"type": f"{op}-ack", "id": item_id, **act(queue, item_id, value, via="socket")}
        except _Refused as err:
            reply = {"type": "error", "error": err.error, **({"id": item_id} if item_id else {})}
        self.handled[op] += 1
        if self.faults.fire("drop_response", op):
            return {}, True
        return reply, False

    # -- behaviour -----------------------------------------------------------------------
    def _claim(self, queue: str, worker: str | None, criteria: dict[str, Any] | None,
               *, socket: int | None) -> dict[str, Any] | None:
        self._sweep()
        via = "socket" if socket is not None else "http"
        leased = [i for i in self._items.values()
                  if i.queue == queue and i.status == PROCESSING and matches(i.item, criteria)]
        if leased and self.faults.fire("duplicate_delivery", "claim"):
            dup = leased[0]
            dup.record("duplicate_delivery", worker=worker, via=via, lease=dup.lease(), attempt=dup.attempts)
            return self._claim_view(dup)
        if criteria and any(i.queue == queue and i.status == PENDING and not matches(i.item, criteria)
                            for i in self._items.values()) and self.faults.fire("foreign_delivery", "claim"):
            criteria = None  # this claim hands out the oldest pending item, whatever it asked for
        for item in self._items.values():
            if item.queue == queue and item.status == PENDING and matches(item.item, criteria):
                item.status = PROCESSING
                item.attempts += 1
                item.lease_worker = worker
                item.lease_until = time.time() + self._lease_seconds(queue)
                if self.faults.fire("expired_lease", "claim"):
                    item.lease_until = time.time() - 1.0  # granted already past: lapses at the next sweep
                item.lease_socket = socket
                item.record("claim", worker=worker, via=via, attempt=item.attempts, lease=item.lease())
                rule = self.faults.fire("corrupt_delivery", "claim")
                return corrupt(self._claim_view(item), rule) if rule is not None else self._claim_view(item)
        return None

    def _progress(self, queue: str, item_id: str, value: dict[str, Any], *, via: str) -> dict[str, Any]:
        self._sweep()
        item = self._find(queue, item_id)
        if item.status in TERMINAL:
            item.record("progress", value=value, accepted=False, status=item.status, via=via)
            return {"accepted": False, "status": item.status}
        item.progress = value
        item.record("progress", value=value, accepted=True, status=item.status, via=via)
        return {"accepted": True, "status": item.status}

    def _result(self, queue: str, item_id: str, value: dict[str, Any], *, via: str) -> dict[str, Any]:
        self._sweep()
        item = self._find(queue, item_id)
        if item.status in TERMINAL:
            item.record("result", value=value, accepted=False, status=item.status, via=via)
            return {"accepted": False, "status": item.status}
        was, lease = item.status, item.lease()
        item.status, item.result = FINISHED, value
        item.end_lease()
        item.record("result", value=value, accepted=True, status=FINISHED, via=via, item_was=was,
                    lease_ended=lease)
        return {"accepted": True, "status": FINISHED}

    def _sweep(self) -> None:
        """Time out items past the queue timeout, then re-queue lapsed leases."""
        now = time.time()
        for item in self._items.values():
            if item.status in TERMINAL:
                continue
            timeout = self._timeout_seconds(item.queue)
            if timeout is not None and now >= item.created_at + timeout:
                item.status, item.error = FAILED, "timeout"
                item.record("timeout", lease=item.lease())
                item.end_lease()
            elif item.status == PROCESSING and item.lease_until is not None and now >= item.lease_until:
                item.record("lapse", lease=item.lease(), attempt=item.attempts)
                item.status = PENDING
                item.end_lease()

    def restart(self) -> dict[str, Any]:
        """The queue's server restarts: items and their leases persist (a lease still lapses
        at its time), and every work socket is closed. The leases those sockets held are
        kept, not re-queued at once: the server went away, not the worker."""
        detached = 0
        for item in self._items.values():
            if item.lease_socket is not None:
                item.lease_socket = None
                detached += 1
        sockets = list(self._open_sockets.values())
        self._open_sockets.clear()
        self._closing = {asyncio.ensure_future(_close_quietly(websocket)) for websocket in sockets}
        return {"sockets_closed": len(sockets), "leases_kept": detached}

    def _requeue_socket(self, socket_id: int) -> None:
        for item in self._items.values():
            if item.status == PROCESSING and item.lease_socket == socket_id:
                item.record("socket_drop_requeue", lease=item.lease(), attempt=item.attempts)
                item.status = PENDING
                item.end_lease()

    # -- helpers -------------------------------------------------------------------------
    def _authorize(self, header: str | None) -> None:
        scheme, _, presented = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not presented:
            raise _Refused(401, "unauthorized")
        candidate = presented.strip().encode()
        if not any(hmac.compare_digest(candidate, token.encode()) for token in self.config.tokens):
            raise _Refused(401, "unauthorized")

    def _admit(self, queue: str, header: str | None) -> None:
        """404 for a queue that does not exist, 403 for a token not allowed on it."""
        if self.config.known_queues is not None and queue not in self.config.known_queues:
            raise _Refused(404, "no such queue")
        allowed = self._settings(queue).tokens
        presented = (header or "").partition(" ")[2].strip().encode()
        if allowed is not None and not any(hmac.compare_digest(presented, t.encode()) for t in allowed):
            raise _Refused(403, "token not allowed on this queue")

    def _find(self, queue: str, item_id: str) -> _Item:
        item = self._items.get(item_id)
        if item is None or item.queue != queue:
            raise _Refused(404, "no such item")
        return item

    def _settings(self, queue: str) -> QueueSettings:
        return self.config.queues.get(queue) or QueueSettings()

    def _lease_seconds(self, queue: str) -> float:
        return self._settings(queue).lease_seconds or self.config.lease_seconds

    def _timeout_seconds(self, queue: str) -> float | None:
        settings = self._settings(queue)
        if settings.no_timeout:
            return None
        return settings.timeout_seconds or self.config.timeout_seconds

    @staticmethod
    def _claim_view(item: _Item) -> dict[str, Any]:
        return {"id": item.id, "item": item.item, "attempts": item.attempts, "lease": item.lease()}

    @staticmethod
    def _view(item: _Item) -> dict[str, Any]:
        return {"id": item.id, "status": item.status, "attempts": item.attempts, "item": item.item,
                "lease": item.lease(), "progress": item.progress, "result": item.result, "error": item.error}


def _claim_args(body: Any) -> tuple[str | None, dict[str, Any] | None]:
    if not isinstance(body, dict):
        raise _Refused(400, "claim body must be a JSON object")
    worker, criteria = body.get("worker"), body.get("criteria")
    if worker is not None and not isinstance(worker, str):
        raise _Refused(400, "worker must be a string")
    if criteria is not None and not isinstance(criteria, dict):
        raise _Refused(400, "criteria must be an object")
    return worker, criteria


async def _read_object(request: Request, *, empty_ok: bool) -> Any:
    raw = await request.body()
    if not raw.strip():
        if empty_ok:
            return {}
        raise _Refused(400, "body must be a JSON object")
    try:
        body = json.loads(raw)
    except ValueError:
        raise _Refused(400, "invalid json") from None
    if not isinstance(body, dict):
        raise _Refused(400, "body must be a JSON object")
    return body


def _error(err: _Refused) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
    return JSONResponse({"ok": False, "error": err.error}, status_code=err.status, headers=headers)
