"""A Priostack job-worker server in memory, behaving as the worker documentation says.

What it reproduces, because the client must cope with each: the body is read before
the key is checked (400 ``invalid json`` beats 401); activation answers at once and
takes activated jobs out of the waiting queue for good (no lock expiry: only a
complete, a fail or a server restart, ``POST /_admin/restart``, brings them back);
``retries`` on fail is stored as sent, and 0 or an omitted value raises an incident;
complete and fail answer 204 with an empty body and 404 when repeated (never 409);
actions other than complete and fail answer 404 ``unknown action``; and
``createdAt`` is Go's zero time, as in the documents' examples.

Choices where the documents are silent:

- A missing, zero or negative ``maxJobsToActivate`` hands out nothing (a Go server
  decodes a missing int as 0); a non-integer is a decoding error, 400 ``invalid json``.
- Empty bodies: activation, fail and registration need a JSON object (400 otherwise);
  complete, heartbeat and unknown actions accept an empty body.
- Only *active* jobs can be completed or failed; anything else, including a job of
  another key's instance, is 404 ``job not found``.
- The key is taken from ``X-API-Key``, else ``Authorization: Bearer``, else
  ``?api_key=``; the first one present must be valid.
- Worker registration (``/workers/register``, ``/workers/{id}/heartbeat``,
  ``/workers``) is stored and listed but never consulted; the answer echoes the
  caller's key as the documents' ``api_key`` field does.
- ``overdeliver`` (a quirk, off by default) answers more jobs than asked for, so the
  client's handling of a server that ignores ``maxJobsToActivate`` can be tested.
- The ``foreign_delivery`` fault on ``activate`` ignores the ``type`` asked for in that
  one activation: jobs of every type are handed out, as the documents say happens
  without ``type``.
- ``numeric_keys`` turns job, instance and definition keys into JSON numbers in
  activation answers only (for bad-input tests).
- ``sequential_keys`` (off by default) takes job and instance keys from counters that
  start over with the server, as a development server's do: after ``/_admin/reset`` (a
  re-created server) the new jobs get the keys the last ones had.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from ._server import DroppedResponse, Sandbox, corrupt, json_error, lenient_json
from ._validation import validate_body

__all__ = ["PriostackSandbox", "PriostackSandboxConfig", "SeedBody", "SeedJob"]

Handler = Callable[[Request], Awaitable[Response]]
GO_ZERO_TIME = "0001-01-01T00:00:00Z"
# Where a development server's key counter starts (the number has the size of real keys).
_FIRST_SEQUENTIAL_KEY = 2251799813685249


class PriostackSandboxConfig(BaseModel):
    api_keys: list[str] = Field(default_factory=lambda: ["sandbox-api-key"])
    numeric_keys: bool = False        # quirk: answer keys as JSON numbers on activation
    api_prefix: str = "/api/v1"
    default_retries: int = 3
    deadline_ms: int = Field(default=300_000, ge=0)  # informational deadline after activation
    zero_created_at: bool = True      # createdAt as Go's zero time, like the documents
    overdeliver: int = Field(default=0, ge=0)  # quirk: hand out this many jobs beyond the maximum
    sequential_keys: bool = False     # keys from counters that a reset starts over (a dev server's)


class SeedJob(BaseModel):
    """One process instance whose first service task is ``type`` (then each of ``then``)."""

    model_config = ConfigDict(extra="forbid")

    type: str = Field(min_length=1)
    variables: dict[str, Any] = Field(default_factory=dict)
    retries: int | None = None
    count: int = Field(default=1, ge=1, le=10_000)
    then: list[str] = Field(default_factory=list)
    api_key: str | None = None                                  # owner; default the first key
    wire_overrides: dict[str, Any] = Field(default_factory=dict)  # replace fields when activated
    # The job's key (one job: count 1), e.g. ".." or a hostile lone surrogate "\ud800"; default
    # generated. A plain str: a length constraint would make pydantic refuse the surrogate.
    key: str | None = None

    @model_validator(mode="after")
    def _one_job_per_key(self) -> SeedJob:
        if self.key is not None and (self.count != 1 or self.then or not self.key):
            raise ValueError("a seeded key names one job: non-empty, count 1 and no then")
        return self


class SeedBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    jobs: list[SeedJob]


class _Answer(Exception):
    """Short-circuits a handler with a ready response (400, 401, 404)."""

    def __init__(self, response: Response) -> None:
        self.response = response


def _invalid_json() -> _Answer:
    return _Answer(json_error(400, "invalid json"))


def _now_ms() -> int:
    return int(time.time() * 1000)


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _numeric(key: str) -> int:
    return int(key.removeprefix("run_"), 16)


@dataclass
class _Instance:
    key: str
    definition_key: str
    owner: str
    variables: dict[str, Any]
    pending: list[str]
    retries: int
    state: str = "ACTIVE"          # ACTIVE | COMPLETED | INCIDENT
    created_at: float = field(default_factory=time.time)
    job_keys: list[str] = field(default_factory=list)


@dataclass
class _Job:
    key: str
    type: str
    instance: _Instance
    retries: int
    input_variables: dict[str, Any]
    wire_overrides: dict[str, Any]
    state: str = "waiting"          # waiting | active | completed | incident
    created_at: float = field(default_factory=time.time)
    error_message: str | None = None
    retries_history: list[int] = field(default_factory=list)
    activations: list[dict[str, Any]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    restarts: list[float] = field(default_factory=list)
    incident: dict[str, Any] | None = None


class PriostackSandbox(Sandbox):
    """In-memory Priostack engine with one service task per step of each instance."""

    name: ClassVar[str] = "priostack"
    config_model: ClassVar[type[BaseModel]] = PriostackSandboxConfig
    config: PriostackSandboxConfig

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        self.reset()

    def reset(self) -> None:
        self._jobs: dict[str, _Job] = {}
        self._instances: dict[str, _Instance] = {}
        self._waiting: dict[str, None] = {}  # insertion-ordered queue of activatable job keys
        self._incidents: list[dict[str, Any]] = []
        self._workers: dict[str, dict[str, Any]] = {}
        self._keys = itertools.count(_FIRST_SEQUENTIAL_KEY)  # sequential_keys: the server's key counter

    def _new_key(self, prefix: str = "") -> str:
        """A fresh job or instance key: random, or the next of the counter (``sequential_keys``)."""
        if self.config.sequential_keys:
            return f"{prefix}{next(self._keys):x}"
        return f"{prefix}{secrets.token_hex(10)}"

    # -- admin ------------------------------------------------------------------------
    def seed(self, body: Any) -> list[str]:
        """``{"jobs": [{"type", "variables", "retries", "count", "then"}]}`` -> job keys."""
        request = validate_body(SeedBody, body)
        created: list[str] = []
        for spec in request.jobs:
            owner = spec.api_key or self.config.api_keys[0]
            retries = spec.retries if spec.retries is not None else self.config.default_retries
            for _ in range(spec.count):
                instance = _Instance(
                    key=self._new_key("run_"),
                    definition_key=hashlib.sha1(spec.type.encode()).hexdigest()[:20],
                    owner=owner, variables=dict(spec.variables), pending=list(spec.then), retries=retries)
                self._instances[instance.key] = instance
                created.append(self._create_job(instance, spec.type, spec.wire_overrides, key=spec.key).key)
        return created

    def jobs(self) -> list[dict[str, Any]]:
        return [self._describe(job) for job in self._jobs.values()]

    def restart(self) -> dict[str, Any]:
        """A server restart (seed 002: a job stays active until completed, failed, cancelled
        "or the server restarts"): every active job goes back to waiting, and a complete or
        fail for that activation answers 404 until the job is activated again."""
        now = time.time()
        requeued = []
        for job in self._jobs.values():
            if job.state == "active":
                job.state = "waiting"
                job.restarts.append(now)
                self._waiting[job.key] = None
                requeued.append(job.key)
        return {"requeued": requeued}

    # -- protocol routes -------------------------------------------------------------
    def protocol_routes(self) -> list[BaseRoute]:
        p = "/" + self.config.api_prefix.strip("/") if self.config.api_prefix.strip("/") else ""
        return [
            self._route(f"{p}/jobs/activate", "activate", self._activate, ["POST"]),
            # {key:id}: a key may hold a "/" (sent as %2F; see _server._EncodedSlashes).
            self._route(f"{p}/jobs/{{key:id}}/complete", "complete", self._complete, ["POST"]),
            self._route(f"{p}/jobs/{{key:id}}/fail", "fail", self._fail, ["POST"]),
            self._route(f"{p}/jobs/{{key}}/{{action:path}}", "jobs.unknown-action", self._unknown_action,
                        ["GET", "POST", "PUT", "PATCH", "DELETE"]),
            self._route(f"{p}/process-instances/{{key}}", "process-instances.get", self._get_instance,
                        ["GET"]),
            self._route(f"{p}/incidents", "incidents.list", self._list_incidents, ["GET"]),
            self._route(f"{p}/workers/register", "workers.register", self._register, ["POST"]),
            self._route(f"{p}/workers/{{key}}/heartbeat", "workers.heartbeat", self._heartbeat, ["POST"]),
            self._route(f"{p}/workers", "workers.list", self._list_workers, ["GET"]),
        ]

    def _route(self, path: str, label: str, fn: Handler, methods: list[str]) -> Route:
        """Record every call (body and answer, injected faults included), then run ``fn``."""

        async def inner(request: Request) -> Response:
            try:
                response = await fn(request)
            except _Answer as answer:
                response = answer.response
            request.state.record["status"] = response.status_code
            return response

        wrapped = self.endpoint(label, inner)

        async def recorded(request: Request) -> Response:
            raw = await request.body()  # cached: handlers read it again
            record: dict[str, Any] = {"at": time.time(), "label": label, "body": _history_body(raw),
                                      "status": None, "applied": False}
            request.state.record = record
            response = await wrapped(request)
            if isinstance(response, DroppedResponse):
                record["dropped"] = True
            elif record["status"] is None:  # a generic fault answered before the handler ran
                record["status"] = response.status_code
            job = self._jobs.get(request.path_params.get("key", ""))
            if job is not None and label in ("complete", "fail"):
                job.calls.append({"action": label, **record})
            return response

        return Route(path, recorded, methods=methods)

    async def _activate(self, request: Request) -> Response:
        body = await self._body(request, empty_ok=False)
        owner = self._owner(request)
        job_type = body.get("type") or body.get("jobType")
        maximum = body.get("maxJobsToActivate", 0)
        if job_type is not None and not isinstance(job_type, str):
            raise _invalid_json()
        if maximum is None:
            maximum = 0
        if not isinstance(maximum, int) or isinstance(maximum, bool):
            raise _invalid_json()

        if job_type and any(self._jobs[key].type != job_type for key in self._waiting) and \
                self.faults.fire("foreign_delivery", "activate"):
            job_type = None  # this activation ignores the type it was asked for

        def matches(job: _Job) -> bool:
            return job.instance.owner == owner and (not job_type or job.type == job_type)

        now = time.time()
        handed: list[_Job] = []
        for key in list(self._waiting):
            if len(handed) >= maximum + (self.config.overdeliver if maximum > 0 else 0):
                break
            job = self._jobs[key]
            if matches(job):
                del self._waiting[key]
                job.state = "active"
                job.activations.append({"at": now, "duplicate": False})
                handed.append(job)
        if len(handed) < maximum:
            taken = {job.key for job in handed}
            held = [job for job in self._jobs.values()
                    if job.state == "active" and matches(job) and job.key not in taken]
            if held and self.faults.fire("duplicate_delivery", "activate"):
                held[0].activations.append({"at": now, "duplicate": True})
                handed.append(held[0])
        return lenient_json({"jobs": [self._wire(job, now) for job in handed]})

    async def _complete(self, request: Request) -> Response:
        body = await self._body(request, empty_ok=True)
        owner = self._owner(request)
        variables = body.get("variables")
        if variables is not None and not isinstance(variables, dict):
            raise _invalid_json()
        job = self._active_job(request, owner)
        job.state = "completed"
        request.state.record["applied"] = True
        job.instance.variables.update(variables or {})
        self._advance(job.instance)
        return Response(status_code=204)

    async def _fail(self, request: Request) -> Response:
        body = await self._body(request, empty_ok=False)
        owner = self._owner(request)
        retries = body.get("retries")
        message = body.get("errorMessage")
        if retries is not None and (not isinstance(retries, int) or isinstance(retries, bool)):
            raise _invalid_json()
        if message is not None and not isinstance(message, str):
            raise _invalid_json()
        job = self._active_job(request, owner)
        request.state.record["applied"] = True
        job.retries = retries if retries is not None else 0  # stored as sent, never decremented
        job.retries_history.append(job.retries)
        job.error_message = message
        if job.retries > 0:
            job.state = "waiting"
            self._waiting[job.key] = None
        else:
            job.state = "incident"
            job.instance.state = "INCIDENT"
            job.incident = {
                "id": f"inc_{secrets.token_hex(10)}",
                "key": job.key,
                "jobKey": job.key,
                "processInstanceKey": job.instance.key,
                "type": job.type,
                "error_code": "JOB_FAILED",
                "error_message": message or "",
                "state": "ACTIVE",
                "created_at": _iso(time.time()),
            }
            self._incidents.append(job.incident)
        return Response(status_code=204)

    async def _unknown_action(self, request: Request) -> Response:
        await self._body(request, empty_ok=True)
        self._owner(request)
        return json_error(404, "unknown action")

    async def _get_instance(self, request: Request) -> Response:
        owner = self._owner(request)
        instance = self._instances.get(request.path_params["key"])
        if instance is None or instance.owner != owner:
            return json_error(404, "not found")
        return JSONResponse(self._instance_view(instance))

    async def _list_incidents(self, request: Request) -> Response:
        owner = self._owner(request)
        items = [i for i in self._incidents if self._instances[i["processInstanceKey"]].owner == owner]
        return JSONResponse({"items": items, "total": len(items)})

    async def _register(self, request: Request) -> Response:
        body = await self._body(request, empty_ok=False)
        owner = self._owner(request)
        topics = body.get("topics", [])
        group = body.get("group_name")
        if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
            raise _invalid_json()
        if group is not None and not isinstance(group, str):
            raise _invalid_json()
        now = _iso(time.time())
        worker: dict[str, Any] = {"id": f"wkr-{secrets.token_hex(16)}", "api_key": owner, "topics": topics,
                  "last_heartbeat": now, "registered_at": now, "active": True, "group_name": group}
        self._workers[worker["id"]] = worker
        return JSONResponse(worker, status_code=201)

    async def _heartbeat(self, request: Request) -> Response:
        await self._body(request, empty_ok=True)
        owner = self._owner(request)
        worker = self._workers.get(request.path_params["key"])
        if worker is None or worker["api_key"] != owner:
            return json_error(404, "worker not found")
        worker["last_heartbeat"] = _iso(time.time())
        return JSONResponse({"status": "ok", "worker_id": worker["id"]})

    async def _list_workers(self, request: Request) -> Response:
        owner = self._owner(request)
        items = [w for w in self._workers.values() if w["api_key"] == owner]
        return JSONResponse({"items": items, "total": len(items)})

    # -- helpers ------------------------------------------------------------------------
    async def _body(self, request: Request, *, empty_ok: bool) -> dict[str, Any]:
        """Read the JSON object body; this happens before the key is checked."""
        raw = await request.body()
        if not raw.strip():
            if empty_ok:
                return {}
            raise _invalid_json()
        try:
            data = json.loads(raw)
        except ValueError:
            raise _invalid_json() from None
        if not isinstance(data, dict):
            raise _invalid_json()
        return data

    def _owner(self, request: Request) -> str:
        """The caller's key: X-API-Key, else Bearer, else ?api_key=; 401 when not valid."""
        key = request.headers.get("x-api-key")
        if key is None:
            auth = request.headers.get("authorization", "")
            if auth[:7].lower() == "bearer ":
                key = auth[7:].strip()
        if key is None:
            key = request.query_params.get("api_key")
        if key is None or key not in self.config.api_keys:
            raise _Answer(json_error(401, "unauthorized"))
        return key

    def _active_job(self, request: Request, owner: str) -> _Job:
        job = self._jobs.get(request.path_params["key"])
        if job is None or job.state != "active" or job.instance.owner != owner:
            raise _Answer(json_error(404, "job not found"))
        return job

    def _create_job(self, instance: _Instance, job_type: str,
                    overrides: dict[str, Any] | None = None, *, key: str | None = None) -> _Job:
        if key is not None and key in self._jobs:
            raise ValueError(f"job key {key!r} is taken")
        job = _Job(key=key or self._new_key(), type=job_type, instance=instance, retries=instance.retries,
                   input_variables=dict(instance.variables), wire_overrides=dict(overrides or {}))
        job.retries_history.append(job.retries)
        self._jobs[job.key] = job
        instance.job_keys.append(job.key)
        self._waiting[job.key] = None
        return job

    def _advance(self, instance: _Instance) -> None:
        """The token moves on: the next service task's job, or the end of the instance."""
        if instance.pending:
            self._create_job(instance, instance.pending.pop(0))
        else:
            instance.state = "COMPLETED"

    def _wire(self, job: _Job, now: float) -> dict[str, Any]:
        numeric = self.config.numeric_keys
        answer: dict[str, Any] = {
            "key": _numeric(job.key) if numeric else job.key,
            "type": job.type,
            "processInstanceKey": _numeric(job.instance.key) if numeric else job.instance.key,
            "processDefinitionKey": (_numeric(job.instance.definition_key) if numeric
                                     else job.instance.definition_key),
            "variables": dict(job.instance.variables),
            "retries": job.retries,
            "deadline": int(now * 1000) + self.config.deadline_ms,
            "createdAt": GO_ZERO_TIME if self.config.zero_created_at else _iso(job.created_at),
        }
        answer.update(job.wire_overrides)
        rule = self.faults.fire("corrupt_delivery", "activate")
        return corrupt(answer, rule) if rule is not None else answer

    def _instance_view(self, instance: _Instance) -> dict[str, Any]:
        return {"key": instance.key, "processDefinitionKey": instance.definition_key, "state": instance.state,
                "variables": dict(instance.variables), "createdAt": _iso(instance.created_at),
                "jobKeys": list(instance.job_keys)}

    def _describe(self, job: _Job) -> dict[str, Any]:
        return {
            "key": job.key,
            "type": job.type,
            "processInstanceKey": job.instance.key,
            "state": job.state,
            "retries": job.retries,
            "retries_history": list(job.retries_history),
            "error_message": job.error_message,
            "variables": dict(job.input_variables),
            "activations": list(job.activations),
            "calls": list(job.calls),
            "restarts": list(job.restarts),
            "incident": job.incident,
            "instance": {"state": job.instance.state, "variables": dict(job.instance.variables)},
            "created_at": job.created_at,
        }


def _history_body(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw[:1000].decode("utf-8", "replace")
