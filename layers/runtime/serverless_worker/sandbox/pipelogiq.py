"""An in-memory emulator of the Pipelogiq 0.5.0 custom HTTP worker API.

It checks exactly the credential the document's table names per endpoint, long-polls
pull, hands out opaque delivery tokens with a visibility timeout, fences executions
with leases and refusal reasons, applies results asynchronously (a 202 is only
"queued"), retries stages per their options, and records every step per stage so
tests can read the whole history through the admin API.

Choices where the document is silent:

- A session whose worker differs from the body's ``workerId`` gets ``403`` (the
  credential is valid, but not for that worker).
- ``result`` with a key and a session of different applications gets ``403``.
- A result is fenced, i.e. recorded and ignored, when its execution is not the
  stage's current one, already has a result, never held a lease, or its stage or
  pipeline is no longer active.
- Lease recovery (a new execution attempt after an expired lease) does not use up
  ``maxRetries``: it is not a handler failure. It runs ``lease_recovery_delay``
  seconds after expiry; in between, acquire and renew answer ``lease_expired``.
- ``isWaitingForApproval`` only parks a successful result; context updates and
  appended stages (added at the end of the pipeline) apply with any applied result.

``legacy=True`` emulates the older public server release instead (docs/protocols.md,
"Older Pipelogiq servers"): pull ignores ``waitSeconds`` and answers an empty queue with
``204`` at once; deliveries are ``{token, queue, messageId, payload, headers}`` whose
payload has no ``executionId`` or ``attempt``; there is no lease or result endpoint
(``404``); ack ``{token, requeue}`` answers ``200 {"status":"ok"}`` or ``404`` as before.
- The ``expired_lease`` fault on ``lease.acquire`` grants the lease already past
  (``leaseExpiresAt`` a second ago); lease recovery then takes it as any expired lease.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from ._server import Sandbox, corrupt, json_error
from ._validation import validate_body

__all__ = ["PipelogiqSandbox", "PipelogiqSandboxConfig", "SeedBody"]

WORKER_STATES = frozenset({"starting", "ready", "degraded", "draining", "stopped", "error", "offline"})
TERMINAL_ERROR_CODES = frozenset({"BUSINESS_REJECTED", "VALIDATION_ERROR"})
ACTIVE_STAGE = frozenset({"Pending", "Running"})
TERMINAL_PIPELINE = frozenset({"Completed", "Failed", "Cancelled"})
STAGE_NEXT_PATTERN = "{appId}_{handler}_StageNext"


class PipelogiqSandboxConfig(BaseModel):
    """Every timing is overridable so tests run in seconds."""

    api_keys: dict[str, int] = Field(default_factory=lambda: {"sandbox-api-key": 12})
    session_ttl_seconds: float = 86400
    announce_session_expiry: bool = False  # add sessionExpiresAt to bootstrap (not in the document)
    heartbeat_interval: float = 15
    offline_after: float = 45
    lease_seconds: float = 60
    lease_recovery_delay: float = 0.0
    visibility_timeout: float = 60
    sweep_interval: float = 0.1
    result_apply_delay: float = 0.02
    retry_interval_scale: float = 1.0
    max_in_flight_deliveries: int = 10000
    events_max_batch: int = 200
    poll_interval: float = 0.25
    max_result_bytes: int = 262_144
    max_request_bytes: int = 327_680
    legacy: bool = False  # the older public release: no lease or result API, no long poll
    # A hostile server: appended to every session token bootstrap hands out, e.g.
    # "\r\nX-Injected: yes" (header injection) or "\u0000"; the worker must refuse the token.
    session_token_suffix: str = ""


class SeedOptions(BaseModel):
    """A stage's retry and timeout options, as the pipeline API takes them."""

    model_config = ConfigDict(extra="forbid")

    maxRetries: int = Field(0, ge=0, strict=True)
    retryInterval: int | float = Field(0, ge=0)
    timeoutSeconds: int | float | None = Field(None, gt=0)


class SeedStage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    stageName: str
    stageHandlerName: str = Field(min_length=1)
    input: str = ""
    options: SeedOptions | None = None


