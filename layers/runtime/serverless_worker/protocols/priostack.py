"""The Priostack job-worker client: activate, complete, fail (docs/protocols.md).

Priostack has no session and no lease: an activated job stays with the worker that
took it until it is completed or failed, and is never timed out or handed to anyone
else. So a job this client drops is stranded until the server restarts; every path
below ends in a ``complete`` or a ``fail``.

Paths the documents do not give, chosen here and isolated in ``_PATHS``:
``POST {prefix}/workers/register``, ``POST {prefix}/workers/{id}/heartbeat``,
``GET {prefix}/workers``, ``GET {prefix}/incidents`` and
``GET {prefix}/process-instances/{key}`` (the last two are named by the documents).

>>> with PriostackClient("https://priostack.com", api_key) as client:
...     for delivery in client.pull(PullRequest(handler="send-email", max_items=5)):
...         client.report(delivery, Outcome(kind=OutcomeKind.SUCCESS, value={"sent": True}))
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, ClassVar, Literal, NoReturn, TypeVar, Unpack

from pydantic import BaseModel, SecretStr, ValidationError

from ..errors import (
    AuthenticationError,
    BadRequestError,
    ConfigurationError,
    InvalidApiKeyError,
    NotFoundAfterRetryError,
    NotFoundError,
    ProtocolError,
    ProtocolViolationError,
    RateLimitedError,
    ServerUnavailableError,
    UnsupportedServerError,
)
from ..logsafety import server_text
from ..model import Delivery, Outcome, OutcomeKind, ReportReceipt, SessionState
from ..textforms import coded_message
from ._http import HttpResponse
from ._paths import path_segment
from .addressing import AddressTally
from .base import PullRequest, WorkerIdentity, WorkerStatus
from .http_client import HttpOptions, HttpProtocolClient
from .priostack_models import (
    ActivateRequest,
    ActivateResponse,
    CompleteRequest,
    FailRequest,
    HeartbeatResponse,
    Incident,
    PriostackJob,
    ProcessInstance,
    WorkerList,
    WorkerRecord,
    WorkerRegistration,
)

__all__ = ["AuthMode", "PriostackClient", "settle_request"]

log = logging.getLogger("serverless_worker.protocols.priostack")
M = TypeVar("M", bound=BaseModel)

AuthMode = Literal["header", "bearer", "query"]

# Errors longer than this are cut: the documents set no limit, and a traceback-sized
# message gains nothing on an incident record.
MAX_ERROR_MESSAGE = 4000

_PATHS = {
    "activate": "/jobs/activate",
    "complete": "/jobs/{key}/complete",
    "fail": "/jobs/{key}/fail",
    "process-instances.get": "/process-instances/{key}",
    "incidents.list": "/incidents",
    "workers.register": "/workers/register",
    "workers.heartbeat": "/workers/{key}/heartbeat",
    "workers.list": "/workers",
}


class PriostackClient(HttpProtocolClient):
    """A Priostack worker over one pooled HTTP session.

    ``auth`` picks where the API key goes: ``X-API-Key`` (default), ``Authorization:
    Bearer`` or the ``api_key`` query parameter. The query form is supported because the
    documents list it; it puts the key in the URL, so in that mode transport errors are
    re-raised without their chained cause (the transport itself logs no URL).
    """

    name: ClassVar[str] = "priostack"
    needs_session: ClassVar[bool] = False
    has_lease: ClassVar[bool] = False
    # Activation answers at once; the documents say to sleep 1 to 5 s after an empty poll.
    long_poll: ClassVar[bool] = False
    batch_pull: ClassVar[bool] = True  # activate hands out up to maxJobsToActivate
    empty_poll_backoff: ClassVar[float] = 5.0  # "sleep 1 to 5 seconds before the next poll": at most 5

    credential_label: ClassVar[str] = "Priostack API key"

    def __init__(
        self,
        base_url: str,
        api_key: SecretStr | str,
        *,
        auth: AuthMode = "header",
        api_prefix: str = "/api/v1",
        register: bool = False,
        group_name: str | None = None,
        **http: Unpack[HttpOptions],
    ) -> None:
        super().__init__(base_url, api_key, **http)
        if auth not in ("header", "bearer", "query"):
            raise ConfigurationError(f"Priostack auth must be header, bearer or query, got {auth!r}")
        self._auth: AuthMode = auth
        stripped = api_prefix.strip("/")
        self._prefix = f"/{stripped}" if stripped else ""
        self._register = register
        self._group_name = group_name
        self.worker_id: str | None = None
        self._tally = AddressTally()

    def _repr_fields(self) -> Mapping[str, object]:
        return {"auth": self._auth, "api_prefix": self._prefix}

    # -- session -------------------------------------------------------------------
    def open_session(self, identity: WorkerIdentity) -> SessionState | None:
        """Register the worker once when ``register`` is set; there is never a session.

        Registration is optional and never consulted by activation, so a failure other
        than a rejected key is logged and ignored (the paths are an assumption).
        """
        if self._register and self.worker_id is None:
            try:
                record = self.register_worker(identity.handlers, self._group_name)
            except AuthenticationError:
                raise
            except ProtocolError as err:
                log.warning("priostack worker registration failed, continuing without it: %s", err)
            else:
                self.worker_id = record.id
        return None

    def heartbeat(self, status: WorkerStatus) -> None:
        """Heartbeat the registered worker; a no-op when unregistered. Never fatal."""
        if self.worker_id is None:
            return
        try:
            self.worker_heartbeat(self.worker_id)
        except ProtocolError as err:
            log.warning("priostack worker heartbeat failed: %s", err)

    # -- work ----------------------------------------------------------------------
    def pull(self, request: PullRequest) -> list[Delivery]:
        """Activate up to ``max_items`` jobs of ``request.handler``; answers at once.

        ``wait_seconds`` is ignored: the server never long-polls, and sleeping 1-5 s
        between empty polls is the caller's job. A delivery's ``handler`` is the job's
        own ``type`` (which a server ignoring the filter could make differ), and a server
        that ignores ``maxJobsToActivate`` gets all it sent returned: what was not asked
        for is the runtime's to give back (``not_asked_for``, ``runtime/pulling.py``).
        """
        body = ActivateRequest(type=request.handler, maxJobsToActivate=request.max_items)
        # Never retried. Jobs do not expire: an activation whose answer was lost has
        # handed jobs to nobody, and they stay stranded until a server restart. A blind
        # retry would activate more jobs on top and could exceed our capacity.
        response = self._send("POST", "activate", json_body=body.model_dump())
        self._raise_for_status(response)
        try:
            jobs = ActivateResponse.model_validate(response.json()).jobs
        except ValidationError:
            # `from None`: pydantic's error would quote the whole answer, variables included.
            raise ProtocolViolationError("activation answer has no jobs list", endpoint="activate",
                                         status=response.status) from None
        deliveries = [d for d in (self._decode(raw, request.handler) for raw in jobs) if d is not None]
        lack = self._tally.note(len(deliveries), [lack for lack in map(_key_lack, jobs) if lack])
        if lack is not None:
            # No job so far could be addressed: another API, and activating more only strands more.
            raise UnsupportedServerError(
                f"activated jobs carry {lack}: this server does not speak the Priostack job-worker API "
                f"this worker implements; the {len(jobs)} jobs taken stay active on it until it restarts "
                "(Priostack jobs never expire), none was completed or failed")
        # Every job taken is returned, even beyond maxJobsToActivate or of another type: the
        # runtime gives back what it did not ask for (runtime/pulling.py), never drops it.
        return deliveries

    def report(self, delivery: Delivery, outcome: Outcome) -> ReportReceipt:
        """Map the outcome (docs/outcomes.md): complete, or fail with the right ``retries``.

        A 404 means the job is gone. After an ambiguous earlier attempt it most likely
        went through: the receipt says ``already_applied``. On a first attempt the job
        was applied by an earlier invocation or its instance was cancelled: the receipt
        is ``accepted=False, status="not_found"``. Both carry the instance read back.
        """
        action, variables, retries, message = _plan(delivery, outcome)
        try:
            if action == "complete":
                self.complete(delivery.job_id, variables)
            else:
                self.fail(delivery.job_id, retries, message)
        except NotFoundAfterRetryError:
            detail = self._reconcile(delivery, variables)
            return ReportReceipt(accepted=True, status="already_applied", already_applied=True, detail=detail)
        except NotFoundError:
            detail = self._reconcile(delivery, variables)
            return ReportReceipt(accepted=False, status="not_found", detail=detail)
        if action == "complete":
            return ReportReceipt(status="completed", detail={"variables_sent": sorted(variables or {})})
        return ReportReceipt(status="failed", detail={"retries_sent": retries})

    def take_unaddressable(self) -> list[str]:
        return self._tally.take_unaddressable()

    def hand_back(self, delivery: Delivery) -> None:
        """Fail with ``retries`` unchanged: re-queued at once without using an attempt.

        A job that is already gone (404) has nothing to hand back; that is logged. A
        job whose ``retries`` could not be decoded is failed with 0 (an incident), as
        the server itself counts a missing value.
        """
        try:
            self.fail(delivery.job_id, _retries(delivery), "handed back without running")
        except NotFoundAfterRetryError:
            log.info("priostack hand-back of job %s went through on an earlier attempt", delivery.job_id)
        except NotFoundError:
            log.warning("priostack job %s was already gone when handed back", delivery.job_id)

    def acknowledge(self, delivery: Delivery) -> None:
        """Nothing to acknowledge: complete/fail settle the job."""

    def discard(self, delivery: Delivery) -> None:
        """Nothing to do: the execution that holds the job reports it."""

    # -- low-level job calls -----------------------------------------------------------
    def complete(self, key: str, variables: dict[str, Any] | None = None) -> None:
        """Complete a job (204, empty body), retrying ambiguous failures with the same body.

        Raises NotFoundAfterRetryError on a 404 that follows an ambiguous attempt, and
        NotFoundError on any other 404.
        """
        self._settle("complete", key, _complete_body(variables))

    def fail(self, key: str, retries: int, message: str) -> None:
        """Fail a job storing ``retries`` as sent (0 or less raises an incident)."""
        self._settle("fail", key, _fail_body(retries, message))

    # -- optional worker registration and reads -------------------------------------------
    def register_worker(self, topics: list[str], group_name: str | None = None) -> WorkerRecord:
        """Register (not retried: a lost answer would register twice). The echoed key is masked."""
        body = WorkerRegistration(topics=topics, group_name=group_name).model_dump(exclude_none=True)
        response = self._send("POST", "workers.register", json_body=body)
        return self._decode_answer(response, WorkerRecord)

    def worker_heartbeat(self, worker_id: str) -> HeartbeatResponse:
        """Heartbeat once (not retried: the next tick sends another)."""
        response = self._send("POST", "workers.heartbeat", key=worker_id, json_body={})
        return self._decode_answer(response, HeartbeatResponse)

    def list_workers(self) -> WorkerList:
        return self._read(lambda: self._send("GET", "workers.list"), WorkerList)

    def list_incidents(self) -> list[Incident]:
        """Incidents; the answer may be a list or an object holding ``items``/``incidents``."""

        def call() -> list[Incident]:
            response = self._send("GET", "incidents.list")
            self._raise_for_status(response)
            data = response.json()
            if isinstance(data, dict):
                data = data.get("items", data.get("incidents"))
            if not isinstance(data, list):
                raise ProtocolViolationError("incident answer is not a list", endpoint="incidents.list",
                                             status=response.status)
            return [Incident.model_validate(item) for item in data if isinstance(item, dict)]

        return self._retrying(lambda _attempt: call())

    def get_process_instance(self, key: str) -> ProcessInstance:
        return self._read(lambda: self._send("GET", "process-instances.get", key=key), ProcessInstance)

    # -- plumbing -------------------------------------------------------------------------
    def _send(self, method: str, label: str, *, key: str | None = None,
              json_body: Any = None) -> HttpResponse:
        """One HTTP call with the key attached; in query mode no error keeps the URL."""
        path = self._prefix + _PATHS[label].format(key=path_segment(key or ""))
        headers: dict[str, str] = {}
        params: dict[str, str] | None = None
        secret = self._secret()
        if self._auth == "header":
            headers["X-API-Key"] = secret
        elif self._auth == "bearer":
            headers["Authorization"] = f"Bearer {secret}"
        else:
            params = {"api_key": secret}
        try:
            return self._transport.request(method, path, endpoint=label, json_body=json_body,
                                           headers=headers, params=params)
        except (ServerUnavailableError, ProtocolViolationError) as err:
            if self._auth != "query":
                raise
            detached = _detached(err)
        # Raised outside the except block, so it has neither cause nor context: a transport
        # error may quote the URL, and in this mode the URL has the key.
        raise detached

    def _settle(self, label: str, key: str, body: dict[str, Any]) -> None:
        """POST complete/fail with retries; tell a 404 after an ambiguous attempt apart."""
        maybe_applied = False

        def attempt(number: int) -> None:
            nonlocal maybe_applied
            try:
                response = self._send("POST", label, key=key, json_body=body)
                self._raise_for_status(response, job_key=key)
            except ServerUnavailableError as err:
                maybe_applied = maybe_applied or err.ambiguous
                raise
            except NotFoundError as err:
                if maybe_applied:
                    raise NotFoundAfterRetryError(
                        f"job {key} not found on attempt {number}; an earlier attempt most likely applied",
                        endpoint=label, status=404) from err
                raise

        self._retrying(attempt)

    def _read(self, call: Callable[[], HttpResponse], model: type[M]) -> M:
        """A GET, safe to retry."""
        return self._retrying(lambda _attempt: self._decode_answer(call(), model))

    def _decode_answer(self, response: HttpResponse, model: type[M]) -> M:
        self._raise_for_status(response)
        try:
            return model.model_validate(response.json())
        except ValidationError as err:
            # `from None`: pydantic's error quotes the answer, which may echo a credential
            # (registration answers carry an api_key).
            raise ProtocolViolationError(f"unexpected answer shape ({err.error_count()} errors)",
                                         endpoint=response.endpoint, status=response.status) from None

    def _reconcile(self, delivery: Delivery, sent: dict[str, Any] | None) -> dict[str, Any]:
        """Read the job's process instance back after a 404, for the receipt.

        ``variables_present`` says whether the variables a complete sent are in the
        instance (a strong hint that the lost complete went through).
        """
        instance_key = delivery.wire.get("processInstanceKey")
        detail: dict[str, Any] = {"processInstanceKey": instance_key}
        if not isinstance(instance_key, str):
            detail["reconcile_error"] = "job has no string processInstanceKey"
            return detail
        try:
            instance = self.get_process_instance(instance_key)
        except ProtocolError as err:
            detail["reconcile_error"] = str(err)
            return detail
        detail["state"] = instance.state
        detail["instance"] = instance.model_dump(mode="json")
        if sent:
            merged = instance.variables or {}
            detail["variables_present"] = all(name in merged and merged[name] == value
                                              for name, value in sent.items())
        return detail

    def _decode(self, raw: Any, handler: str) -> Delivery | None:
        """One activated job to a Delivery, or None when it cannot even be addressed.

        A job without a string key is logged and counted (``pull`` stops when no job so
        far had one): converting a numeric key could address another job, so it stays
        active server-side (stranded until a server restart). A job with a string key but
        other invalid fields still becomes a Delivery with ``invalid`` set, so the
        runtime fails it with retries 0 (an incident an operator sees) instead of stranding it.
        """
        raw_key = raw.get("key") if isinstance(raw, dict) else None
        if not isinstance(raw_key, str) or not raw_key:
            log.error("priostack activation returned a job whose key is not a JSON string "
                      "(key=%r, type %s); it cannot be completed or failed and stays active "
                      "server-side until a restart",
                      raw_key, type(raw_key).__name__)
            return None
        wire = {name: raw.get(name) for name in
                ("processInstanceKey", "processDefinitionKey", "type", "deadline", "createdAt", "retries")}
        try:
            job = PriostackJob.model_validate(raw)
        except ValidationError as err:
            reason = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                               for e in err.errors(include_input=False, include_url=False))
            log.error("priostack job %s is malformed (%s); it must be failed with retries 0", raw_key, reason)
            raw_retries = raw.get("retries")
            return Delivery(
                protocol=self.name,
                handler=raw["type"] if isinstance(raw.get("type"), str) else handler,
                job_id=raw_key, ledger_id=f"{raw_key}:r{raw.get('retries')}", attempt=1,
                retries_left=_int_or_none(raw_retries),
                payload=raw.get("variables") if isinstance(raw.get("variables"), dict) else None,
                wire=wire, invalid=reason,
            )
        return Delivery(
            protocol=self.name,
            handler=job.type,
            job_id=job.key,
            # A failed job comes back under the same key with retries one lower, so the
            # ledger id includes retries: each activation of one key is its own delivery,
            # while a hand-back (retries unchanged) or a duplicate activation maps to the
            # same ledger item.
            ledger_id=f"{job.key}:r{job.retries}",
            # Priostack has no attempt counter, only retries left; every activation is
            # reported as attempt 1 and retries_left carries the real budget.
            attempt=1,
            retries_left=job.retries,
            payload=job.variables,
            created_at=_epoch_or_none(job.createdAt),
            wire={**wire, "deadline": job.deadline, "createdAt": job.createdAt},
        )

    def _raise_for_status(self, response: HttpResponse, *, job_key: str | None = None) -> None:
        """The one place HTTP statuses become domain errors. Any 2xx is success."""
        status, label = response.status, response.endpoint
        if 200 <= status < 300:
            return
        _raise_status(status, label, _server_error(response, self._secret()), job_key, response.retry_after)


def _raise_status(status: int, label: str, error: str, job_key: str | None,
                  retry_after: float | None) -> NoReturn:
    subject = f"job {job_key}" if job_key else "request"
    if status == 400:
        raise BadRequestError(f"{subject} rejected: {error or 'bad request'}", endpoint=label, status=status)
    if status == 401:
        raise InvalidApiKeyError("API key rejected", endpoint=label, status=status)
    if status == 404:
        if error == "unknown action":
            # complete and fail are the only actions and we send nothing else, so this
            # is a wrong base URL/prefix or a different server: not "the job is gone".
            raise ProtocolViolationError(f"{subject}: server reports unknown action", endpoint=label,
                                         status=status)
        raise NotFoundError(f"{subject} not found", endpoint=label, status=status)
    if status == 429:
        raise RateLimitedError("rate limited", endpoint=label, retry_after=retry_after)
    if status >= 500:
        raise ServerUnavailableError(f"server error{': ' + error if error else ''}", endpoint=label,
                                     status=status, ambiguous=True)
    raise ProtocolViolationError(f"{subject}: unexpected status", endpoint=label, status=status)


def _detached(err: ServerUnavailableError | ProtocolViolationError) -> ProtocolError:
    """The same error without the chain that could quote a URL carrying the key."""
    message = str(err).removeprefix(f"{err.endpoint}: ")
    if err.status is not None:
        message = message.removesuffix(f" (HTTP {err.status})")
    if isinstance(err, ServerUnavailableError):
        return ServerUnavailableError(message, endpoint=err.endpoint, status=err.status,
                                      ambiguous=err.ambiguous)
    return ProtocolViolationError(message, endpoint=err.endpoint, status=err.status)


def _server_error(response: HttpResponse, secret: str) -> str:
    """The server's ``error`` text, if the body carries one: bounded, the key (which a
    server may echo with the request's headers) cut out, controls escaped."""
    try:
        data = response.json_or_none()
    except ProtocolViolationError:
        return ""
    error = data.get("error") if isinstance(data, dict) else None
    return server_text(error, (secret,), limit=300) if isinstance(error, str) else ""


