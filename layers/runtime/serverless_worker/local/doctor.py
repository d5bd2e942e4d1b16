"""``serverless-worker doctor``: is this worker set up to work, checked without taking work.

Each finding is one line, ``OK``, ``WARN`` (something to act on, though it does not stop
a worker) or ``FAIL``, with its name and why, so that a setup problem is found before a
deploy, not by a silent poller alarm; the list is :attr:`Doctor.findings` (``--json``
prints it as :class:`DoctorReport`). In order: the settings, the handler module, the
credential, then the server itself, with a call per protocol that proves it is reachable
and accepts the credential but hands out nothing:

- Pipelogiq: a worker session (``/workers/bootstrap``, then ``/workers/shutdown``) under
  an instance id of its own, so the real worker's session is not replaced; then whether
  the server is the 0.5.0 release this worker speaks or an older one (docs/protocols.md,
  "Older Pipelogiq servers"), one line per finding: ``lease`` (a lease call that can take
  nothing: an older release has no lease API and answers 404) and ``long-poll`` (a pull
  on a queue no stage uses, asked to wait: an older release answers 204 at once);
- Priostack: the worker list (``GET /workers``);
- claim queue: a claim on each queue with a criterion no item can match (the document
  says a missing field fails closed), which proves the queue exists and the token is
  accepted without leasing anything.

``--smoke`` (Pipelogiq) then does what the server's own smoke script does: it creates a
two-stage pipeline through ``/pipelines/idempotent``, works it with the protocol client
(the first stage fails once, retryably, then succeeds; the second succeeds) and checks
that the pipeline completed with the first stage retried once. It prints PASS or what
failed. The smoke creates a worker record and a test pipeline on the server, as the
script does; it runs only its own stage handler, never the user's handlers.

A warning the runtime logs while the checks run (a handler module that registers nothing,
a ``SW_`` variable that is no setting) becomes a ``WARN`` finding of its own
(:class:`LoggedWarnings`), not a stray log line.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from ..errors import (
    AuthenticationError,
    BadRequestError,
    ConfigurationError,
    ForbiddenError,
    NotFoundError,
    ProtocolError,
    ServerlessWorkerError,
    ServerUnavailableError,
    UnsupportedServerError,
)
from ..model import Delivery, Outcome, OutcomeKind
from ..protocols.base import PullRequest, WorkerIdentity, WorkerProtocol
from ..protocols.transport import display_url
from ..settings import Settings

__all__ = ["SMOKE_HANDLER", "Doctor", "DoctorReport", "Finding", "Level", "LoggedWarnings"]

SMOKE_HANDLER = "serverless-worker-smoke"
_NEVER_MATCHES = {"serverless-worker-doctor": "a field no item has"}
_TERMINAL = {"completed", "failed", "cancelled"}
_IDLE_QUEUE_HANDLER = "serverless-worker-doctor"  # a handler no stage names: its queue stays empty
_LONG_POLL_PROBE = 1  # seconds the long-poll probe asks the server to wait (whole seconds)


Level = Literal["OK", "WARN", "FAIL"]


class Finding(BaseModel):
    """One line of the report: ``OK``; ``WARN``, something to act on that does not stop a
    worker; or ``FAIL``, which does (and stops the checks that depend on it)."""

    model_config = ConfigDict(frozen=True)

    level: Level
    name: str
    text: str

    @property
    def passed(self) -> bool:
        return self.level != "FAIL"


def ok(name: str, text: str) -> Finding:
    return Finding(level="OK", name=name, text=text)


def warn(name: str, text: str) -> Finding:
    return Finding(level="WARN", name=name, text=text)


def fail(name: str, text: str) -> Finding:
    return Finding(level="FAIL", name=name, text=text)


class DoctorReport(BaseModel):
    """What ``doctor --json`` prints: the server checked, whether every check passed, and
    every finding in order."""

    protocol: str
    url: str
    passed: bool
    findings: list[Finding]


# Which finding a logged warning belongs to, by its logger.
_LOGGER_FINDINGS = {"serverless_worker.registry": "handlers", "serverless_worker.settings": "settings"}


class LoggedWarnings(logging.Handler):
    """Warnings logged while the doctor runs, kept to become ``WARN`` findings (one each,
    repeats dropped) instead of log lines beside the report."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self._lock_found = threading.Lock()
        self._found: list[Finding] = []
        self._seen: set[tuple[str, str]] = set()

    def emit(self, record: logging.LogRecord) -> None:
        name = _LOGGER_FINDINGS.get(record.name, record.name.rsplit(".", 1)[-1])
        text = " ".join(record.getMessage().split())
        with self._lock_found:
            if (name, text) not in self._seen:
                self._seen.add((name, text))
                self._found.append(warn(name, text))

    def take(self) -> list[Finding]:
        with self._lock_found:
            found, self._found = self._found, []
        return found