class SeedPipeline(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = ""
    stages: list[SeedStage] = Field(min_length=1)
    idempotencyKey: str | None = Field(None, min_length=1)


class SeedRaw(BaseModel):
    """An arbitrary message on a queue, to test how a worker decodes what it did not expect."""

    model_config = ConfigDict(extra="forbid")

    queue: str
    payload: Any = None
    headers: dict[str, Any] = Field(default_factory=dict)


class SeedBody(BaseModel):
    """The admin seed body (see :meth:`PipelogiqSandbox.seed`); unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")

    pipelines: list[SeedPipeline] = Field(default_factory=list)
    handler: str | None = Field(None, min_length=1)
    inputs: list[Any] = Field(default_factory=list)
    options: SeedOptions | None = None
    raw: list[SeedRaw] = Field(default_factory=list)
    applicationId: int | None = None


class _Reject(Exception):
    """Raised by a handler step to answer with an error status."""

    def __init__(self, status: int, error: str) -> None:
        super().__init__(error)
        self.status, self.error = status, error


class _BadRequest(_Reject, ValueError):
    """400; also a ValueError so admin seeding reports it as a bad seed."""

    def __init__(self, error: str) -> None:
        super().__init__(400, error)


@dataclass
class _Session:
    worker_id: str
    app_id: int
    expires_at: float
    replaced: bool = False


@dataclass
class _Worker:
    worker_id: str
    app_id: int
    instance_id: str
    name: str
    token: str
    session_expires_at: float
    info: dict[str, Any] = field(default_factory=dict)
    state: str = "starting"
    bootstraps: int = 1
    heartbeats: int = 0
    last_seen: float = field(default_factory=time.time)
    counters: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    shutdown_reason: str | None = None


@dataclass
class _Lease:
    worker_id: str
    expires_at: float


@dataclass
class _Execution:
    execution_id: str
    attempt: int
    cause: str  # activation | retry | recovery
    status: str = "pending"  # pending|running|succeeded|failed|waiting_for_approval|lease_expired
    lease: _Lease | None = None
    ever_leased: bool = False
    results_pending: int = 0
    result_applied: bool = False


@dataclass
class _Stage:
    stage_id: int
    pipeline_id: int
    index: int
    name: str
    handler: str
    input: str
    options: dict[str, Any]
    status: str = "NotStarted"  # NotStarted|Pending|Running|Retrying|Completed|Failed|WaitingForApproval
    executions: list[_Execution] = field(default_factory=list)
    current: str | None = None  # the execution id allowed to run
    output: str | None = None
    error_code: str | None = None
    failures: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)

    def execution(self, execution_id: str) -> _Execution | None:
        return next((e for e in self.executions if e.execution_id == execution_id), None)


@dataclass
class _Pipeline:
    pipeline_id: int
    app_id: int
    name: str
    idempotency_key: str
    status: str = "Running"  # Running|WaitingForApproval|Completed|Failed
    stage_ids: list[int] = field(default_factory=list)
    context: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class _Message:
    message_id: str
    queue: str
    payload: Any
    headers: dict[str, Any]
    stage_id: int | None = None
    execution_id: str | None = None
    deliveries: int = 0


@dataclass
class _InFlight:
    message: _Message
    deadline: float
    fingerprint: str


def _rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _fingerprint(token: str) -> str:
    """What the history shows instead of a token."""
    return hashlib.sha256(token.encode()).hexdigest()[:12]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class PipelogiqSandbox(Sandbox):
    """The Pipelogiq emulator. All state lives on the event loop; endpoints never block."""

    name: ClassVar[str] = "pipelogiq"
    config_model: ClassVar[type[BaseModel]] = PipelogiqSandboxConfig
    config: PipelogiqSandboxConfig

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        # A fake broker password: HTTP workers must drop it; tests check they do.
        self.broker_secret = f"broker-{secrets.token_hex(8)}"
        self._generation = 0
        self._init_state()

    def _init_state(self) -> None:
        self.sessions: dict[str, _Session] = {}
        self.workers: dict[str, _Worker] = {}
        self.by_instance: dict[tuple[int, str], str] = {}
        self.pipelines: dict[int, _Pipeline] = {}
        self.idempotency: dict[tuple[int, str], int] = {}
        self.stages: dict[int, _Stage] = {}
        self.queues: dict[str, deque[_Message]] = {}
        self.inflight: dict[str, _InFlight] = {}
        self.log: list[dict[str, Any]] = []          # what belongs to no stage
        self.pulls: deque[dict[str, Any]] = deque(maxlen=2000)
        self.requests: deque[dict[str, Any]] = deque(maxlen=5000)
        self._next_pipeline = 1
        self._next_stage = 1001
        self._next_worker = 1

    def reset(self) -> None:
        self._generation += 1  # callbacks scheduled before the reset do nothing
        self._init_state()

    # -- routes ------------------------------------------------------------------------
    def protocol_routes(self) -> list[BaseRoute]:
        def route(path: str, label: str, fn: Callable[[Request], Awaitable[Response]],
                  method: str = "POST") -> Route:
            async def handler(request: Request) -> Response:
                try:
                    return await fn(request)
                except _Reject as reject:
                    return json_error(reject.status, reject.error)

            inner = self.endpoint(label, handler)

            async def recorded(request: Request) -> Response:
                # Before the generic faults, so a retried call shows up even when a fault
                # answered it: tests compare the bytes of every attempt (hashes only).
                raw = await request.body()
                self.requests.append({"at": time.time(), "label": label, "path": request.url.path,
                                      "bytes": len(raw), "bodySha256": hashlib.sha256(raw).hexdigest()[:16]})
                return await inner(request)

            return Route(path, recorded, methods=[method])

        return [
            route("/workers/bootstrap", "bootstrap", self._bootstrap),
            route("/workers/heartbeat", "heartbeat", self._heartbeat),
            route("/workers/events", "events", self._events),
            route("/workers/shutdown", "shutdown", self._shutdown),
            route("/jobs/pull", "pull", self._pull),
            route("/jobs/ack", "ack", self._ack),
            route("/stages/{stage_id:int}/lease/acquire", "lease.acquire", self._lease_acquire),
            route("/stages/{stage_id:int}/lease/renew", "lease.renew", self._lease_renew),
            route("/stages/{stage_id:int}/result", "result", self._result),
            route("/pipelines/idempotent", "pipelines.create", self._create_pipeline),
            route("/pipelines/{pipeline_id:int}", "pipelines.get", self._get_pipeline, "GET"),
        ]

    def extra_routes(self) -> list[BaseRoute]:
        async def overview(request: Request) -> Response:
            return JSONResponse(self.overview())

        async def revoke(request: Request) -> Response:
            try:
                body = json.loads(await request.body() or b"null")
                stage_id = int(body["jobId"])
            except (ValueError, TypeError, KeyError):
                return json_error(400, 'body must be {"jobId": "<stage id>"}')
            return self.revoke_lease(stage_id)

        return [Route("/_admin/pipelogiq", overview, methods=["GET"]),
                Route("/_admin/pipelogiq/revoke", revoke, methods=["POST"])]

    def revoke_lease(self, stage_id: int) -> Response:
        """Expire the live lease of the stage's current execution now, as if its holder had
        stopped renewing: renewals answer ``lease_expired`` (``stale_execution`` once the
        sweep has recovered the stage with a new execution)."""
        stage = self.stages.get(stage_id)
        if stage is None:
            return json_error(404, "stage not found")
        execution = stage.execution(stage.current) if stage.current else None
        if execution is None or execution.lease is None:
            return json_error(409, "the stage's current execution holds no lease")
        execution.lease.expires_at = min(execution.lease.expires_at, time.time())
        self._record(stage.stage_id, "lease_revoked", executionId=execution.execution_id)
        return JSONResponse({"revoked": True, "executionId": execution.execution_id})

    def periodic(self) -> list[tuple[float, Callable[[], None]]]:
        return [(self.config.sweep_interval, self.sweep)]

    # -- credentials ---------------------------------------------------------------------
    def _require_key(self, request: Request) -> int:
        """The application of the API key (``X-API-Key`` or ``Authorization: Bearer``)."""
        key = request.headers.get("X-API-Key")
        if key is None:
            scheme, _, value = request.headers.get("Authorization", "").partition(" ")
            key = value.strip() if scheme.lower() == "bearer" else None
        app_id = self.config.api_keys.get(key) if key else None
        if app_id is None:
            raise _Reject(401, "invalid api key")
        return app_id

    def _require_session(self, request: Request, label: str) -> _Worker:
        """The worker of the session (``X-Worker-Session`` or ``X-Worker-Token``)."""
        token = request.headers.get("X-Worker-Session") or request.headers.get("X-Worker-Token")
        session = self.sessions.get(token) if token else None
        now = time.time()
        if session is not None and not session.replaced and self.faults.fire("expire_session", label):
            session.expires_at = min(session.expires_at, now)
        if session is None:
            raise _Reject(401, "invalid worker session")
        if session.replaced:
            raise _Reject(401, "worker session replaced")
        if session.expires_at <= now:
            raise _Reject(401, "worker session expired")
        return self.workers[session.worker_id]

    @staticmethod
    def _match_worker(worker: _Worker, body: dict[str, Any]) -> None:
        # 403, not 401: the session is valid, just not for the worker the body names.
        if str(body.get("workerId", "")) != worker.worker_id:
            raise _Reject(403, "workerId does not match the worker session")

    @staticmethod
    async def _body(request: Request) -> dict[str, Any]:
        try:
            body = json.loads(await request.body() or b"null")
        except ValueError:
            raise _BadRequest("request body is not JSON") from None
        if not isinstance(body, dict):
            raise _BadRequest("request body must be a JSON object")
        return body

    # -- workers -------------------------------------------------------------------------
    async def _bootstrap(self, request: Request) -> Response:
        app_id = self._require_key(request)
        body = await self._body(request)
        name = body.get("workerName")
        if not isinstance(name, str) or not name.strip():
            raise _BadRequest("workerName is required")
        instance_id = body.get("instanceId")
        if not isinstance(instance_id, str) or not instance_id:
            instance_id = f"instance-{uuid.uuid4().hex[:12]}"
        now = time.time()
        token = secrets.token_urlsafe(32) + self.config.session_token_suffix
        expires = now + self.config.session_ttl_seconds
        optional = ("workerVersion", "sdkVersion", "environment", "hostName", "pid", "supportedHandlers",
                    "capabilities", "metadata")
        info: dict[str, Any] = {k: body[k] for k in optional if k in body}
        worker_id = self.by_instance.get((app_id, instance_id))
        if worker_id is not None:
            # Same application and instance: the worker record is reused and its
            # previous session token stops working ("worker session replaced").
            worker = self.workers[worker_id]
            old = self.sessions.get(worker.token)
            if old is not None:
                old.replaced = True
            worker.token, worker.session_expires_at = token, expires
            worker.bootstraps += 1
            worker.name, worker.info = name, info
        else:
            worker_id = f"worker-{self._next_worker}"
            self._next_worker += 1
            worker = _Worker(worker_id, app_id, instance_id, name, token, expires, info)
            self.workers[worker_id] = worker
            self.by_instance[(app_id, instance_id)] = worker_id
        worker.last_seen = now
        self.sessions[token] = _Session(worker_id, app_id, expires)
        app = f"app_{app_id}"
        answer: dict[str, Any] = {
            "workerId": worker_id,
            "workerSessionToken": token,
            "configVersion": "1",
            "application": {"applicationId": app_id, "applicationName": f"sandbox-application-{app_id}",
                            "appId": app},
            "messageBroker": {"type": "rabbitmq", "exchange": "pipelogiq",
                              "connectionString": f"amqp://pipelogiq:{self.broker_secret}@127.0.0.1:5672/{app}"},
            "queues": {"stageNextPattern": STAGE_NEXT_PATTERN, "stageResult": f"{app}_StageResult",
                       "workerEvents": f"{app}_WorkerEvents"},
            "heartbeat": {"intervalSec": self.config.heartbeat_interval,
                          "offlineAfterSec": self.config.offline_after},
            "observability": {"dashboardUrl": f"http://localhost:8080/applications/{app_id}/workers/{worker_id}",
                              "tracing": {"enabled": False}},
        }
        if self.config.announce_session_expiry:
            answer["sessionExpiresAt"] = _rfc3339(expires)
        return JSONResponse(answer)

    async def _heartbeat(self, request: Request) -> Response:
        worker = self._require_session(request, "heartbeat")
        body = await self._body(request)
        self._match_worker(worker, body)
        state = body.get("state")
        if isinstance(state, str) and state in WORKER_STATES:  # omitted/unknown keeps the previous one
            worker.state = state
        for name in ("inFlightJobs", "jobsProcessed", "jobsFailed", "uptimeSeconds", "cpuPercent",
                     "memoryBytes", "brokerConnected"):
            if name in body:
                worker.counters[name] = body[name]
        worker.heartbeats += 1
        worker.last_seen = time.time()
        return JSONResponse({"status": "ok"})

    async def _events(self, request: Request) -> Response:
        worker = self._require_session(request, "events")
        body = await self._body(request)
        self._match_worker(worker, body)
        events = body.get("events")
        if not isinstance(events, list) or not events:
            raise _BadRequest("events must be a nonempty list")
        if len(events) > self.config.events_max_batch:
            raise _BadRequest(f"at most {self.config.events_max_batch} events per request")
        for event in events:
            if not (isinstance(event, dict) and isinstance(event.get("eventType"), str)
                    and isinstance(event.get("message"), str)
                    and isinstance(event.get("level", "INFO"), str)):
                raise _BadRequest("each event needs string level, eventType and message")
        now = time.time()
        worker.events.extend({**event, "receivedAt": now} for event in events)
        worker.last_seen = now
        return JSONResponse({"status": "ok", "accepted": len(events)})

    async def _shutdown(self, request: Request) -> Response:
        worker = self._require_session(request, "shutdown")
        body = await self._body(request)
        self._match_worker(worker, body)
        worker.state = "stopped"
        reason = body.get("reason")
        worker.shutdown_reason = reason if isinstance(reason, str) else ""
        return JSONResponse({"status": "ok"})

    # -- pull and ack ---------------------------------------------------------------------
    async def _pull(self, request: Request) -> Response:
        app_id = self._require_key(request)  # pull checks the key only, never a session
        body = await self._body(request)
        queue, wait = body.get("queue"), body.get("waitSeconds", 0)
        if not isinstance(queue, str) or not queue:
            raise _BadRequest("queue is required")
        if self.config.legacy:
            wait = 0  # the older release reads no waitSeconds: an empty queue answers 204 at once
        elif not _is_int(wait) or not 0 <= wait <= 20:
            raise _BadRequest("waitSeconds must be an integer from 0 to 20")
        if not (queue.startswith(f"app_{app_id}_") and queue.endswith("_StageNext")):
            raise _Reject(403, "queue does not belong to this application")
        if len(self.inflight) >= self.config.max_in_flight_deliveries:
            self.pulls.append({"queue": queue, "waitSeconds": wait, "status": 429})
            raise _Reject(429, "in-flight delivery limit reached")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            pending = self._foreign(app_id, queue) or self.queues.get(queue)
            if pending:
                self.pulls.append({"queue": queue, "waitSeconds": wait, "status": 200})
                return self._deliver(pending.popleft())
            remaining = deadline - loop.time()
            if remaining <= 0 or self.faults.fire("ignore_wait", "pull"):
                self.pulls.append({"queue": queue, "waitSeconds": wait, "status": 204})
                return Response(status_code=204)
            await asyncio.sleep(min(self.config.poll_interval, remaining))

    def _foreign(self, app_id: int, queue: str) -> deque[_Message] | None:
        """Another handler's pending stages of the same application, when the
        ``foreign_delivery`` fault fires: this pull hands out one of them instead."""
        others = [pending for name, pending in self.queues.items()
                  if pending and name != queue and name.startswith(f"app_{app_id}_")]
        if others and self.faults.fire("foreign_delivery", "pull"):
            return others[0]
        return None

    def _deliver(self, message: _Message) -> Response:
        if self.faults.fire("duplicate_delivery", "pull"):
            # The broker hands the same execution out again, under another token.
            self.queues.setdefault(message.queue, deque()).appendleft(message)
        token = secrets.token_urlsafe(24)
        fingerprint = _fingerprint(token)
        self.inflight[token] = _InFlight(message, time.time() + self.config.visibility_timeout, fingerprint)
        message.deliveries += 1
        self._record(message.stage_id, "delivered", executionId=message.execution_id,
                     messageId=message.message_id, tokenFingerprint=fingerprint,
                     deliveryCount=message.deliveries)
        payload = message.payload
        if self.config.legacy and isinstance(payload, dict):
            # The older release's stage message: no execution identity, no attempt.
            payload = {name: value for name, value in payload.items() if name not in ("executionId", "attempt")}
        answer = {"token": token, "queue": message.queue, "messageId": message.message_id, "payload": payload,
                  "headers": {**message.headers, "x-delivery-count": message.deliveries}}
        rule = self.faults.fire("corrupt_delivery", "pull")
        return JSONResponse(corrupt(answer, rule) if rule is not None else answer)

    async def _ack(self, request: Request) -> Response:
        body = await self._body(request)  # ack checks the delivery token and nothing else
        token, requeue = body.get("token"), body.get("requeue", False)
        if not isinstance(token, str) or not token:
            raise _BadRequest("token is required")
        if not isinstance(requeue, bool):
            raise _BadRequest("requeue must be a boolean")
        held = self.inflight.pop(token, None)
        if held is not None and held.deadline <= time.time():
            self._requeue(held, "visibility_requeue")  # the sweep had not got to it yet
            held = None
        if held is None:
            raise _Reject(404, "unknown delivery token")
        if requeue:
            self._requeue(held, "requeue")
        else:
            self._record(held.message.stage_id, "ack", executionId=held.message.execution_id,
                         messageId=held.message.message_id, tokenFingerprint=held.fingerprint)
        return JSONResponse({"status": "ok"})

    def _requeue(self, held: _InFlight, event: str) -> None:
        message = held.message
        self.queues.setdefault(message.queue, deque()).appendleft(message)
        self._record(message.stage_id, event, executionId=message.execution_id,
                     messageId=message.message_id, tokenFingerprint=held.fingerprint)

    # -- leases -------------------------------------------------------------------------------
    async def _lease_acquire(self, request: Request) -> Response:
        return await self._lease(request, "acquire")

    async def _lease_renew(self, request: Request) -> Response:
        return await self._lease(request, "renew")

    async def _lease(self, request: Request, op: str) -> Response:
        self._require_current_release()
        worker = self._require_session(request, f"lease.{op}")
        body = await self._body(request)
        self._match_worker(worker, body)
        execution_id = body.get("executionId")
        if not isinstance(execution_id, str) or not execution_id:
            raise _BadRequest("executionId is required")
        stage = self.stages.get(request.path_params["stage_id"])
        if stage is None:
            raise _Reject(404, "stage not found")
        now = time.time()
        reason = self._lease_refusal(stage, execution_id, worker, op, now)
        if reason is not None:
            self._record(stage.stage_id, "lease_refused", op=op, executionId=execution_id,
                         workerId=worker.worker_id, reason=reason)
            return JSONResponse({"acquired": False, "reason": reason})
        execution = stage.execution(execution_id)
        assert execution is not None
        execution.lease = _Lease(worker.worker_id, now + self.config.lease_seconds)
        if op == "acquire" and self.faults.fire("expired_lease", "lease.acquire"):
            # Granted already past: the sweep's lease recovery takes it as any expired lease.
            execution.lease = _Lease(worker.worker_id, now - 1.0)
        execution.ever_leased = True
        execution.status = "running"
        stage.status = "Running"
        self._record(stage.stage_id, "lease_acquired" if op == "acquire" else "lease_renewed",
                     executionId=execution_id, workerId=worker.worker_id, attempt=execution.attempt,
                     leaseExpiresAt=_rfc3339(execution.lease.expires_at))
        expires_at = _rfc3339(execution.lease.expires_at)
        if self.faults.fire("naive_lease_time", f"lease.{op}"):
            expires_at = expires_at.removesuffix("Z")  # the same instant, its time zone left out
        return JSONResponse({"acquired": True, "executionId": execution_id, "attempt": execution.attempt,
                             "leaseExpiresAt": expires_at})

    def _lease_refusal(self, stage: _Stage, execution_id: str, worker: _Worker, op: str,
                       now: float) -> str | None:
        """The documented refusal reason, checked from the broadest to the narrowest."""
        pipeline = self.pipelines[stage.pipeline_id]
        if pipeline.app_id != worker.app_id:
            return "application_mismatch"
        execution = stage.execution(execution_id)
        if execution is None or stage.current != execution_id:
            return "stale_execution"
        if pipeline.status in TERMINAL_PIPELINE:
            return "pipeline_terminal"
        if stage.status not in ACTIVE_STAGE:
            return "stage_not_active"
        lease = execution.lease
        if op == "acquire":
            if lease is None:
                return None
            # Not reentrant: any live lease, even the caller's own, refuses a new acquire.
            return "lease_held" if lease.expires_at > now else "lease_expired"
        if lease is None or lease.worker_id != worker.worker_id:
            return "lease_not_acquired"
        return "lease_expired" if lease.expires_at <= now else None

    def _require_current_release(self) -> None:
        """The older release has no lease or result route: 404, as for any unknown path."""
        if self.config.legacy:
            raise _Reject(404, "404 page not found")

    # -- results -------------------------------------------------------------------------------
    async def _result(self, request: Request) -> Response:
        self._require_current_release()
        key_app = self._require_key(request)
        worker = self._require_session(request, "result")
        if worker.app_id != key_app:
            raise _Reject(403, "api key and worker session belong to different applications")
        raw = await request.body()
        if len(raw) > self.config.max_request_bytes:
            raise _Reject(413, f"request body exceeds {self.config.max_request_bytes} bytes")
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            raise _BadRequest("request body is not JSON") from None
        if not isinstance(body, dict):
            raise _BadRequest("request body must be a JSON object")
        stage_id = request.path_params["stage_id"]
        record = self._validate_result(body, stage_id)
        record.update(workerId=worker.worker_id, applicationId=key_app,
                      bodySha256=hashlib.sha256(raw).hexdigest()[:16], bodyBytes=len(raw))
        self._record(stage_id if stage_id in self.stages else None, "result_received", **record)
        stage = self.stages.get(stage_id)
        execution = stage.execution(record["executionId"]) if stage else None
        if execution is not None:
            execution.results_pending += 1
        generation = self._generation
        asyncio.get_running_loop().call_later(
            self.config.result_apply_delay,
            lambda: self._apply_result(record, body) if generation == self._generation else None)
        return JSONResponse({"status": "accepted"}, status_code=202)

    def _validate_result(self, body: dict[str, Any], stage_id: int) -> dict[str, Any]:
        if body.get("stageId") != stage_id or not _is_int(body.get("stageId")):
            raise _BadRequest("stageId must match the URL")
        execution_id = body.get("executionId")
        if not isinstance(execution_id, str) or not execution_id:
            raise _BadRequest("executionId must be nonempty")
        attempt = body.get("attempt")
        if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
            raise _BadRequest("attempt must be a positive integer")
        if "pipelineId" in body and not _is_int(body["pipelineId"]):
            raise _BadRequest("pipelineId must be a number")
        is_success = body.get("isSuccess", False)  # omitted decodes as false
        if not isinstance(is_success, bool):
            raise _BadRequest("isSuccess must be a boolean")
        result = body.get("result", "")
        if result is None:
            result = ""
        if not isinstance(result, str):
            raise _BadRequest("result must be a string")
        if len(result.encode()) > self.config.max_result_bytes:
            raise _BadRequest(f"result exceeds {self.config.max_result_bytes} bytes")
        for name, item_check in (("logs", _valid_log), ("context", _valid_context),
                                 ("appendedStages", _valid_stage)):
            items = body.get(name)
            if items is not None and not (isinstance(items, list) and all(map(item_check, items))):
                raise _BadRequest(f"{name} is malformed")
        return {
            "executionId": execution_id,
            "attempt": attempt,
            "pipelineId": body.get("pipelineId"),
            "isSuccess": is_success,
            "isSuccessPresent": "isSuccess" in body,
            "errorCode": body.get("errorCode"),
            "retryable": body.get("retryable"),
            "result": result,
            "isWaitingForApproval": body.get("isWaitingForApproval") is True,
            "fields": sorted(body),
        }

    def _apply_result(self, record: dict[str, Any], body: dict[str, Any]) -> None:
        """What the orchestration worker does later: fence, then change state."""
        stage = self.stages.get(body["stageId"])
        execution_id = record["executionId"]
        if stage is None:
            self._record(None, "result_fenced", executionId=execution_id, reason="unknown_stage")
            return
        execution = stage.execution(execution_id)
        if execution is not None:
            execution.results_pending -= 1
        reason = self._fence_reason(stage, execution, record)
        if reason is not None:
            self._record(stage.stage_id, "result_fenced", executionId=execution_id, reason=reason)
            return
        assert execution is not None
        pipeline = self.pipelines[stage.pipeline_id]
        execution.result_applied = True
        execution.lease = None
        self._apply_context(pipeline, body.get("context") or [])
        appended = self._append_stages(pipeline, body.get("appendedStages") or [])
        self._record(stage.stage_id, "result_applied", executionId=execution_id,
                     isSuccess=record["isSuccess"], appendedStageIds=appended)
        if record["isSuccess"]:
            stage.output = record["result"]
            if record["isWaitingForApproval"]:
                execution.status = "waiting_for_approval"
                stage.status = pipeline.status = "WaitingForApproval"
                return
            execution.status, stage.status = "succeeded", "Completed"
            self._advance(pipeline, stage)
            return
        execution.status = "failed"
        stage.failures += 1
        stage.error_code = record["errorCode"]
        max_retries = int(stage.options.get("maxRetries") or 0)
        retryable = record["retryable"] is True and record["errorCode"] not in TERMINAL_ERROR_CODES
        if retryable and stage.failures <= max_retries:
            stage.status, stage.current = "Retrying", None
            delay = float(stage.options.get("retryInterval") or 0) * self.config.retry_interval_scale
            self._record(stage.stage_id, "retry_scheduled", afterSeconds=delay, failures=stage.failures)
            generation = self._generation
            asyncio.get_running_loop().call_later(
                delay, lambda: self._activate(stage, "retry") if generation == self._generation else None)
            return
        stage.status, pipeline.status = "Failed", "Failed"
        self._record(stage.stage_id, "stage_failed", errorCode=record["errorCode"], failures=stage.failures,
                     retryable=record["retryable"])

    def _fence_reason(self, stage: _Stage, execution: _Execution | None,
                      record: dict[str, Any]) -> str | None:
        pipeline = self.pipelines[stage.pipeline_id]
        if pipeline.app_id != record["applicationId"]:
            return "application_mismatch"
        if execution is None:
            return "unknown_execution"
        if execution.result_applied:
            return "duplicate_result"
        if stage.current != execution.execution_id:
            return "stale_execution"
        if record["pipelineId"] is not None and record["pipelineId"] != pipeline.pipeline_id:
            return "pipeline_mismatch"
        if record["attempt"] != execution.attempt:
            return "attempt_mismatch"
        if pipeline.status in TERMINAL_PIPELINE:
            return "pipeline_terminal"
        if stage.status not in ACTIVE_STAGE:
            return "stage_not_active"
        if not execution.ever_leased:
            return "no_lease"
        return None

    @staticmethod
    def _apply_context(pipeline: _Pipeline, updates: list[dict[str, Any]]) -> None:
        for item in updates:
            if item.get("isDeleted") is True:
                pipeline.context.pop(item["key"], None)
            else:
                pipeline.context[item["key"]] = {
                    "key": item["key"], "value": item.get("value"),
                    "valueType": item.get("valueType") or "string",
                    "isSensitive": bool(item.get("isSensitive"))}

    def _append_stages(self, pipeline: _Pipeline, specs: list[dict[str, Any]]) -> list[int]:
        return [self._new_stage(pipeline, spec).stage_id for spec in specs]

    def _advance(self, pipeline: _Pipeline, stage: _Stage) -> None:
        position = pipeline.stage_ids.index(stage.stage_id)
        if position + 1 < len(pipeline.stage_ids):
            self._activate(self.stages[pipeline.stage_ids[position + 1]], "activation")
        else:
            pipeline.status = "Completed"
            self._record(stage.stage_id, "pipeline_completed", pipelineId=pipeline.pipeline_id)

    # -- pipelines and executions ---------------------------------------------------------------
    def _new_pipeline(self, app_id: int, body: dict[str, Any]) -> tuple[_Pipeline, bool]:
        key = body.get("idempotencyKey")
        if not isinstance(key, str) or not key:
            raise _BadRequest("idempotencyKey is required")
        name = body.get("name", "")
        if not isinstance(name, str):
            raise _BadRequest("name must be a string")
        stages = body.get("stages")
        if not isinstance(stages, list) or not stages or not all(map(_valid_stage, stages)):
            raise _BadRequest("stages must be a nonempty list of "
                              "{stageName, stageHandlerName, input, options}")
        existing = self.idempotency.get((app_id, key))
        if existing is not None:
            return self.pipelines[existing], False
        pipeline = _Pipeline(self._next_pipeline, app_id, name, key)
        self._next_pipeline += 1
        self.pipelines[pipeline.pipeline_id] = pipeline
        self.idempotency[(app_id, key)] = pipeline.pipeline_id
        for spec in stages:
            self._new_stage(pipeline, spec)
        self._activate(self.stages[pipeline.stage_ids[0]], "activation")
        return pipeline, True

    def _new_stage(self, pipeline: _Pipeline, spec: dict[str, Any]) -> _Stage:
        stage = _Stage(self._next_stage, pipeline.pipeline_id, len(pipeline.stage_ids), spec["stageName"],
                       spec["stageHandlerName"], spec.get("input") or "", dict(spec.get("options") or {}))
        self._next_stage += 1
        self.stages[stage.stage_id] = stage
        pipeline.stage_ids.append(stage.stage_id)
        return stage

    def _activate(self, stage: _Stage, cause: str) -> None:
        """Create the stage's next execution and publish it to its queue."""
        pipeline = self.pipelines[stage.pipeline_id]
        if pipeline.status in TERMINAL_PIPELINE:
            return
        execution = _Execution(str(uuid.uuid4()), len(stage.executions) + 1, cause)
        stage.executions.append(execution)
        stage.current, stage.status = execution.execution_id, "Pending"
        position = pipeline.stage_ids.index(stage.stage_id)
        previous = self.stages[pipeline.stage_ids[position - 1]].output if position else None
        trace, span = secrets.token_hex(16), secrets.token_hex(8)
        payload: dict[str, Any] = {
            "stageId": stage.stage_id,
            "pipelineId": pipeline.pipeline_id,
            "executionId": execution.execution_id,
            "attempt": execution.attempt,
            "stageHandlerName": stage.handler,
            "stageName": stage.name,
            "input": stage.input,
            "prevStageOutput": previous or "",
            "context": [dict(item) for item in pipeline.context.values()],
            "idempotencyKey": pipeline.idempotency_key,
            "traceId": trace,
            "spanId": span,
        }
        if "timeoutSeconds" in stage.options:
            payload["timeoutSeconds"] = stage.options["timeoutSeconds"]
        queue = STAGE_NEXT_PATTERN.replace("{appId}", f"app_{pipeline.app_id}").replace(
            "{handler}", stage.handler)
        message = _Message(uuid.uuid4().hex, queue, payload, {"traceparent": f"00-{trace}-{span}-01"},
                           stage.stage_id, execution.execution_id)
        self.queues.setdefault(queue, deque()).append(message)
        self._record(stage.stage_id, "execution_created", executionId=execution.execution_id,
                     attempt=execution.attempt, cause=cause, queue=queue, messageId=message.message_id)

    async def _create_pipeline(self, request: Request) -> Response:
        app_id = self._require_key(request)
        pipeline, created = self._new_pipeline(app_id, await self._body(request))
        return JSONResponse({"pipeline": self._pipeline_view(pipeline)}, status_code=201 if created else 200)

    async def _get_pipeline(self, request: Request) -> Response:
        app_id = self._require_key(request)
        pipeline = self.pipelines.get(request.path_params["pipeline_id"])
        if pipeline is None or pipeline.app_id != app_id:
            raise _Reject(404, "pipeline not found")
        return JSONResponse(self._pipeline_view(pipeline))

    def _pipeline_view(self, pipeline: _Pipeline) -> dict[str, Any]:
        stages = []
        for stage_id in pipeline.stage_ids:
            stage = self.stages[stage_id]
            current = stage.execution(stage.current) if stage.current else None
            stages.append({"id": stage.stage_id, "stageName": stage.name, "stageHandlerName": stage.handler,
                           "status": stage.status, "attempt": len(stage.executions),
                           "executionId": current.execution_id if current else None,
                           "output": stage.output, "errorCode": stage.error_code})
        context = [{**item, "value": "***"} if item["isSensitive"] else item
                   for item in pipeline.context.values()]
        return {"id": pipeline.pipeline_id, "name": pipeline.name, "status": pipeline.status,
                "idempotencyKey": pipeline.idempotency_key, "applicationId": pipeline.app_id,
                "stages": stages, "context": context}

    def restart(self) -> dict[str, Any]:
        """The API process restarts: the delivery tokens it held in memory are gone (an ack
        for one answers 404) and their messages come back after the visibility timeout, as
        the sweep requeues overdue deliveries. Sessions, leases, executions and results
        live in the database and survive."""
        forgotten = len(self.inflight)
        self.inflight = {f"forgotten-{secrets.token_hex(12)}": held for held in self.inflight.values()}
        for held in self.inflight.values():
            self._record(held.message.stage_id, "restart_forgot_token", executionId=held.message.execution_id,
                         messageId=held.message.message_id, tokenFingerprint=held.fingerprint)
        return {"forgotten_tokens": forgotten}

    # -- sweeps ------------------------------------------------------------------------------------
    def sweep(self) -> None:
        """Requeue overdue deliveries; recover executions whose lease expired."""
        now = time.time()
        for token, held in list(self.inflight.items()):
            if held.deadline <= now:
                del self.inflight[token]
                self._requeue(held, "visibility_requeue")
        for stage in list(self.stages.values()):
            execution = stage.execution(stage.current) if stage.current else None
            if (execution is None or execution.lease is None or execution.results_pending
                    or execution.result_applied or stage.status != "Running"
                    or self.pipelines[stage.pipeline_id].status in TERMINAL_PIPELINE):
                continue
            if execution.lease.expires_at + self.config.lease_recovery_delay <= now:
                execution.status, execution.lease = "lease_expired", None
                self._record(stage.stage_id, "lease_recovered", executionId=execution.execution_id)
                self._activate(stage, "recovery")

    # -- admin -------------------------------------------------------------------------------------
    def seed(self, body: Any) -> Any:
        """``{"pipelines": [{name, stages}]}``, ``{"handler", "inputs", "options"}`` (one
        single-stage pipeline per input, JSON-encoded) and/or ``{"raw": [{queue, payload}]}``
        (arbitrary messages, to test decoding). Optional ``applicationId``."""
        request = validate_body(SeedBody, body)
        app_id = (request.applicationId if request.applicationId is not None
                  else next(iter(self.config.api_keys.values())))
        specs: list[dict[str, Any]] = [p.model_dump(exclude_unset=True, exclude_none=True)
                                             for p in request.pipelines]
        if request.handler is not None:
            options = request.options.model_dump(exclude_unset=True) if request.options else {}
            for index, value in enumerate(request.inputs):
                specs.append({"name": f"{request.handler}-{index + 1}", "stages": [{
                    "stageName": request.handler, "stageHandlerName": request.handler,
                    "input": json.dumps(value), "options": options}]})
        pipeline_ids: list[int] = []
        job_ids: list[str] = []
        for spec in specs:
            pipeline, _ = self._new_pipeline(app_id, {"idempotencyKey": uuid.uuid4().hex, **spec})
            pipeline_ids.append(pipeline.pipeline_id)
            job_ids.extend(str(s) for s in pipeline.stage_ids)
        messages: list[str] = []
        for raw in request.raw:
            message = _Message(uuid.uuid4().hex, raw.queue, raw.payload, raw.headers)
            self.queues.setdefault(message.queue, deque()).append(message)
            messages.append(message.message_id)
        return {"pipelineIds": pipeline_ids, "jobIds": job_ids, "messageIds": messages}

    def jobs(self) -> list[dict[str, Any]]:
        """Every stage as a job, with executions, leases and its full history."""
        jobs = []
        for stage in self.stages.values():
            pipeline = self.pipelines[stage.pipeline_id]
            current = stage.execution(stage.current) if stage.current else None
            jobs.append({
                "job_id": str(stage.stage_id),
                "protocol": self.name,
                "handler": stage.handler,
                "status": stage.status,
                "stageName": stage.name,
                "pipelineId": pipeline.pipeline_id,
                "pipelineStatus": pipeline.status,
                "applicationId": pipeline.app_id,
                "input": stage.input,
                "output": stage.output,
                "errorCode": stage.error_code,
                "attempt": current.attempt if current else len(stage.executions),
                "failures": stage.failures,
                "options": stage.options,
                "executions": [{
                    "executionId": e.execution_id, "attempt": e.attempt, "cause": e.cause, "status": e.status,
                    "lease": ({"workerId": e.lease.worker_id, "expiresAt": _rfc3339(e.lease.expires_at)}
                              if e.lease else None),
                    "current": e.execution_id == stage.current, "resultApplied": e.result_applied,
                } for e in stage.executions],
                "history": list(stage.history),
            })
        return jobs

    def overview(self) -> dict[str, Any]:
        """Workers (never their tokens), pulls, queue depths and what belongs to no stage."""
        now = time.time()
        workers = [{
            "workerId": w.worker_id, "applicationId": w.app_id, "instanceId": w.instance_id,
            "workerName": w.name, "state": w.state, "bootstraps": w.bootstraps, "heartbeats": w.heartbeats,
            "offline": now - w.last_seen > self.config.offline_after, "counters": w.counters,
            "events": w.events, "shutdownReason": w.shutdown_reason, "info": w.info,
            "sessionExpiresAt": _rfc3339(w.session_expires_at), "sessionFingerprint": _fingerprint(w.token),
        } for w in self.workers.values()]
        return {"workers": workers, "pulls": list(self.pulls), "log": list(self.log),
                "requests": list(self.requests),
                "queues": {name: len(q) for name, q in self.queues.items()}, "inFlight": len(self.inflight)}

    def _record(self, stage_id: int | None, event: str, **detail: Any) -> None:
        entry = {"at": time.time(), "event": event, **detail}
        stage = self.stages.get(stage_id) if stage_id is not None else None
        if stage is not None:
            stage.history.append(entry)
        else:
            self.log.append(entry)


def _valid_log(item: Any) -> bool:
    return (isinstance(item, dict) and isinstance(item.get("message"), str)
            and isinstance(item.get("logLevel", "INFO"), str) and isinstance(item.get("created"), str))


def _valid_context(item: Any) -> bool:
    if not isinstance(item, dict) or not isinstance(item.get("key"), str) or not item["key"]:
        return False
    if item.get("isDeleted") is True:
        return True
    return item.get("value") is None or isinstance(item.get("value"), str)


def _valid_stage(item: Any) -> bool:
    if not isinstance(item, dict):
        return False
    options = item.get("options")
    return (isinstance(item.get("stageName"), str) and isinstance(item.get("stageHandlerName"), str)
            and bool(item["stageHandlerName"]) and isinstance(item.get("input", ""), str)
            and (options is None or (isinstance(options, dict) and _valid_options(options))))


def _valid_options(options: dict[str, Any]) -> bool:
    retries, interval = options.get("maxRetries", 0), options.get("retryInterval", 0)
    return (_is_int(retries) and retries >= 0 and isinstance(interval, int | float)
            and not isinstance(interval, bool) and interval >= 0)