def _plan(delivery: Delivery, outcome: Outcome) -> tuple[str, dict[str, Any] | None, int, str]:
    """(action, variables, retries, errorMessage) for an outcome (docs/outcomes.md)."""
    kind = outcome.kind
    if kind is OutcomeKind.SUCCESS:
        return "complete", _success_variables(outcome.value), 0, ""
    if kind is OutcomeKind.BUSINESS_ERROR:
        # BPMN errors cannot be thrown over REST: route the rejection as outcome
        # variables and branch on them with an exclusive gateway after the task.
        return "complete", _business_variables(outcome), 0, ""
    if kind is OutcomeKind.BAD_INPUT:
        return "fail", None, 0, _error_message(outcome, "bad input")  # retries 0: an incident
    if kind is OutcomeKind.FAILURE:
        # A deterministic failure (an unreportable result) would only fail alike: retries 0.
        retries = max(0, _retries(delivery) - 1) if outcome.retryable else 0
        return "fail", None, retries, _error_message(outcome, "handler failed")
    if kind is OutcomeKind.TIMEOUT:
        return "fail", None, max(0, _retries(delivery) - 1), _error_message(outcome, "handler timed out")
    raise ValueError(f"{kind.value} outcomes are not reported to Priostack; use hand_back()")


def settle_request(delivery: Delivery, outcome: Outcome) -> tuple[str, dict[str, Any]]:
    """The call (``complete`` or ``fail``) and the JSON body :meth:`PriostackClient.report`
    sends for ``outcome``. Pure, so ``serverless_worker.testing`` shows it without a server."""
    action, variables, retries, message = _plan(delivery, outcome)
    if action == "complete":
        return action, _complete_body(variables)
    return action, _fail_body(retries, message)


