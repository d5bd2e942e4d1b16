"""The Pipelogiq 0.5.0 custom HTTP worker client (docs/protocols.md).

Bootstrap once per session, heartbeat, long-poll ``/jobs/pull``, take the execution
lease before running, renew it while running, post the result, then acknowledge the
delivery token. Each endpoint gets exactly the credential the document's table says it
checks: the API key for bootstrap, pull and pipeline reads; the worker session for
lease, heartbeat, events and shutdown; both for result; nothing but the delivery token
for ack.

>>> with PipelogiqClient("https://pipelogiq.example", api_key) as client:
...     client.open_session(WorkerIdentity(instance_id="fn-1", handlers=["echo"]))
...     for delivery in client.pull(PullRequest(handler="echo", max_items=5, wait_seconds=20)):
...         client.acquire(delivery)
...         client.report(delivery, Outcome(kind=OutcomeKind.SUCCESS, value={"ok": True}))
...         client.acknowledge(delivery)
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar, Unpack

from pydantic import BaseModel, SecretStr, ValidationError
from pydantic_core import to_json

from ..errors import (
    BadRequestError,
    ConfigurationError,
    ForbiddenError,
    InvalidApiKeyError,
    LeaseRefusedError,
    NotFoundAfterRetryError,
    NotFoundError,
    PayloadTooLargeError,
    ProtocolError,
    ProtocolViolationError,
    RateLimitedError,
    ServerUnavailableError,
    SessionExpiredError,
    UnsupportedServerError,
)
from ..logsafety import server_text
from ..model import Delivery, Lease, Outcome, OutcomeKind, ReportReceipt, SessionState
from ._http import HttpResponse, header_safe
from .addressing import UNADDRESSABLE_PER_PULL, AddressTally
from .base import PullRequest, WorkerEvent, WorkerIdentity, WorkerStatus
from .http_client import HttpOptions, HttpProtocolClient
from .pipelogiq_models import (
    MAX_RESULT_BYTES,
    MAX_RESULT_REQUEST_BYTES,
    MAX_WAIT_SECONDS,
    AckBody,
    BootstrapRequest,
    BootstrapResponse,
    CreatePipelineBody,
    EventItem,
    EventsBody,
    HeartbeatRequest,
    LeaseAnswer,
    LeaseBody,
    PipelineCreated,
    PipelineStatus,
    PullBody,
    PullEnvelope,
    ResultContextItem,
    ResultLogItem,
    ResultRequest,
    ShutdownBody,
    StageAddress,
    StagePayload,
    StageSpec,
)

__all__ = ["REFUSAL_ACTIONS", "TERMINAL_ERROR_CODES", "PipelogiqClient"]

log = logging.getLogger("serverless_worker.protocols.pipelogiq")
M = TypeVar("M", bound=BaseModel)
Credential = Literal["key", "session", "both", "token"]

# What the runtime must do for each documented lease refusal reason. An unknown reason
# is left alone: doing nothing is always safe, because server recovery redispatches.
REFUSAL_ACTIONS: Mapping[str, str] = {
    "stale_execution": "discard",
    "stage_not_active": "discard",
    "pipeline_terminal": "discard",
    "lease_held": "discard",
    "lease_not_acquired": "discard",
    "lease_expired": "leave",
    "application_mismatch": "stop",
}

# Error codes the server never retries, whatever ``retryable`` says.
TERMINAL_ERROR_CODES = frozenset({"BUSINESS_REJECTED", "VALIDATION_ERROR"})

# Added to a long poll's wait to get its read timeout: the server answers 204 at the
# deadline, so the client must wait a little longer than it asked the server to.
_LONG_POLL_MARGIN = 5.0

_OK = range(200, 300)


@dataclass(frozen=True)
class _Unaddressable:
    """A delivery that names no stage execution: its token (if any), what it lacks, and
    the decoding error without input values."""

    token: SecretStr | None
    message_id: str
    lacks: str
    reason: str


def _lack(err: ValidationError) -> str:
    """What a payload lacks, in words: ``no executionId`` (preferred: it is what tells an
    older server), ``no stageId``, ``an unusable attempt``."""
    errors = err.errors(include_input=False, include_url=False)
    first = next((e for e in errors if e["loc"][:1] == ("executionId",)), errors[0])
    name = ".".join(map(str, first["loc"])) or "stage address"
    return f"no {name}" if first["type"] == "missing" else f"an unusable {name}"


class _DecodeError(ValueError):
    """A sanitised stand-in for a pydantic ValidationError, which quotes its input (a
    missing field quotes the whole answer, session or delivery token included)."""


def _decode_error(err: ValidationError) -> _DecodeError:
    parts = [f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}"
             for e in err.errors(include_input=False, include_url=False)]
    return _DecodeError("; ".join(parts)[:500])


class PipelogiqClient(HttpProtocolClient):
    """A Pipelogiq HTTP worker over one pooled HTTP session.

    The session (worker id and session token) is adopted by :meth:`open_session` or
    :meth:`use_session`; calls that need it raise ConfigurationError before either.
    """

    name: ClassVar[str] = "pipelogiq"
    needs_session: ClassVar[bool] = True
    has_lease: ClassVar[bool] = True
    lease_renewable: ClassVar[bool] = True
    supports_events: ClassVar[bool] = True
    long_poll: ClassVar[bool] = True  # the server waits up to waitSeconds for work
    # A server that answers an empty pull at once instead (an older release ignores
    # waitSeconds): paced as Priostack's document paces its at-once poll, at most 5 s apart.
    empty_poll_backoff: ClassVar[float] = 5.0
    max_events_per_batch: ClassVar[int] = 200
    # Every execution has its own id (the server's UUID, fenced by the lease's attempt): a
    # settled one delivered again is the broker's duplicate, acknowledged away unrun.
    settled_id_returns_as_new: ClassVar[bool] = False

    credential_label: ClassVar[str] = "Pipelogiq API key"

    def __init__(
        self,
        base_url: str,
        api_key: SecretStr | str,
        *,
        session_ttl_seconds: float = 86400,
        **http: Unpack[HttpOptions],
    ) -> None:
        super().__init__(base_url, api_key, **http)
        if session_ttl_seconds <= 0:
            raise ConfigurationError("session_ttl_seconds must be positive")
        self._session_ttl = session_ttl_seconds
        self._session: SessionState | None = None
        self._tally = AddressTally()
        self._lease_api_missing: bool | None = None  # None: not asked yet (see _lacks_lease_api)
        self._confirmed: SessionState | None = None  # the last session a session-checked call went through with

    def _repr_fields(self) -> Mapping[str, object]:
        return {"worker_id": self._session.worker_id if self._session else None}

    @property
    def session(self) -> SessionState | None:
        return self._session

    # -- session ---------------------------------------------------------------------
    def open_session(self, identity: WorkerIdentity) -> SessionState:
        """Bootstrap and adopt the new session.

        Retried on transient failures: bootstrapping the same instance again reuses the
        worker record and replaces the token, so the answer that arrives is the one in
        force. ``expires_at`` is the server's expiry when it states one, otherwise
        issue time + ``session_ttl_seconds`` (heartbeats never extend a session).
        """
        from .. import __version__  # here: reading the package metadata costs a cold start nothing else needs

        body = BootstrapRequest(
            workerName=identity.worker_name,
            instanceId=identity.instance_id,
            supportedHandlers=list(identity.handlers),
            workerVersion=identity.version,
            sdkVersion=f"serverless-worker/{__version__}",
            environment=identity.environment,
        ).wire()

        def call(_attempt: int) -> tuple[float, BootstrapResponse]:
            issued = _now()
            response = self._transport.request("POST", "/workers/bootstrap", endpoint="bootstrap",
                                          json_body=body, headers=self._key_headers())
            self._raise_for_status(response, credential="key")
            answer = self._decode(response, BootstrapResponse)
            if not header_safe(answer.workerSessionToken.get_secret_value()):
                # Checked as the API key is: a CR LF would let the server's text start headers
                # of its own in every request we send (and a NUL fails the transport).
                raise ProtocolViolationError(
                    "workerSessionToken is empty or holds whitespace or control characters, so it cannot be "
                    "sent as the X-Worker-Session header; refused and never sent", endpoint="bootstrap",
                    status=response.status)
            return issued, answer

        issued, answer = self._retrying(call)
        expires = (answer.sessionExpiresAt.timestamp() if answer.sessionExpiresAt
                   else issued + self._session_ttl)
        state = SessionState(
            worker_id=answer.workerId,
            token=answer.workerSessionToken,
            issued_at=issued,
            expires_at=expires,
            heartbeat_interval=answer.heartbeat.intervalSec,
            offline_after=answer.heartbeat.offlineAfterSec,
            attributes={
                "appId": answer.application.appId,
                "applicationId": answer.application.applicationId,
                "applicationName": answer.application.applicationName,
                "stageNextPattern": answer.stage_next_pattern,
                "configVersion": answer.configVersion,
                "instanceId": identity.instance_id,
            },
        )
        self._session = state
        log.info("pipelogiq worker %s bootstrapped for %s", state.worker_id, answer.application.appId)
        return state

    def use_session(self, session: SessionState | None) -> None:
        self._session = session

    def session_confirmed(self, session: SessionState) -> bool:
        confirmed = self._confirmed
        return confirmed is not None and confirmed.token.get_secret_value() == session.token.get_secret_value()

    def queue_for(self, handler: str) -> str:
        """The stage queue a handler consumes, from the bootstrap's ``stageNextPattern``."""
        session = self._require_session()
        pattern = str(session.attributes.get("stageNextPattern") or "{appId}_{handler}_StageNext")
        return pattern.replace("{appId}", str(session.attributes.get("appId", ""))).replace(
            "{handler}", handler)

    def heartbeat(self, status: WorkerStatus) -> None:
        """One heartbeat. Not retried: the next one follows at the server's interval."""
        body = HeartbeatRequest(
            workerId=self._require_session().worker_id,
            state=status.state,
            inFlightJobs=status.in_flight,
            jobsProcessed=status.processed,
            jobsFailed=status.failed,
            uptimeSeconds=int(status.uptime_seconds) if status.uptime_seconds is not None else None,
        ).wire()
        response = self._transport.request("POST", "/workers/heartbeat", endpoint="heartbeat", json_body=body,
                                      headers=self._session_headers())
        self._raise_for_status(response, credential="session")

    # -- pull --------------------------------------------------------------------------------
    def pull(self, request: PullRequest) -> list[Delivery]:
        """Up to ``max_items`` deliveries: one long poll, then immediate pulls until 204.

        Never retried. A pull whose 200 was lost has already handed a delivery to
        nobody; its visibility timeout returns it to the queue. A blind retry would take
        another one on top, more than the capacity the caller counted. For the same
        reason, an error after some deliveries arrived returns those deliveries (they
        are ours now) and leaves the error to the next pull.

        Deliveries that cannot be addressed are never acknowledged away (see
        :meth:`_settle_unaddressable`) and use no capacity: up to UNADDRESSABLE_PER_PULL
        more are pulled in their place. When no delivery so far could be addressed and
        the lease API is missing, the server is an older release and
        UnsupportedServerError says what it lacks.
        """
        queue = self.queue_for(request.handler)
        wait = int(min(MAX_WAIT_SECONDS, max(0.0, request.wait_seconds)))
        deliveries: list[Delivery] = []
        unaddressable: list[_Unaddressable] = []
        for _ in range(request.max_items + UNADDRESSABLE_PER_PULL):
            if len(deliveries) >= request.max_items:
                break
            body = PullBody(queue=queue, waitSeconds=wait).wire()
            try:
                response = self._transport.request("POST", "/jobs/pull", endpoint="pull", json_body=body,
                                              headers=self._key_headers(),
                                              read_timeout=wait + max(self._read_timeout, _LONG_POLL_MARGIN))
                if response.status == 204:
                    break
                self._raise_for_status(response, credential="key", expected=(200,))
            except RateLimitedError:
                if deliveries or unaddressable:
                    log.info("pipelogiq pull rate limited after %d deliveries; returning them",
                             len(deliveries))
                    break
                raise
            except ProtocolError as err:
                if deliveries or unaddressable:
                    log.warning("pipelogiq pull stopped after %d deliveries: %s", len(deliveries), err)
                    break
                raise
            wait = 0  # only the first call long-polls; the rest take what is already there
            decoded = self._decode_delivery(response, request.handler, queue)
            if isinstance(decoded, Delivery):
                deliveries.append(decoded)
            else:
                unaddressable.append(decoded)
        self._settle_unaddressable(queue, len(deliveries), unaddressable)
        return deliveries

    def _settle_unaddressable(self, queue: str, addressed: int, unaddressable: list[_Unaddressable]) -> None:
        """Deliveries that name no stage execution can be neither leased nor reported, and
        are never acknowledged with ``requeue:false`` (that would drop the job while its
        stage waits for a result). Each is left unacknowledged: the document's visibility
        timeout ("an expiry sweep attempts to requeue overdue deliveries") returns it, paced
        by that timeout, where ``requeue:true`` would hand the same broken message straight
        back to the next pull.

        When no delivery so far could be addressed and the server has no lease API (404,
        asked once), it is an older release: this worker stops pulling
        (UnsupportedServerError) and returns what it took with ``requeue:true``, as the
        document says to return unstarted work, so the jobs are visible again at once.
        """
        lack = self._tally.note(addressed, [item.lacks for item in unaddressable])
        if lack is None or not self._lacks_lease_api():
            for item in unaddressable:  # what is wrong, never the payload
                log.error("pipelogiq delivery %s on %s cannot be addressed (%s); not acknowledged: the "
                          "server's visibility timeout returns it", item.message_id, queue, item.reason)
            return
        returned = sum(1 for item in unaddressable if item.token is not None and self._return_token(item.token))
        raise UnsupportedServerError(
            f"deliveries carry {lack}: this server speaks a Pipelogiq worker protocol older than the lease "
            f"API (its lease endpoint answers 404; {returned} of the {len(unaddressable)} deliveries taken "
            "handed back with requeue:true, none acknowledged away)")

    def _lacks_lease_api(self) -> bool:
        """Whether the server answers 404 to the lease API (asked once per client): what
        tells an older release from a 0.5.0 server that sent a broken message."""
        if self._lease_api_missing is None:
            try:
                status = self.lease_api_status()
            except ProtocolError as err:
                log.warning("pipelogiq lease API probe failed (asked again at the next unaddressable pull): %s",
                            err)
                return False
            self._lease_api_missing = status == 404
        return self._lease_api_missing

    def _return_token(self, token: SecretStr) -> bool:
        """Hand an unaddressable delivery back (``requeue:true``); False when that failed
        (the visibility timeout returns it then)."""
        try:
            self._ack_token(token, requeue=True)
        except ProtocolError as err:
            log.warning("pipelogiq could not hand back an unaddressable delivery: %s", err)
            return False
        return True

    def _decode_delivery(self, response: HttpResponse, handler: str, queue: str) -> Delivery | _Unaddressable:
        """One 200 pull answer to a Delivery, or to what makes it unaddressable.

        Without a token, or without a usable stageId, pipelineId, executionId and
        attempt, nothing can be leased or reported: see :meth:`_settle_unaddressable`.
        With those but an otherwise malformed envelope or payload it still becomes a
        Delivery carrying ``invalid``, so the runtime reports a definite
        VALIDATION_ERROR instead of leaving the stage running with no lease to recover.
        """
        try:
            data = response.json()
        except ProtocolViolationError:
            data = None
        if not isinstance(data, dict):
            data = {}
        message_id = data.get("messageId")
        message_id = str(message_id)[:80] if isinstance(message_id, str | int) else "(no messageId)"
        raw_token = data.get("token")
        if not isinstance(raw_token, str) or not raw_token:
            return _Unaddressable(None, message_id, "no delivery token", "no delivery token")
        token = SecretStr(raw_token)
        invalid: str | None = None
        try:
            envelope = PullEnvelope.model_validate(data)
        except ValidationError as err:
            invalid = f"envelope: {_decode_error(err)}"
            envelope = PullEnvelope(token=token, payload=data.get("payload"))
        payload = envelope.payload
        if isinstance(payload, str | bytes):
            try:
                payload = json.loads(payload)
            except (ValueError, RecursionError):
                payload = None
        if not isinstance(payload, dict):
            return _Unaddressable(token, message_id, "no stage payload (a JSON object)",
                                  "the payload is not a JSON object")
        try:
            address = StageAddress.model_validate(payload)
        except ValidationError as err:
            return _Unaddressable(token, message_id, _lack(err), str(_decode_error(err)))
        try:
            stage = StagePayload.model_validate(payload)
        except ValidationError as err:
            invalid = "; ".join(filter(None, [invalid, str(_decode_error(err))]))
            stage = StagePayload(stageId=address.stageId, pipelineId=address.pipelineId,
                                 executionId=address.executionId, attempt=address.attempt)
        if invalid is not None:
            log.error("pipelogiq job %s has a malformed delivery (%s); it must be reported as "
                      "VALIDATION_ERROR", address.stageId, invalid)
        wire: dict[str, Any] = {
            "pipelineId": stage.pipelineId,
            "stageId": stage.stageId,
            "executionId": stage.executionId,
            "attempt": stage.attempt,
            "queue": envelope.queue or queue,
            "messageId": envelope.messageId,
            "handler": stage.stageHandlerName or handler,
            "stageName": stage.stageName,
            "prevStageOutput": stage.prevStageOutput,
            "context": [item.model_dump(exclude_none=True) for item in stage.context],
            "idempotencyKey": stage.idempotencyKey,
            "traceId": stage.traceId,
            "spanId": stage.spanId,
            "traceparent": stage.traceparent,
            "headers": envelope.headers,
        }
        return Delivery(
            protocol=self.name,
            handler=stage.stageHandlerName or handler,
            job_id=str(stage.stageId),
            # One id per execution: a duplicate delivery of the same execution collides
            # in the ledger's conditional write; a new attempt gets a new execution id.
            ledger_id=f"{stage.stageId}:{stage.executionId}",
            attempt=stage.attempt,
            payload=stage.input,
            timeout_seconds=stage.timeoutSeconds,
            token=token,
            wire=wire,
            invalid=invalid,
        )

    # -- lease -------------------------------------------------------------------------------
    def acquire(self, delivery: Delivery) -> Lease:
        """Take the execution lease; LeaseRefusedError carries the reason and the action.

        Acquire is not reentrant (a second acquire of a leased execution answers
        ``lease_held``, even to the holder), so it is never retried blindly. When the
        outcome is unknown, renew reconciles: it succeeds only if our acquire went
        through. If renew says ``lease_not_acquired`` the first acquire did not take
        effect and one more acquire is safe.
        """
        try:
            return self._lease_call(delivery, "acquire")
        except ServerUnavailableError as err:
            if not err.ambiguous:
                raise
            log.warning("pipelogiq lease acquire for job %s had an unknown outcome; reconciling with renew",
                        delivery.job_id)
        try:
            return self.renew(delivery)
        except LeaseRefusedError as refusal:
            if refusal.reason != "lease_not_acquired":
                raise
        return self._lease_call(delivery, "acquire")

    def renew(self, delivery: Delivery) -> Lease:
        """Extend the lease; retried on transient failures (renewing twice is harmless)."""
        return self._retrying(lambda _attempt: self._lease_call(delivery, "renew"))

    def _lease_call(self, delivery: Delivery, op: Literal["acquire", "renew"]) -> Lease:
        label = f"lease.{op}"
        body = LeaseBody(executionId=_wire_str(delivery, "executionId"),
                         workerId=self._require_session().worker_id).wire()
        response = self._transport.request("POST", f"/stages/{_stage_id(delivery)}/lease/{op}", endpoint=label,
                                      json_body=body, headers=self._session_headers())
        self._raise_for_status(response, credential="session", expected=(200,),
                               subject=f"job {delivery.job_id}")
        answer = self._decode(response, LeaseAnswer)
        if answer.acquired:
            if answer.leaseExpiresAt is None:
                raise ProtocolViolationError(f"job {delivery.job_id}: lease granted without leaseExpiresAt",
                                             endpoint=label, status=response.status)
            if answer.leaseExpiresAt.utcoffset() is None:
                # RFC 3339 needs Z or an offset. Guessing one (UTC, local time) could run the
                # handler past a lease that has already ended on the server: refuse to run.
                sent = response.json().get("leaseExpiresAt")
                raise ProtocolViolationError(
                    f"job {delivery.job_id}: lease granted with leaseExpiresAt "
                    f"{str(sent)[:40]!r} without a time zone (RFC 3339 needs Z or an offset); the "
                    "lease's end is unknown, so the job is not run", endpoint=label, status=response.status)
            return Lease(expires_at=answer.leaseExpiresAt.timestamp(),
                         attempt=answer.attempt if answer.attempt is not None else delivery.attempt,
                         renewable=True)
        reason = server_text(answer.reason or "unknown", (self._secret(),), limit=80)
        raise LeaseRefusedError(reason, action=REFUSAL_ACTIONS.get(reason, "leave"), endpoint=label,
                                job_id=delivery.job_id)

    def lease_api_status(self) -> int:
        """The status of a lease renewal that names no execution: it can take or extend no
        lease, a 0.5.0 server refuses it (400), and an older release, which has no lease
        API, answers 404. For ``serverless-worker doctor``; never retried."""
        body = {"workerId": self._require_session().worker_id}
        response = self._transport.request("POST", "/stages/0/lease/renew", endpoint="lease.renew",
                                           json_body=body, headers=self._session_headers())
        return response.status

    # -- result --------------------------------------------------------------------------------
    def report(self, delivery: Delivery, outcome: Outcome) -> ReportReceipt:
        """Post the result (202), retrying 5xx, 429 and unknown outcomes with the same bytes.

        The size caps are checked before anything is sent. A 202 means the server queued
        the result, not that it applied it: read :meth:`pipeline_status` to verify.
        """
        body = _result_request(delivery, outcome)
        result_size = len(body.result.encode())
        if result_size > MAX_RESULT_BYTES:
            raise PayloadTooLargeError(f"result of job {delivery.job_id}", result_size, MAX_RESULT_BYTES)
        data = json.dumps(body.wire(), separators=(",", ":"), ensure_ascii=False).encode()
        if len(data) > MAX_RESULT_REQUEST_BYTES:
            raise PayloadTooLargeError(f"result request of job {delivery.job_id}", len(data),
                                       MAX_RESULT_REQUEST_BYTES)
        headers = {**self._key_headers(), **self._session_headers(), "Content-Type": "application/json"}
        path = f"/stages/{_stage_id(delivery)}/result"

        def call(attempt: int) -> ReportReceipt:
            response = self._transport.request("POST", path, endpoint="result", data=data, headers=headers)
            self._raise_for_status(response, credential="both", expected=(202,),
                                   subject=f"job {delivery.job_id}")
            return ReportReceipt(accepted=True, status="accepted",
                                 detail={"isSuccess": body.isSuccess, "errorCode": body.errorCode,
                                         "attempts": attempt})

        return self._retrying(call)

    # -- ack ---------------------------------------------------------------------------------
    def acknowledge(self, delivery: Delivery) -> None:
        """Ack the delivery token (``requeue:false``) after the result was accepted.

        404 raises NotFoundError (token expired, already acked or held by another API
        replica), or NotFoundAfterRetryError when an earlier attempt may have gone
        through. Neither proves anything about the execution: check the pipeline.
        """
        self._ack(delivery, requeue=False)

    def discard(self, delivery: Delivery) -> None:
        """Drop a stale or duplicate delivery: an ack without requeue."""
        self._ack(delivery, requeue=False)

    def take_unaddressable(self) -> list[str]:
        return self._tally.take_unaddressable()

    def hand_back(self, delivery: Delivery) -> None:
        """Return unstarted work: ack with ``requeue:true`` while the token lives.

        This changes broker state only; it neither resets a lease nor uses an attempt.
        """
        self._ack(delivery, requeue=True)

    def _ack(self, delivery: Delivery, *, requeue: bool) -> None:
        if delivery.token is None:
            raise ValueError(f"job {delivery.job_id} has no delivery token to acknowledge")
        self._ack_token(delivery.token, requeue=requeue, job_id=delivery.job_id)

    def _ack_token(self, token: SecretStr, *, requeue: bool, job_id: str | None = None) -> None:
        body = AckBody(token=token, requeue=requeue).wire()
        maybe_applied = False

        def call(attempt: int) -> None:
            nonlocal maybe_applied
            try:
                response = self._transport.request("POST", "/jobs/ack", endpoint="ack", json_body=body)
                self._raise_for_status(response, credential="token", expected=(200,),
                                       subject=f"delivery of job {job_id}" if job_id else "delivery",
                                       redact=(token.get_secret_value(),))
            except ServerUnavailableError as err:
                maybe_applied = maybe_applied or err.ambiguous
                raise
            except NotFoundError as err:
                if maybe_applied:
                    raise NotFoundAfterRetryError(
                        f"delivery of job {job_id} not found on attempt {attempt}; an earlier attempt "
                        "most likely went through", endpoint="ack", status=404) from err
                raise

        self._retrying(call)

    # -- lifecycle -----------------------------------------------------------------------------
    def send_events(self, events: Sequence[WorkerEvent]) -> None:
        """Send events in nonempty batches of at most ``max_events_per_batch``."""
        if not events:
            return
        worker_id = self._require_session().worker_id
        items = [EventItem(level=e.level, eventType=e.event_type, message=e.message,
                           metadata=dict(e.attributes) or None) for e in events]
        size = self.max_events_per_batch
        for start in range(0, len(items), size):
            body = EventsBody(workerId=worker_id, events=items[start:start + size]).wire()

            def call(_attempt: int, body: dict[str, Any] = body) -> None:
                self._session_post("/workers/events", "events", body)

            # Retried: a duplicated activity-feed entry after a lost answer is harmless.
            self._retrying(call)

    def shutdown(self, reason: str) -> None:
        """Mark the worker stopped. It records lifecycle state; the session stays valid."""
        body = ShutdownBody(workerId=self._require_session().worker_id, reason=reason).wire()
        self._retrying(lambda _attempt: self._session_post("/workers/shutdown", "shutdown", body))

    # -- pipelines: reconciliation, tests and demos --------------------------------------------------
    def reconcile(self, delivery: Delivery) -> dict[str, Any] | None:
        """An ack answered 404 (token expired, or forgotten by a restarted API process): the
        document says to "check the pipeline outcome" (``GET /pipelines/{id}``). Returns the
        pipeline's and this stage's status, or why they could not be read."""
        try:
            pipeline = self.pipeline_status(_wire_int(delivery, "pipelineId"))
        except (ProtocolError, ValueError) as err:
            return {"reconcile_error": f"{type(err).__name__}: {err}"}
        stage_id = delivery.wire.get("stageId")
        stage: dict[str, Any] = next((s for s in pipeline.get("stages", []) if s.get("id") == stage_id), {})
        return {"pipeline_status": pipeline.get("status"), "stage_status": stage.get("status"),
                "stage_execution": stage.get("executionId")}

    def lease_untaken(self, delivery: Delivery) -> bool:
        """The stage still waits for this very execution to be leased (``Pending``, its
        current execution ours): no worker acquired it. A failed read says no."""
        read = self.reconcile(delivery)
        if read is None or "reconcile_error" in read:
            return False
        return (read.get("stage_status") == "Pending"
                and str(read.get("stage_execution")) == str(delivery.wire.get("executionId")))

    def pipeline_status(self, pipeline_id: int) -> dict[str, Any]:
        """``GET /pipelines/{id}``: ``{id, status, stages, ...}``; the way to confirm an outcome."""

        def call(_attempt: int) -> dict[str, Any]:
            response = self._transport.request("GET", f"/pipelines/{int(pipeline_id)}", endpoint="pipelines.get",
                                          headers=self._key_headers())
            self._raise_for_status(response, credential="key", expected=(200,),
                                   subject=f"pipeline {int(pipeline_id)}")
            return self._decode(response, PipelineStatus).model_dump(mode="json")

        return self._retrying(call)

    def create_pipeline(self, name: str, stages: Sequence[StageSpec | Mapping[str, Any]], *,
                        idempotency_key: str | None = None) -> dict[str, Any]:
        """``POST /pipelines/idempotent``: ``{"pipeline": {...}, "created": bool}``.

        Retried safely: the idempotency key makes a repeated create return the same pipeline.
        """
        body = CreatePipelineBody(
            idempotencyKey=idempotency_key or uuid.uuid4().hex,
            name=name,
            stages=[s if isinstance(s, StageSpec) else StageSpec.model_validate(dict(s)) for s in stages],
        ).wire()

        def call(_attempt: int) -> dict[str, Any]:
            response = self._transport.request("POST", "/pipelines/idempotent", endpoint="pipelines.create",
                                          json_body=body, headers=self._key_headers())
            self._raise_for_status(response, credential="key", expected=(200, 201))
            created = self._decode(response, PipelineCreated)
            return {"pipeline": created.pipeline.model_dump(mode="json"), "created": response.status == 201}

        return self._retrying(call)

    # -- plumbing ------------------------------------------------------------------------------
    def _require_session(self) -> SessionState:
        if self._session is None:
            raise ConfigurationError("no Pipelogiq worker session: the server has not answered a bootstrap "
                                     "(POST /workers/bootstrap) yet")
        return self._session

    def _key_headers(self) -> dict[str, str]:
        return {"X-API-Key": self._secret()}

    def _session_headers(self) -> dict[str, str]:
        token = self._require_session().token.get_secret_value()
        if not header_safe(token):  # a session restored from state, stored by an older release
            raise SessionExpiredError("stored worker session token cannot be sent as a header: re-bootstrap",
                                      endpoint="session")
        return {"X-Worker-Session": token}

    def _session_post(self, path: str, label: str, body: dict[str, Any]) -> None:
        response = self._transport.request("POST", path, endpoint=label, json_body=body,
                                      headers=self._session_headers())
        self._raise_for_status(response, credential="session")

    def _decode(self, response: HttpResponse, model: type[M]) -> M:
        try:
            return model.model_validate(response.json())
        except ValidationError as err:
            # Chained from a sanitised copy: the pydantic error would quote the answer.
            raise ProtocolViolationError(f"unexpected answer shape ({err.error_count()} errors)",
                                         endpoint=response.endpoint, status=response.status) \
                from _decode_error(err)

    def _raise_for_status(self, response: HttpResponse, *, credential: Credential,
                          expected: Collection[int] = _OK, subject: str = "request",
                          redact: Sequence[str] = ()) -> None:
        """The one place HTTP statuses become domain errors.

        ``credential`` is what the endpoint checks (the document's table), which decides
        what a 401 means: the key (InvalidApiKeyError), the session (SessionExpiredError:
        re-bootstrap), or both (told apart by the answer's text).
        """
        status, label = response.status, response.endpoint
        if status in expected:
            if credential in ("session", "both"):
                self._confirmed = self._session  # the server took it (runtime/session.py)
            return
        error = self._server_error(response, redact)
        if status == 400:
            raise BadRequestError(f"{subject} rejected: {error or 'bad request'}", endpoint=label,
                                  status=status)
        if status == 401:
            session_words = ("expired", "replaced", "invalid")
            why = next((w for w in session_words if w in error.lower()), "rejected")
            if credential == "session" or (credential == "both" and "session" in error.lower()):
                raise SessionExpiredError(f"worker session {why}: re-bootstrap", endpoint=label,
                                          status=status)
            if credential in ("key", "both"):
                raise InvalidApiKeyError("API key rejected", endpoint=label, status=status)
            raise ProtocolViolationError("ack checks no credential, yet the server answered 401",
                                         endpoint=label, status=status)
        if status == 403:
            raise ForbiddenError(f"{subject} forbidden: {error or 'credential not valid for this resource'}",
                                 endpoint=label, status=status)
        if status == 404:
            raise NotFoundError(f"{subject} not found", endpoint=label, status=status)
        if status == 413:
            raise BadRequestError(f"{subject}: request larger than the server accepts", endpoint=label,
                                  status=status)
        if status == 429:
            raise RateLimitedError("rate limited", endpoint=label, retry_after=response.retry_after)
        if status >= 500:
            raise ServerUnavailableError("server error", endpoint=label, status=status, ambiguous=True)
        raise ProtocolViolationError(f"{subject}: unexpected status", endpoint=label, status=status)

    def _server_error(self, response: HttpResponse, redact: Sequence[str]) -> str:
        """The answer's ``error`` text, bounded, with every credential we know cut out."""
        try:
            data = response.json_or_none()
        except ProtocolViolationError:
            return ""
        error = data.get("error") if isinstance(data, dict) else None
        if not isinstance(error, str):
            return ""
        secrets = [self._secret(), *redact]
        if self._session is not None:
            secrets.append(self._session.token.get_secret_value())
        return server_text(error, secrets, limit=300)