@dataclass
class Doctor:
    """Runs the checks in order; a failed check stops the ones that depend on it."""

    settings: Settings
    project_root: Path
    client_factory: Callable[[Settings], WorkerProtocol]
    smoke: bool = False
    smoke_handler: str = SMOKE_HANDLER
    smoke_timeout: float = 60.0
    logged: LoggedWarnings | None = None  # warnings logged meanwhile, each becomes a WARN finding
    findings: list[Finding] = field(default_factory=list)
    handler_names: list[str] = field(default_factory=list)  # what the handlers check found
    release_findings: list[Finding] = field(default_factory=list)  # found by the server's probe

    def run(self) -> Iterator[Finding]:
        """Yield each finding as its check completes (so a slow server shows where it is slow)."""
        for step in (self._logged, self._handlers, self._server, self._release, self._smoke):
            found = step()
            found = found if isinstance(found, list) else [] if found is None else [found]
            found += self.logged.take() if self.logged is not None else []
            for finding in found:  # a step's findings are all shown, then a failed one stops the rest
                self.findings.append(finding)
                yield finding
            if not all(finding.passed for finding in found):
                return

    @property
    def passed(self) -> bool:
        return bool(self.findings) and all(finding.passed for finding in self.findings)

    def report(self) -> DoctorReport:
        return DoctorReport(protocol=self.settings.protocol, url=display_url(self.settings.base_url),
                            passed=self.passed, findings=list(self.findings))

    # -- the checks ------------------------------------------------------------------------
    def _logged(self) -> list[Finding]:
        """What was logged before the checks began (reading the settings)."""
        return []

    def _handlers(self) -> list[Finding]:
        from .handler_module import demo_handler_names, load_local_handlers

        try:
            registry = load_local_handlers(self.settings.handler_module, self.project_root,
                                           list(self.settings.handlers))
        except ServerlessWorkerError as err:
            return [fail("handlers", str(err))]
        names = self.handler_names = list(self.settings.handlers) or registry.names()
        if not names:
            return [fail("handlers", f"{self.settings.handler_module} registers no @handler functions")]
        found = [ok("handlers", f"{self.settings.handler_module}: {', '.join(names)}")]
        demo = demo_handler_names(registry, names)
        if demo:
            found.append(warn("handlers", f"{', '.join(demo)}: the built-in demo's handlers; `serverless-worker "
                                          "local` runs them against this server only with --demo-handlers (name "
                                          "your own module with --handler-module)"))
        return found

    def _server(self) -> Finding:
        started = time.monotonic()
        try:
            client = self.client_factory(self.settings)
        except ConfigurationError as err:
            return fail("credential", str(err))
        try:
            detail = _PROBES[self.settings.protocol](self, client)
        except ProtocolError as err:
            return fail("server", _refused(self.settings, err, self.handler_names))
        finally:
            client.close()
        took = (time.monotonic() - started) * 1000
        return ok("server", f"{self.settings.base_url} answered in {took:.0f} ms; {detail}")

    def _release(self) -> list[Finding]:
        """What the server probe found about the protocol release (Pipelogiq only)."""
        return self.release_findings

    def _smoke(self) -> Finding | None:
        if not self.smoke:
            return None
        if self.settings.protocol != "pipelogiq":
            return fail("smoke", f"--smoke runs a Pipelogiq pipeline; {self.settings.protocol} has none")
        client = self.client_factory(self.settings)
        try:
            return _pipelogiq_smoke(client, self._identity("smoke", [self.smoke_handler]), self.smoke_handler,
                                    self.smoke_timeout)
        except ProtocolError as err:
            return fail("smoke", _refused(self.settings, err, [self.smoke_handler]))
        finally:
            client.close()

    def _identity(self, purpose: str, handlers: list[str]) -> WorkerIdentity:
        from .. import __version__

        return WorkerIdentity(instance_id=f"{self.settings.instance_id}-{purpose}", handlers=handlers,
                              version=__version__)


def _refused(settings: Settings, err: ProtocolError, handlers: list[str]) -> str:
    """What ``local`` says of the same error on its first contact (first_contact.py): the
    URL, the cause in words and the setting to check; never an exception's class name."""
    from .first_contact import describe_unreachable, refusal

    url = display_url(settings.base_url)
    if isinstance(err, ServerUnavailableError):
        return f"cannot reach the job server at {url} (--url, SW_BASE_URL): {describe_unreachable(err, settings)}"
    if isinstance(err, AuthenticationError | ForbiddenError | BadRequestError | NotFoundError
                  | UnsupportedServerError):
        return str(refusal(settings, type(err), str(err), handlers or list(settings.handlers)))
    return f"the job server at {url}: {err}"


# -- probes: reachable, credential accepted, nothing taken ---------------------------------

def _probe_pipelogiq(doctor: Doctor, client: WorkerProtocol) -> str:
    identity = doctor._identity("doctor", list(doctor.settings.handlers) or [SMOKE_HANDLER])
    session = client.open_session(identity)
    try:
        doctor.release_findings = [_lease_check(client), _long_poll_check(client)]
    finally:
        client.shutdown("serverless-worker doctor: check only")
    worker = session.worker_id if session is not None else identity.instance_id
    return f"API key accepted; worker session opened and shut down (worker {worker})"


