"""``serverless-worker doctor``: is this worker set up to work, checked without taking work.

Each check is one line (``ok`` / ``FAIL`` and why) so that a setup problem is found
before a deploy, not by a silent poller alarm. In order: the settings, the handler
module, the credential, then the server itself, with a call per protocol that proves it
is reachable and accepts the credential but hands out nothing:

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
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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

__all__ = ["Check", "Doctor", "SMOKE_HANDLER"]

SMOKE_HANDLER = "serverless-worker-smoke"
_NEVER_MATCHES = {"serverless-worker-doctor": "a field no item has"}
_TERMINAL = {"completed", "failed", "cancelled"}
_IDLE_QUEUE_HANDLER = "serverless-worker-doctor"  # a handler no stage names: its queue stays empty
_LONG_POLL_PROBE = 1  # seconds the long-poll probe asks the server to wait (whole seconds)


@dataclass(frozen=True)
class Check:
    """One line of the report."""

    name: str
    passed: bool
    detail: str

    @property
    def verdict(self) -> str:
        """``ok`` or ``FAIL``; the smoke, an end-to-end run, says ``PASS`` as the server's script does."""
        if not self.passed:
            return "FAIL"
        return "PASS" if self.name == "smoke" else "ok"


@dataclass
class Doctor:
    """Runs the checks in order; a failed check stops the ones that depend on it."""

    settings: Settings
    project_root: Path
    client_factory: Callable[[Settings], WorkerProtocol]
    smoke: bool = False
    smoke_handler: str = SMOKE_HANDLER
    smoke_timeout: float = 60.0
    checks: list[Check] = field(default_factory=list)
    handler_names: list[str] = field(default_factory=list)  # what the handlers check found
    release_checks: list[Check] = field(default_factory=list)  # found by the server's probe

    def run(self) -> Iterator[Check]:
        """Yield each check as it completes (so a slow server shows where it is slow)."""
        for step in (self._handlers, self._server, self._release, self._smoke):
            found = step()
            checks = found if isinstance(found, list) else [] if found is None else [found]
            for check in checks:  # a step's findings are all shown, then a failed one stops the rest
                self.checks.append(check)
                yield check
            if not all(check.passed for check in checks):
                return

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    # -- the checks ------------------------------------------------------------------------
    def _handlers(self) -> Check:
        from .handler_module import load_local_handlers

        try:
            registry = load_local_handlers(self.settings.handler_module, self.project_root,
                                           list(self.settings.handlers))
        except ServerlessWorkerError as err:
            return Check("handlers", False, str(err))
        names = self.handler_names = list(self.settings.handlers) or registry.names()
        if not names:
            return Check("handlers", False, f"{self.settings.handler_module} registers no @handler functions")
        return Check("handlers", True, f"{self.settings.handler_module}: {', '.join(names)}")

    def _server(self) -> Check:
        started = time.monotonic()
        try:
            client = self.client_factory(self.settings)
        except ConfigurationError as err:
            return Check("credential", False, str(err))
        try:
            detail = _PROBES[self.settings.protocol](self, client)
        except ProtocolError as err:
            return Check("server", False, _refused(self.settings, err, self.handler_names))
        finally:
            client.close()
        took = (time.monotonic() - started) * 1000
        return Check("server", True, f"{self.settings.base_url} answered in {took:.0f} ms; {detail}")

    def _release(self) -> list[Check]:
        """What the server probe found about the protocol release (Pipelogiq only)."""
        return self.release_checks

    def _smoke(self) -> Check | None:
        if not self.smoke:
            return None
        if self.settings.protocol != "pipelogiq":
            return Check("smoke", False, f"--smoke runs a Pipelogiq pipeline; {self.settings.protocol} has none")
        client = self.client_factory(self.settings)
        try:
            return _pipelogiq_smoke(client, self._identity("smoke", [self.smoke_handler]), self.smoke_handler,
                                    self.smoke_timeout)
        except ProtocolError as err:
            return Check("smoke", False, _refused(self.settings, err, [self.smoke_handler]))
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
        doctor.release_checks = [_lease_check(client), _long_poll_check(client)]
    finally:
        client.shutdown("serverless-worker doctor: check only")
    worker = session.worker_id if session is not None else identity.instance_id
    return f"API key accepted; worker session opened and shut down (worker {worker})"


def _lease_check(client: Any) -> Check:
    """Whether the lease API exists: a call that names no execution can take no lease."""
    status = client.lease_api_status()
    if status == 404:
        return Check("lease", False, "POST /stages/{id}/lease/renew answered 404: this server has no lease API "
                                     "(a Pipelogiq release older than 0.5.0); its deliveries carry no executionId "
                                     "and cannot be worked")
    return Check("lease", True, f"lease API present (a lease call naming no execution answered {status})")


def _long_poll_check(client: Any) -> Check:
    """Whether pull waits: a queue no stage uses, asked to wait, must come back at its deadline."""
    started = time.monotonic()
    taken = client.pull(PullRequest(handler=_IDLE_QUEUE_HANDLER, max_items=1, wait_seconds=_LONG_POLL_PROBE))
    took = time.monotonic() - started
    for delivery in taken:  # someone's stage on that queue after all: back, unrun
        client.hand_back(delivery)
    if not taken and took < _LONG_POLL_PROBE / 2:
        return Check("long-poll", False, f"a pull asked to wait {_LONG_POLL_PROBE:g} s came back empty after "
                                         f"{took:.2f} s: this server ignores waitSeconds (a Pipelogiq release "
                                         "older than 0.5.0)")
    return Check("long-poll", True, f"a pull asked to wait {_LONG_POLL_PROBE:g} s waited {took:.1f} s")


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

def _pipelogiq_smoke(client: Any, identity: WorkerIdentity, handler: str, timeout: float) -> Check:
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


def _smoke_verdict(pipeline_id: int, status: dict[str, Any], runs: dict[str, int], timeout: float) -> Check:
    state = str(status.get("status", "unknown"))
    if state.lower() != "completed":
        why = f"still {state} after {timeout:.0f} s" if state.lower() not in _TERMINAL else f"ended {state}"
        return Check("smoke", False, f"pipeline {pipeline_id} {why} (stage runs {runs or 'none'})")
    if runs.get("first") != 2 or runs.get("second") != 1:
        return Check("smoke", False, f"pipeline {pipeline_id} completed, but the stages ran {runs} times "
                                     "(expected first twice, the retry, and second once)")
    return Check("smoke", True, f"two-stage pipeline {pipeline_id} completed; the first stage was "
                                "retried once")