# -- outcome mapping ---------------------------------------------------------------------------
def _result_request(delivery: Delivery, outcome: Outcome) -> ResultRequest:
    """The result body for an outcome, as docs/outcomes.md tabulates it."""
    kind = outcome.kind
    fields: dict[str, Any]
    if kind is OutcomeKind.SUCCESS:
        value = outcome.value
        fields = {"isSuccess": True, "result": value if isinstance(value, str) else _compact_json(value)}
    elif kind is OutcomeKind.BUSINESS_ERROR:
        value = outcome.value
        variables = value if isinstance(value, dict) else ({} if value is None else {"value": value})
        fields = {"isSuccess": False, "errorCode": "BUSINESS_REJECTED", "retryable": False,
                  "result": _compact_json({"code": outcome.error_code or "BUSINESS_REJECTED",
                                           "message": outcome.message or "", "variables": variables})}
    elif kind is OutcomeKind.BAD_INPUT:
        fields = {"isSuccess": False, "errorCode": "VALIDATION_ERROR", "retryable": False,
                  "result": outcome.message or "input rejected by the handler's model"}
    elif kind is OutcomeKind.FAILURE:
        fields = {"isSuccess": False, "errorCode": outcome.error_code or "HANDLER_ERROR",
                  "retryable": outcome.retryable,
                  "result": outcome.message or "handler failed"}
    elif kind is OutcomeKind.TIMEOUT:
        fields = {"isSuccess": False, "errorCode": "HANDLER_TIMEOUT", "retryable": True,
                  "result": outcome.message or "handler ran past its time budget"}
    else:
        raise ValueError(f"{kind.value} outcomes are not reported to Pipelogiq; use hand_back()")
    extras = outcome.extras
    if extras is not None:
        if extras.logs:
            fields["logs"] = [ResultLogItem.model_validate(item.model_dump()) for item in extras.logs]
        if extras.context:
            fields["context"] = [ResultContextItem.model_validate(item.model_dump())
                                 for item in extras.context]
        if extras.appended_stages:
            fields["appendedStages"] = [StageSpec.model_validate(stage.model_dump(exclude_none=True))
                                        for stage in extras.appended_stages]
        if extras.wait_for_approval:
            fields["isWaitingForApproval"] = True
    return ResultRequest(
        pipelineId=_wire_int(delivery, "pipelineId"),
        stageId=_stage_id(delivery),
        executionId=_wire_str(delivery, "executionId"),
        attempt=delivery.attempt,
        **fields,
    )


def _compact_json(value: Any) -> str:
    return to_json(value).decode()


def _stage_id(delivery: Delivery) -> int:
    return _wire_int(delivery, "stageId")


def _wire_int(delivery: Delivery, name: str) -> int:
    value = delivery.wire.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"job {delivery.job_id}: delivery has no numeric {name}")
    return value


def _wire_str(delivery: Delivery, name: str) -> str:
    value = delivery.wire.get(name)
    if not isinstance(value, str) or not value:
        raise ValueError(f"job {delivery.job_id}: delivery has no {name}")
    return value


def _now() -> float:
    return time.time()