def _lease_check(client: Any) -> Finding:
    """Whether the lease API exists: a call that names no execution can take no lease."""
    status = client.lease_api_status()
    if status == 404:
        return fail("lease", "POST /stages/{id}/lease/renew answered 404: this server has no lease API "
                                     "(a Pipelogiq release older than 0.5.0); its deliveries carry no executionId "
                                     "and cannot be worked")
    return ok("lease", f"lease API present (a lease call naming no execution answered {status})")


def _long_poll_check(client: Any) -> Finding:
    """Whether pull waits: a queue no stage uses, asked to wait, must come back at its deadline."""
    started = time.monotonic()
    taken = client.pull(PullRequest(handler=_IDLE_QUEUE_HANDLER, max_items=1, wait_seconds=_LONG_POLL_PROBE))
    took = time.monotonic() - started
    for delivery in taken:  # someone's stage on that queue after all: back, unrun
        client.hand_back(delivery)
    if not taken and took < _LONG_POLL_PROBE / 2:
        return fail("long-poll", f"a pull asked to wait {_LONG_POLL_PROBE:g} s came back empty after "
                                         f"{took:.2f} s: this server ignores waitSeconds (a Pipelogiq release "
                                         "older than 0.5.0)")
    return ok("long-poll", f"a pull asked to wait {_LONG_POLL_PROBE:g} s waited {took:.1f} s")


def _probe_priostack(doctor: Doctor, client: WorkerProtocol) -> str:
    workers = client.list_workers()  # type: ignore[attr-defined]
    return f"API key accepted; {workers.total if workers.total is not None else len(workers.items)} workers registered"


def _probe_claimqueue(doctor: Doctor, client: WorkerProtocol) -> str:
    queues = doctor.handler_names
    for queue in queues:
        taken = client.pull(PullRequest(handler=queue, max_items=1, criteria=_NEVER_MATCHES))
        for delivery in taken:  # a server that ignored the criteria: give the item straight back
            client.hand_back(delivery)
    return f"token accepted; queue{'s' if len(queues) != 1 else ''} {', '.join(queues)} answered a claim"


_PROBES: dict[str, Callable[[Doctor, WorkerProtocol], str]] = {
    "pipelogiq": _probe_pipelogiq,
    "priostack": _probe_priostack,
    "claimqueue": _probe_claimqueue,
}


# -- the Pipelogiq smoke --------------------------------------------------------------------

def _pipelogiq_smoke(client: Any, identity: WorkerIdentity, handler: str, timeout: float) -> Finding:
    """Two stages, the first failing once: what the server's smoke script proves."""
    client.open_session(identity)
    try:
        stages = [
            {"stageName": "first", "stageHandlerName": handler, "input": json.dumps({"stage": 1}),
             "options": {"maxRetries": 1, "retryInterval": 1}},
            {"stageName": "second", "stageHandlerName": handler, "input": json.dumps({"stage": 2}),
             "options": {"maxRetries": 0}},
        ]
        created = client.create_pipeline("serverless-worker-smoke", stages,
                                         idempotency_key=f"serverless-worker-smoke-{uuid.uuid4().hex}")
        pipeline_id = int(created["pipeline"]["id"])
        runs: dict[str, int] = {}
        deadline = time.monotonic() + timeout
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            status = client.pipeline_status(pipeline_id)
            if str(status.get("status", "")).lower() in _TERMINAL:
                break
            for delivery in client.pull(PullRequest(handler=handler, max_items=1, wait_seconds=1)):
                _work_smoke_stage(client, delivery, pipeline_id, runs)
        return _smoke_verdict(pipeline_id, status, runs, timeout)
    finally:
        client.shutdown("serverless-worker doctor --smoke: done")


def _work_smoke_stage(client: Any, delivery: Delivery, pipeline_id: int, runs: dict[str, int]) -> None:
    if delivery.wire.get("pipelineId") != pipeline_id:
        client.hand_back(delivery)  # another smoke's stage (or a real job): untouched, requeued
        return
    client.acquire(delivery)
    stage = str(delivery.wire.get("stageName"))
    runs[stage] = runs.get(stage, 0) + 1
    if stage == "first" and runs[stage] == 1:
        outcome = Outcome(kind=OutcomeKind.FAILURE, error_code="SMOKE_RETRY", message="first try fails on purpose")
    else:
        outcome = Outcome(kind=OutcomeKind.SUCCESS, value={"stage": stage, "run": runs[stage]})
    client.report(delivery, outcome)
    client.acknowledge(delivery)


def _smoke_verdict(pipeline_id: int, status: dict[str, Any], runs: dict[str, int], timeout: float) -> Finding:
    state = str(status.get("status", "unknown"))
    if state.lower() != "completed":
        why = f"still {state} after {timeout:.0f} s" if state.lower() not in _TERMINAL else f"ended {state}"
        return fail("smoke", f"pipeline {pipeline_id} {why} (stage runs {runs or 'none'})")
    if runs.get("first") != 2 or runs.get("second") != 1:
        return fail("smoke", f"pipeline {pipeline_id} completed, but the stages ran {runs} times "
                                     "(expected first twice, the retry, and second once)")
    return ok("smoke", f"PASS: two-stage pipeline {pipeline_id} completed; the first stage was retried once")