def _complete_body(variables: dict[str, Any] | None) -> dict[str, Any]:
    return CompleteRequest(variables=variables).model_dump(exclude_none=True)


def _fail_body(retries: int, message: str) -> dict[str, Any]:
    return FailRequest(retries=retries, errorMessage=message[:MAX_ERROR_MESSAGE]).model_dump()


def _success_variables(value: Any) -> dict[str, Any] | None:
    """A dict is merged as is; None merges nothing; anything else becomes ``result``."""
    if value is None:
        return None
    return dict(value) if isinstance(value, dict) else {"result": value}


def _business_variables(outcome: Outcome) -> dict[str, Any]:
    value = outcome.value
    base = dict(value) if isinstance(value, dict) else ({} if value is None else {"result": value})
    code = outcome.error_code or "BUSINESS_REJECTED"
    return {**base, "errorCode": code, "errorMessage": outcome.message or ""}


def _error_message(outcome: Outcome, default: str) -> str:
    return coded_message(outcome.error_code, outcome.message, default)[:MAX_ERROR_MESSAGE]


def _retries(delivery: Delivery) -> int:
    """Retries left; unknown counts as 0, as the server counts an omitted value."""
    return delivery.retries_left if delivery.retries_left is not None else 0


def _key_lack(raw: Any) -> str:
    """What keeps an activated job from being addressed, in words; empty when its key is usable."""
    key = raw.get("key") if isinstance(raw, dict) else None
    if isinstance(key, str) and key:
        return ""
    return "no key" if key is None else f"a key that is not a JSON string ({type(key).__name__})"


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _epoch_or_none(created_at: str | None) -> float | None:
    """RFC 3339 to epoch seconds; the server's zero time (year 1) means unknown."""
    if not created_at:
        return None
    try:
        parsed = datetime.fromisoformat(created_at)
    except ValueError:
        return None
    if parsed.year < 1970 or parsed.tzinfo is None:
        return None
    return parsed.timestamp()
