"""The claim queue ("task" service) worker client, over HTTP or the ``work`` WebSocket
(docs/protocols.md).

The queue has no session and no lease call: a claim *is* the lease, for the queue's
``leaseSeconds``, and it cannot be renewed. A lease that lapses re-queues the item for
anyone (``attempts`` goes up), and a late result is still accepted unless the item is
already terminal. So the runtime bounds a handler's budget by the lease, and a timed
out or never started delivery is simply left to lapse. The handler name is the queue
name. Progress and results are records; failures are reported in-band as a result
carrying ``error``.

Not in the document, chosen here: the producer-side read ``GET /<queue>/items/<id>``
(used only to reconcile a retried result, see :meth:`ClaimQueueClient.item_status`),
the socket messages other than claim/result/item/empty/result-ack (see
``claimqueue_socket``), and the in-band error record's ``errorCode`` field.

>>> with ClaimQueueClient("https://task.example.com", token, worker_id="box-1") as client:
...     for delivery in client.pull(PullRequest(handler="resize", max_items=4, criteria={"format": "jpg"})):
...         client.report(delivery, Outcome(kind=OutcomeKind.SUCCESS, value={"output": "aGVsbG8="}))
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar, Unpack

from pydantic import BaseModel, SecretStr, ValidationError

from ..errors import (
    ConfigurationError,
    LeaseRefusedError,
    ProtocolError,
    ProtocolViolationError,
    RateLimitedError,
    ResultNotAcceptedError,
    ServerUnavailableError,
    UnsupportedServerError,
)
from ..logsafety import server_text
from ..model import Delivery, Lease, Outcome, OutcomeKind, ReportReceipt
from ._http import HttpResponse
from ._paths import path_segment
from .addressing import UNADDRESSABLE_PER_PULL, AddressTally
from .base import PullRequest
from .claimqueue_criteria import criteria_miss
from .claimqueue_models import (
    ClaimAnswer,
    ClaimRequest,
    ItemLease,
    ItemStatus,
    ProgressAnswer,
    ResultAnswer,
    raise_for_answer,
)
from .http_client import HttpOptions, HttpProtocolClient

if TYPE_CHECKING:
    from .claimqueue_socket import ClaimQueueSocket

__all__ = ["ClaimQueueClient", "Transport", "result_record"]

log = logging.getLogger("serverless_worker.protocols.claimqueue")
M = TypeVar("M", bound=BaseModel)

Transport = Literal["http", "socket"]

_PATHS = {
    "claim": "/{queue}/claim",
    "progress": "/{queue}/items/{id}/progress",
    "result": "/{queue}/items/{id}/result",
    "items.get": "/{queue}/items/{id}",  # assumed producer-side read; not in the worker document
    "work": "/{queue}/work",
}


# errorCode of in-band error results when the outcome carries none.
_DEFAULT_ERROR_CODES = {
    OutcomeKind.BUSINESS_ERROR: "BUSINESS_REJECTED",
    OutcomeKind.BAD_INPUT: "VALIDATION_ERROR",
    OutcomeKind.FAILURE: "HANDLER_ERROR",
}


def result_record(outcome: Outcome) -> dict[str, Any]:
    """The result record an outcome becomes (docs/outcomes.md, claim queue column).

    A success's value is the record when it is a JSON object, else ``{"result": value}``.
    Errors are in-band: ``{"error": message, "errorCode": code}``, plus a business
    error's variables at the top level (they never overwrite ``error``/``errorCode``).
    """
    if outcome.kind is OutcomeKind.SUCCESS:
        return dict(outcome.value) if isinstance(outcome.value, dict) else {"result": outcome.value}
    if outcome.kind not in _DEFAULT_ERROR_CODES:
        raise ValueError(f"a {outcome.kind.value} outcome has no claim queue result record")
    code = outcome.error_code or _DEFAULT_ERROR_CODES[outcome.kind]
    record: dict[str, Any] = {}
    if outcome.kind is OutcomeKind.BUSINESS_ERROR and isinstance(outcome.value, dict):
        record.update(outcome.value)
    record["error"] = outcome.message or code
    record["errorCode"] = code
    return record


def _socket_transport() -> ModuleType:
    """The work socket's module, imported only for ``transport="socket"``: it needs
    ``websockets`` (the local extra), and the Lambda layer ships neither (Lambda claims over
    HTTP; layers/runtime/Makefile)."""
    try:
        from . import claimqueue_socket
    except ImportError as err:
        raise ConfigurationError("the claim queue's socket transport needs the websockets package (the local "
                                 f"extra), which is not installed here ({err}); use the http transport") from err
    return claimqueue_socket


class ClaimQueueClient(HttpProtocolClient):
    """A claim queue worker, one pooled HTTP session plus, with ``transport="socket"``,
    one ``work`` socket per queue.

    Over the socket, closing it re-queues every item still leased to it at once (see
    :meth:`release`); a claimed item whose socket has dropped is refused by
    :meth:`acquire` (``LeaseRefusedError``, action ``leave``) because the server has
    already re-queued it. So the socket transport suits a long-lived process (the local
    runner, a container): items must be worked by the process whose socket claimed them.
    In Lambda, where the scheduler that claims ends before the executors run, use HTTP.
    """

    name: ClassVar[str] = "claimqueue"
    needs_session: ClassVar[bool] = False
    has_lease: ClassVar[bool] = False         # the lease comes with the claim; there is no acquire call
    lease_renewable: ClassVar[bool] = False   # and no renew endpoint
    late_results: ClassVar[bool] = True       # a result is accepted unless the item is already terminal
    long_poll: ClassVar[bool] = False         # a claim answers at once, empty or not
    empty_poll_backoff: ClassVar[float] = 2.0  # "back off briefly": the document's loop waits 2 s
    parallel_pulls: ClassVar[int] = 3         # "no batch claim; parallelism comes from many single-item claims"

    credential_field: ClassVar[str] = "token"
    credential_label: ClassVar[str] = "claim queue bearer token"

    def __init__(
        self,
        base_url: str,
        token: SecretStr | str,
        *,
        worker_id: str = "serverless-worker",
        transport: Transport = "http",
        **http: Unpack[HttpOptions],
    ) -> None:
        if transport == "socket":
            _socket_transport()  # fails here, at configuration, where websockets is missing
        super().__init__(base_url, token, **http)
        if transport not in ("http", "socket"):
            raise ConfigurationError(f"claim queue transport must be http or socket, got {transport!r}")
        self._token = self._credential  # the same SecretStr: the work socket's handshake credential
        self.worker_id = worker_id
        self.transport: Transport = transport
        self._sockets: dict[str, ClaimQueueSocket] = {}
        self._sockets_lock = threading.Lock()
        self._tally = AddressTally()

    def _repr_fields(self) -> Mapping[str, object]:
        return {"worker_id": self.worker_id, "transport": self.transport}

    @property
    def calls(self) -> Mapping[str, int]:
        """HTTP calls made so far, per endpoint label (socket messages are not counted)."""
        return self._transport.calls

    # -- work ------------------------------------------------------------------------
    def pull(self, request: PullRequest) -> list[Delivery]:
        """Claim up to ``max_items`` items of queue ``request.handler``, one claim each.

        There is no batch claim. Claims are never retried blindly: over HTTP a claim whose
        answer was lost leaves an item leased to nobody until its lease lapses, and a
        second claim would take another. If a later claim fails, what was already claimed
        is returned; if the first fails, the error is raised. ``wait_seconds`` is ignored:
        a claim answers at once, and backing off after an empty batch is the caller's job.

        Over the socket a lost answer means a lost connection, whose items the server
        re-queues at once: the claims made on it are dropped from the batch (they are no
        longer ours) and claiming resumes once on a fresh connection.
        """
        queue = request.handler
        collected: list[Delivery] = []
        lacks: list[str] = []  # what each claim we could not address lacked
        reconnected = False
        while len(collected) < request.max_items and len(lacks) < UNADDRESSABLE_PER_PULL:
            try:
                delivery = self._claim_one(queue, request.criteria)
            except ProtocolError as err:
                if self.transport == "socket":
                    alive = [d for d in collected if not self._lease_voided(d)]
                    if len(alive) < len(collected):
                        log.warning("work socket for %s dropped mid-pull; %d claimed items were re-queued "
                                    "by the server, which hands them out again, and are dropped from this "
                                    "batch unstarted: nothing is lost", queue,
                                    len(collected) - len(alive))
                    collected = alive
                    if isinstance(err, ServerUnavailableError) and not reconnected:
                        # Safe over the socket only: a claim lost with its connection was
                        # re-queued with it, so claiming again cannot strand anything.
                        reconnected = True
                        continue
                if not collected and not lacks:
                    raise
                log.warning("claim on %s failed after %d items; keeping those: %s", queue, len(collected),
                            err)
                break
            if delivery is None:
                break
            if isinstance(delivery, str):
                lacks.append(delivery)
                continue
            collected.append(delivery)
        lack = self._tally.note(len(collected), lacks)
        if lack is not None:
            raise UnsupportedServerError(
                f"claims carry {lack}: this server does not speak the claim-queue worker API this worker "
                f"implements; the {len(lacks)} items taken return to the queue when their leases lapse")
        return collected

    def acquire(self, delivery: Delivery) -> Lease:
        """The lease the claim came with; no call. Refused only if its socket has closed."""
        return self._lease(delivery)

    def renew(self, delivery: Delivery) -> Lease:
        """No renew endpoint exists: the same lease (the runtime bounds the budget by it)."""
        return self._lease(delivery)

    def progress(self, delivery: Delivery, value: Any) -> None:
        """Report progress, best effort: one try, and transport failures are only logged.

        Raises :class:`ResultNotAcceptedError` when the server says ``accepted:false``:
        the item is terminal (someone finished it or the queue timed it out), so the
        runtime should cancel the handler. A non-object value is sent as ``{"progress": value}``.
        """
        queue, item_id = self._queue(delivery), delivery.job_id
        record = value if isinstance(value, dict) else {"progress": value}
        try:
            if self.transport == "socket":
                ack = self._socket(queue).progress(item_id, record)
                accepted, status = ack.accepted, ack.status
            else:
                data = self._call("POST", "progress", self._path("progress", queue, item_id), record,
                                  job_id=item_id)
                answer = self._parse(ProgressAnswer, data, endpoint="progress")
                accepted, status = answer.accepted, answer.status
        except (ServerUnavailableError, RateLimitedError) as err:
            log.warning("progress for item %s not delivered: %s", item_id, err)
            return
        if not accepted:
            raise ResultNotAcceptedError(server_text(status or "terminal", (self._secret(),), limit=80),
                                         endpoint="progress", job_id=item_id)

    def report(self, delivery: Delivery, outcome: Outcome) -> ReportReceipt:
        """Post the outcome as the item's result (docs/outcomes.md), retrying 5xx, 429
        and unknown outcomes with the same body: a late result is still accepted unless the
        item is terminal, so a retry is safe.

        TIMEOUT and LEASE_LOST send nothing: the lease lapses (or has), the item is
        claimed again, and the queue's timeout bounds the retries; the receipt says
        ``accepted=False, status="lapsed"``. NOT_STARTED is a ValueError: use
        :meth:`hand_back`. ``accepted:false`` raises :class:`ResultNotAcceptedError` with
        the item's status, unless a retry after an unknown outcome finds our own result
        stored (then ``already_applied``).
        """
        if outcome.kind is OutcomeKind.NOT_STARTED:
            raise ValueError(
                "a never-started claim queue delivery is handed back with hand_back(), not reported")
        if outcome.kind in (OutcomeKind.TIMEOUT, OutcomeKind.LEASE_LOST):
            log.info("item %s: %s, no result sent; its lease lapses", delivery.job_id, outcome.kind.value)
            return ReportReceipt(accepted=False, status="lapsed")
        return self._post_result(delivery, result_record(outcome))

    def acknowledge(self, delivery: Delivery) -> None:
        """Nothing to do: the result settled the item."""

    def discard(self, delivery: Delivery) -> None:
        """Nothing to do: a duplicate's lease lapses or is ended by the real result."""

    def take_unaddressable(self) -> list[str]:
        return self._tally.take_unaddressable()

    def not_asked_for(self, request: PullRequest, delivery: Delivery) -> str | None:
        """The queue is the handler; an item that fails the claim's criteria is not ours
        (``claimqueue_criteria``). A malformed item (``invalid``) is reported, not judged."""
        if delivery.invalid is not None:
            return super().not_asked_for(request, delivery)
        miss = criteria_miss(delivery.payload, request.criteria)
        if miss is not None:
            return f"item fails the criteria: {server_text(miss, (self._secret(),), limit=240)}"
        return super().not_asked_for(request, delivery)

    def hand_back(self, delivery: Delivery) -> None:
        """Return an unstarted item without reporting it.

        Over HTTP the queue has no release call: the lease lapses and the item is claimable
        again (that claim counts one more attempt). Over the socket, when no other item is
        still leased on that socket, it is closed, which makes the server re-queue the item
        at once; otherwise the lease lapses (or :meth:`release` hands everything back).
        """
        queue = self._queue(delivery)
        if self.transport == "socket":
            with self._sockets_lock:
                sock = self._sockets.get(queue)
            if sock is not None and sock.hand_back(delivery.job_id, delivery.wire.get("connection")):
                log.info("item %s handed back: work socket closed, re-queued now", delivery.job_id)
                return
        log.info("item %s handed back: its lease lapses", delivery.job_id)

    def release(self, queue: str | None = None) -> None:
        """Close the work socket of ``queue`` (all when ``None``): the server re-queues every
        item still leased to it immediately. Only for items that are not running, e.g. at
        shutdown. A no-op over HTTP."""
        with self._sockets_lock:
            names = [queue] if queue is not None else list(self._sockets)
            sockets = [self._sockets[name] for name in names if name in self._sockets]
        for sock in sockets:
            sock.close()

    def item_status(self, queue: str, item_id: str) -> ItemStatus:
        """Read an item back for reconciliation: ``GET /<queue>/items/<id>``.

        An assumption: the worker document names no read path. The reply is expected to
        carry at least ``status`` (``pending``/``processing``/``finished``/``failed``) and,
        once finished, ``result``. Retried like a report (a read is safe to repeat).
        """
        path = self._path("items.get", queue, item_id)
        data = self._retrying(lambda _n: self._call("GET", "items.get", path, None, job_id=item_id))
        return self._parse(ItemStatus, data, endpoint="items.get")

    def close(self) -> None:
        """Close the HTTP session and every work socket (which re-queues what is leased on it)."""
        self.release()
        super().close()

    # -- plumbing ------------------------------------------------------------------------
    def _claim_one(self, queue: str, criteria: dict[str, Any] | None) -> Delivery | str | None:
        if self.transport == "socket":
            try:
                item, connection = self._socket(queue).claim(self.worker_id, criteria)
            except _socket_transport().UnreadableItemError as err:
                return self._unusable_claim(queue, {"id": err.item_id, "item": err.item}, err,
                                            connection=err.connection)
            if item is None:
                return None
            return self._delivery(queue, item.id, item.item, item.attempts, item.lease, connection)
        body = ClaimRequest(worker=self.worker_id, criteria=criteria).model_dump(exclude_none=True)
        data = self._call("POST", "claim", self._path("claim", queue), body)
        try:
            answer = self._parse(ClaimAnswer, data, endpoint="claim").require_item("claim")
        except ProtocolViolationError as err:
            return self._unusable_claim(queue, data, err)
        if answer.empty or answer.id is None or answer.attempts is None:
            return None
        return self._delivery(queue, answer.id, answer.item, answer.attempts, answer.lease, None)

    def _unusable_claim(self, queue: str, data: dict[str, Any], err: ProtocolViolationError, *,
                        connection: str | None = None) -> Delivery | str:
        """A claim answer with an item we cannot fully read. With a usable id it becomes a
        Delivery carrying ``invalid``, so the runtime finishes the item with an
        in-band error result (a definite outcome); without one it cannot be reported at
        all and is left to its lease's lapse, which re-queues it: returns what it lacks."""
        raw_id = data.get("id")
        item_id = str(raw_id) if isinstance(raw_id, str | int) and not isinstance(raw_id, bool) else ""
        if not item_id:
            log.error("claim on %s returned an item without a usable id (%s); it cannot be reported and "
                      "returns to the queue when its lease lapses", queue, err)
            return "no item id" if raw_id is None else f"an unusable item id ({type(raw_id).__name__})"
        log.error("item %s claimed from %s is malformed (%s); it is finished with an error result", item_id,
                  queue, err)
        wire: dict[str, Any] = {"queue": queue, "transport": self.transport}
        if connection is not None:
            wire["connection"] = connection
        return Delivery(protocol=self.name, handler=queue, job_id=item_id, ledger_id=f"{item_id}:0",
                        payload=data.get("item"), wire=wire, invalid=str(err))

    def _delivery(self, queue: str, item_id: str, item: Any, attempts: int, lease: ItemLease | None,
                  connection: str | None) -> Delivery:
        wire: dict[str, Any] = {"queue": queue, "lease": lease.model_dump() if lease else None,
                                "transport": self.transport}
        if connection is not None:
            wire["connection"] = connection
        log.debug("claimed item %s (attempt %d) from %s", item_id, attempts, queue)
        return Delivery(
            protocol=self.name,
            handler=queue,
            job_id=item_id,
            ledger_id=f"{item_id}:{attempts}",  # a re-claim after a lapse is a new delivery
            attempt=attempts,
            payload=item,
            lease_expires_at=lease.expires_at if lease else None,
            wire=wire,
        )

    def _post_result(self, delivery: Delivery, record: dict[str, Any]) -> ReportReceipt:
        queue, item_id = self._queue(delivery), delivery.job_id
        maybe_applied = False

        def attempt(_number: int) -> tuple[bool, str | None]:
            nonlocal maybe_applied
            try:
                if self.transport == "socket":
                    ack = self._socket(queue).result(item_id, record)
                    return ack.accepted, ack.status
                data = self._call("POST", "result", self._path("result", queue, item_id), record,
                                  job_id=item_id)
                answer = self._parse(ResultAnswer, data, endpoint="result")
                return answer.accepted, answer.status
            except ServerUnavailableError as err:
                maybe_applied = maybe_applied or err.ambiguous
                raise

        accepted, status = self._retrying(attempt)
        if accepted:
            return ReportReceipt(accepted=True, status=status)
        if maybe_applied:
            # An earlier try may have finished the item with this very result, and then
            # the retry is refused as "finished": read the item back to tell.
            receipt = self._reconcile(queue, item_id, record)
            if receipt is not None:
                return receipt
        raise ResultNotAcceptedError(server_text(status or "terminal", (self._secret(),), limit=80),
                                     endpoint="result", job_id=item_id)

    def _reconcile(self, queue: str, item_id: str, record: dict[str, Any]) -> ReportReceipt | None:
        try:
            current = self.item_status(queue, item_id)
        except ProtocolError as err:
            log.warning("could not read item %s back to reconcile its result: %s", item_id, err)
            return None
        if current.status == "finished" and current.result == json.loads(json.dumps(record)):
            return ReportReceipt(accepted=True, status=current.status, already_applied=True,
                                 detail={"reconciled": True, "item_status": current.status})
        return None

    def _lease(self, delivery: Delivery) -> Lease:
        if self._lease_voided(delivery):
            raise LeaseRefusedError("socket_closed", action="leave", endpoint="work", job_id=delivery.job_id)
        return Lease(expires_at=delivery.lease_expires_at, attempt=delivery.attempt, renewable=False)

    def _lease_voided(self, delivery: Delivery) -> bool:
        """True when the item was claimed on one of our sockets that has closed since."""
        connection = delivery.wire.get("connection")
        if connection is None:
            return False
        with self._sockets_lock:
            sock = self._sockets.get(self._queue(delivery))
        return sock is not None and sock.is_lost(connection)

    def _socket(self, queue: str) -> ClaimQueueSocket:
        with self._sockets_lock:
            sock = self._sockets.get(queue)
            if sock is None:
                base = self.base_url
                scheme = "wss" if base.startswith("https://") else "ws"
                url = scheme + base[base.index("://"):] + self._path("work", queue)
                sock = _socket_transport().ClaimQueueSocket(
                    url, self._token, connect_timeout=self._connect_timeout, read_timeout=self._read_timeout,
                    proxy=self._transport.proxy)
                self._sockets[queue] = sock
            return sock

    def _call(self, method: str, endpoint: str, path: str, body: Any, *, job_id: str = "") -> dict[str, Any]:
        response = self._transport.request(method, path, endpoint=endpoint, json_body=body,
                                      headers={"Authorization": f"Bearer {self._secret()}"})
        return raise_for_answer(response.status, _decode(response), endpoint=endpoint, job_id=job_id,
                                 retry_after=response.retry_after,
                                 secrets=(self._secret(),))

    @staticmethod
    def _parse(model: type[M], data: dict[str, Any], *, endpoint: str) -> M:
        try:
            return model.model_validate(data)
        except ValidationError as err:
            # `from None`: pydantic's error quotes the answer, item payload included.
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(answer)'}: {e['msg']}"
                                 for e in err.errors(include_input=False, include_url=False)[:5])
            raise ProtocolViolationError(f"malformed {endpoint} answer ({problems})", endpoint=endpoint,
                                         status=200) from None

    @staticmethod
    def _path(key: str, queue: str, item_id: str | None = None) -> str:
        return _PATHS[key].format(queue=path_segment(queue), id=path_segment(item_id or ""))

    @staticmethod
    def _queue(delivery: Delivery) -> str:
        queue = delivery.wire.get("queue")
        return queue if isinstance(queue, str) else delivery.handler


def _decode(response: HttpResponse) -> Any:
    """The body as JSON, or None: an error status may come with any body at all."""
    try:
        return response.json_or_none()
    except ProtocolViolationError:
        return None
