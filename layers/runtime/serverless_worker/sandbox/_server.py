"""What every sandbox shares: the ASGI app with its admin API, deterministic fault
injection, per-endpoint call counts, and a runner that serves it on loopback in a
thread (tests) or in the foreground (CLI).

All protocol state lives on the event loop: endpoints are ``async def`` and never
block, so a sandbox needs no locks. Admin routes live under ``/_admin`` so they can
never collide with a protocol's own paths.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import random
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import unquote

import uvicorn
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError
from starlette.applications import Starlette
from starlette.convertors import Convertor, register_url_convertor
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ._validation import reject_unknown, validate_body

__all__ = [
    "FaultKind",
    "FaultRule",
    "FaultPlan",
    "FaultInjector",
    "corrupt",
    "Sandbox",
    "SandboxServer",
    "DroppedResponse",
    "json_error",
    "lenient_json",
]

FaultKind = Literal[
    "error_5xx",           # answer 5xx before doing anything
    "rate_limit",          # answer 429 (with Retry-After) before doing anything
    "latency",             # sleep latency_ms, then behave normally
    "drop_response",       # apply the effect, then cut the connection mid-response
    "duplicate_delivery",  # deliver the same execution again (protocol-specific)
    "expire_session",      # expire the worker session now (protocol-specific)
    "restart_before",      # the server restarts just before this call arrives (Sandbox.restart)
    "restart_after",       # the server applies the call, restarts, and the answer is lost
    "corrupt_delivery",    # one delivery's ``field`` replaced by ``value`` (removed when null); see corrupt()
    "echo_request",        # answer `status` with an error text echoing the request (headers, query,
                           # body) and carrying control characters: ESC, CR LF, NUL, C1 CSI
    "deep_answer",         # apply the effect, then answer 200 with JSON nested DEEP_ANSWER_LEVELS deep
    "expired_lease",       # grant a lease already past its expiry (protocol-specific)
    # An empty pull is answered at once, whatever wait it asked for: a server without a long
    # poll (Pipelogiq answers 204 with no body, as its older release does). Priostack's
    # activate and the claim queue's claim answer at once anyway, as their documents say.
    "ignore_wait",
    "naive_lease_time",    # a granted lease's leaseExpiresAt without a time zone (Pipelogiq)
    # Hand out work the worker did not ask for, once per firing: Priostack activates jobs of
    # every type (the type filter ignored), Pipelogiq delivers a stage of another handler's
    # queue, the claim queue hands out the oldest pending item whatever the criteria.
    "foreign_delivery",
]

# What an "echo_request" error text ends with: a terminal escape, a forged log line, a NUL
# and a C1 control, none of which may reach a worker's log or state raw.
ECHO_CONTROLS = "\x1b[2J\r\nX-Injected: yes\x00\x9b31m"

# How deep a ``deep_answer`` nests: far past any JSON decoder's recursion limit.
DEEP_ANSWER_LEVELS = 100_000


# A header value a test may choose freely: printable ASCII, so it can be sent as-is.
HeaderText = Annotated[str, StringConstraints(pattern=r"^[\x20-\x7e]*$", max_length=256)]


class FaultRule(BaseModel):
    """One fault: which endpoint label (``*`` for all), how likely, how many times."""

    model_config = ConfigDict(extra="forbid")  # a misspelt "probabilty" must not mean "always"

    kind: FaultKind
    endpoint: str = "*"
    probability: float = Field(default=1.0, ge=0.0, le=1.0)
    count: int | None = Field(default=None, ge=0)  # fire at most this many times
    status: int = 503
    latency_ms: int = Field(default=0, ge=0)
    # The 429's Retry-After: seconds, or the header's text as sent (an HTTP date, "inf",
    # "nan", "-5", "999999999"), to play a server that sends any of them.
    retry_after: float | HeaderText | None = None
    # corrupt_delivery: the dotted path of the field to corrupt in one delivery as sent
    # (``payload.executionId``, ``key``, ``id``) and its new value (None: removed).
    field: str | None = None
    value: Any = None


def corrupt(answer: dict[str, Any], rule: FaultRule) -> dict[str, Any]:
    """A copy of one delivery's wire form with ``rule.field`` replaced or removed, as a
    server with a broken or older message format would send it; ``answer`` is untouched."""
    copied = copy.deepcopy(answer)
    *parents, last = (rule.field or "").split(".")
    target: Any = copied
    for name in parents:
        target = target.get(name) if isinstance(target, dict) else None
    if isinstance(target, dict) and last:
        if rule.value is None:
            target.pop(last, None)
        else:
            target[last] = rule.value
    return copied


class FaultPlan(BaseModel):
    """A set of rules drawn deterministically from ``seed``."""

    model_config = ConfigDict(extra="forbid")

    seed: int = 0
    rules: list[FaultRule] = Field(default_factory=list)


class FaultInjector:
    """Decides which faults fire, reproducibly: the same seed and call order give the same faults."""

    def __init__(self) -> None:
        self.plan = FaultPlan()
        self._rng = random.Random(0)
        self._fired: Counter[int] = Counter()
        self.log: list[dict[str, Any]] = []

    def set(self, plan: FaultPlan) -> None:
        self.plan = plan
        self._rng = random.Random(plan.seed)
        self._fired.clear()
        self.log.clear()

    def stop(self) -> None:
        """No fault fires from now on; the log of what fired stays, so a run that switches its
        faults off before it reads the log (to let the last work settle) still sees them."""
        self.plan = FaultPlan()

    def fire(self, kind: str, endpoint: str) -> FaultRule | None:
        """Return the first rule of ``kind`` that fires for ``endpoint`` now, recording it."""
        for index, rule in enumerate(self.plan.rules):
            if rule.kind != kind or rule.endpoint not in ("*", endpoint):
                continue
            if rule.count is not None and self._fired[index] >= rule.count:
                continue
            if rule.probability < 1.0 and self._rng.random() >= rule.probability:
                continue
            self._fired[index] += 1
            self.log.append({"at": time.time(), "kind": kind, "endpoint": endpoint})
            return rule
        return None


def lenient_json(content: Any, status_code: int = 200) -> Response:
    """JSON as a server with UTF-16 strings sends it: a lone surrogate (a job key seeded as
    ``"\\ud800"``) goes out as its ``\\u`` escape, where UTF-8 text has no form for it."""
    try:
        return JSONResponse(content, status_code=status_code)
    except UnicodeEncodeError:
        return Response(json.dumps(content, separators=(",", ":")).encode("ascii"), status_code=status_code,
                        media_type="application/json")


class _ResponseDropped(Exception):
    """Raised inside the ASGI app to make the server cut the connection."""


class DroppedResponse(Response):
    """Sends the status line and half the body, then aborts: the client sees an
    unknown outcome although the effect was applied."""

    def __init__(self) -> None:
        super().__init__(content=b'{"dropped":' + b" " * 64 + b"}", media_type="application/json")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self.body[:8], "more_body": True})
        raise _ResponseDropped()


class _QuietDrops(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, _ResponseDropped)


logging.getLogger("uvicorn.error").addFilter(_QuietDrops())


def json_error(status: int, error: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": error, **extra}, status_code=status)


async def _echo_request(request: Request, status: int) -> Response:
    """A careless server's error: the request it got, credentials and all, quoted back
    (credential headers first, as a server logging "who asked" would)."""
    credentials = ("authorization", "x-api-key", "x-worker-session")
    pairs = sorted(request.headers.items(), key=lambda pair: pair[0] not in credentials)
    headers = "; ".join(f"{name}: {value}" for name, value in pairs)
    body = (await request.body()).decode("utf-8", "replace")
    return json_error(status, f"cannot handle {request.method} {request.url.path}{ECHO_CONTROLS} "
                              f"query {request.url.query} headers {headers} body {body}")


Endpoint = Callable[[Request], Awaitable[Response]]


class Sandbox(ABC):
    """Base of the three emulators. Subclasses provide protocol routes, seeding and history."""

    name: ClassVar[str]
    config_model: ClassVar[type[BaseModel]]

    def __init__(self, **config: Any) -> None:
        self.config = self.config_model(**config)
        self.faults = FaultInjector()
        self.calls: Counter[str] = Counter()
        # Calls whose effect has been applied (after any injected latency): what a test waits
        # on to know a delayed call has run, instead of sleeping past it.
        self.handled: Counter[str] = Counter()
        self.restarts: list[dict[str, Any]] = []  # each restart: when, why (admin or a fault), what was lost

    # -- to implement -------------------------------------------------------------
    @abstractmethod
    def protocol_routes(self) -> list[BaseRoute]:
        """Routes of the protocol itself; wrap handlers with :meth:`endpoint`."""

    @abstractmethod
    def seed(self, body: Any) -> Any:
        """Create jobs from an admin request body; return what was created (ids)."""

    @abstractmethod
    def jobs(self) -> list[dict[str, Any]]:
        """Every job with its full history (attempts, leases, results, fenced, ignored)."""

    def reset(self) -> None:
        """Forget all jobs and sessions (keeps config and faults)."""

    def restart(self) -> dict[str, Any]:
        """The server process restarts: lose what it held in memory only, as the protocol's
        documents say (each sandbox overrides this); returns what was lost."""
        return {}

    def _restart(self, cause: str) -> dict[str, Any]:
        lost = self.restart()
        self.restarts.append({"at": time.time(), "cause": cause, **lost})
        return lost

    def periodic(self) -> list[tuple[float, Callable[[], None]]]:
        """(interval seconds, function) pairs run on the event loop, e.g. expiry sweeps."""
        return []

    def extra_routes(self) -> list[BaseRoute]:
        """Non-HTTP routes (the claim queue's WebSocket)."""
        return []

    # -- shared machinery ---------------------------------------------------------
    def endpoint(self, label: str, fn: Endpoint) -> Endpoint:
        """Wrap a protocol handler with call counting and the generic faults."""

        async def wrapped(request: Request) -> Response:
            self.calls[label] += 1
            rule = self.faults.fire("latency", label)
            if rule:
                await asyncio.sleep(rule.latency_ms / 1000)
            rule = self.faults.fire("error_5xx", label)
            if rule:
                return json_error(rule.status, "injected server error")
            rule = self.faults.fire("rate_limit", label)
            if rule:
                headers = {"Retry-After": str(rule.retry_after)} if rule.retry_after is not None else None
                return JSONResponse({"error": "rate limited"}, status_code=429, headers=headers)
            rule = self.faults.fire("echo_request", label)
            if rule:
                return await _echo_request(request, rule.status)
            if self.faults.fire("restart_before", label):
                self._restart(f"restart_before@{label}")
            response = await fn(request)
            self.handled[label] += 1
            if self.faults.fire("restart_after", label):
                self._restart(f"restart_after@{label}")
                return DroppedResponse()
            if self.faults.fire("drop_response", label):
                return DroppedResponse()
            if self.faults.fire("deep_answer", label):
                return Response(b"[" * DEEP_ANSWER_LEVELS + b"]" * DEEP_ANSWER_LEVELS, media_type="application/json")
            return response

        return wrapped

    def app(self) -> Starlette:
        async def admin_seed(request: Request) -> Response:
            try:
                body = await request.json()
                return lenient_json({"created": self.seed(body)}, status_code=201)
            except (ValueError, ValidationError) as err:
                return json_error(400, f"bad seed: {err}")

        async def admin_jobs(request: Request) -> Response:
            return lenient_json({"jobs": self.jobs()})

        async def admin_faults(request: Request) -> Response:
            if request.method == "DELETE":
                self.faults.stop()
            elif request.method == "POST":  # GET reads the plan and what fired, unchanged
                try:
                    self.faults.set(validate_body(FaultPlan, await request.json()))
                except (ValueError, ValidationError) as err:
                    return json_error(400, f"bad fault plan: {err}")
            return JSONResponse({"plan": self.faults.plan.model_dump(), "fired": self.faults.log})

        async def admin_config(request: Request) -> Response:
            if request.method == "POST":
                try:
                    changes = await request.json()
                    reject_unknown(self.config_model, changes)
                    self.config = validate_body(self.config_model, {**self.config.model_dump(), **changes})
                except (ValueError, ValidationError) as err:
                    return json_error(400, f"bad config: {err}")
            return JSONResponse(self.config.model_dump())

        async def admin_stats(request: Request) -> Response:
            return JSONResponse({"calls": dict(self.calls), "handled": dict(self.handled),
                                 "faults_fired": len(self.faults.log)})

        async def admin_restart(request: Request) -> Response:
            return JSONResponse(self._restart("admin"))

        async def admin_restarts(request: Request) -> Response:
            return JSONResponse({"restarts": self.restarts})

        async def admin_reset(request: Request) -> Response:
            self.reset()
            self.calls.clear()
            self.handled.clear()
            self.faults.set(FaultPlan())
            return JSONResponse({"ok": True})

        admin = [
            Route("/_admin/jobs", admin_seed, methods=["POST"]),
            Route("/_admin/jobs", admin_jobs, methods=["GET"]),
            Route("/_admin/faults", admin_faults, methods=["GET", "POST", "DELETE"]),
            Route("/_admin/config", admin_config, methods=["GET", "POST"]),
            Route("/_admin/stats", admin_stats, methods=["GET"]),
            Route("/_admin/reset", admin_reset, methods=["POST"]),
            Route("/_admin/restart", admin_restart, methods=["POST"]),
            Route("/_admin/restarts", admin_restarts, methods=["GET"]),
        ]

        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette):  # type: ignore[no-untyped-def]
            tasks = [asyncio.create_task(self._every(interval, fn)) for interval, fn in self.periodic()]
            try:
                yield
            finally:
                for task in tasks:
                    task.cancel()

        return Starlette(routes=admin + self.protocol_routes() + self.extra_routes(), lifespan=lifespan,
                         middleware=[Middleware(_EncodedSlashes)])

    @staticmethod
    async def _every(interval: float, fn: Callable[[], None]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                fn()
            except Exception:  # a sweep must never die silently and stop sweeping
                logging.getLogger("serverless_worker.sandbox").exception("periodic task failed")


# An id segment: "{key:id}" in a route. A "/" inside an id arrives encoded (%2F), which the
# server decodes before routing; _EncodedSlashes hides it as this private-use character
# until the route has matched, and the convertor gives it back.
_SLASH = "\ue000"


class _IdConvertor(Convertor[str]):
    regex = "[^/]+"

    def convert(self, value: str) -> str:
        return value.replace(_SLASH, "/")

    def to_string(self, value: str) -> str:
        return value.replace("/", _SLASH)


register_url_convertor("id", _IdConvertor())


class _EncodedSlashes:
    """Route on the path as sent: a segment holding ``%2F`` stays one segment (ids such as
    ``a/b``), where uvicorn's decoded ``path`` would make it two."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("raw_path")
        if scope["type"] in ("http", "websocket") and raw and b"%2f" in raw.lower():
            segments = raw.split(b"?", 1)[0].decode("ascii", "replace").split("/")
            scope = {**scope, "path": "/".join(unquote(segment).replace("/", _SLASH) for segment in segments)}
        await self.app(scope, receive, send)


class SandboxServer:
    """Serves a sandbox on loopback: ``start()`` in a thread for tests, ``run()`` for the CLI.

    >>> with SandboxServer(PipelogiqSandbox()) as server:
    ...     requests.get(server.url + "/_admin/jobs")
    """

    def __init__(self, sandbox: Sandbox, host: str = "127.0.0.1", port: int = 0) -> None:
        self.sandbox = sandbox
        self.host = host
        # proto=IPPROTO_TCP so asyncio sets TCP_NODELAY on accepted connections (it checks
        # the proto); with 0, Nagle plus delayed ACK adds ~40 ms to every keep-alive call.
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.port = self._sock.getsockname()[1]
        config = uvicorn.Config(sandbox.app(), log_level="warning", access_log=False,
                                lifespan="on", ws="websockets-sansio", timeout_keep_alive=30,
                                backlog=2048)
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> SandboxServer:
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name=f"sandbox-{self.sandbox.name}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"{self.sandbox.name} sandbox did not start")
            time.sleep(0.01)
        return self

    def run(self) -> None:
        """Serve in the foreground until interrupted."""
        self._server.run(sockets=[self._sock])

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread:
            self._thread.join(timeout=10)
        self._sock.close()

    def __enter__(self) -> SandboxServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
