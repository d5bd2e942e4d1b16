"""No Pipelogiq credential ever shows: not in any log line (client or sandbox, DEBUG
included), not in any exception text or its chain, not in a repr."""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import Callable, Iterator

import pytest
from pydantic import SecretStr
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from serverless_worker.errors import ProtocolViolationError, ServerlessWorkerError
from serverless_worker.model import Delivery, Outcome, OutcomeKind, SessionState
from serverless_worker.protocols.base import PullRequest, WorkerEvent, WorkerIdentity, WorkerStatus
from serverless_worker.protocols.pipelogiq import PipelogiqClient
from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin
from serverless_worker.sandbox.pipelogiq import PipelogiqSandbox

API_KEY = "plq-SECRET-apikey-7f3a9c51d2"
SANDBOX_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "serverless_worker", "starlette")


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def sandbox_logs() -> Iterator[_Collect]:
    """Everything the sandbox's loggers emit, at DEBUG, including tracebacks."""
    handler = _Collect()
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    saved = {name: logging.getLogger(name).level for name in SANDBOX_LOGGERS}
    for name in SANDBOX_LOGGERS:
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(logging.DEBUG)
    yield handler
    for name, level in saved.items():
        logging.getLogger(name).removeHandler(handler)
        logging.getLogger(name).setLevel(level)


def _exception_text(err: BaseException) -> str:
    """The error as any logger or traceback printer would show it, chain included."""
    return "".join(traceback.format_exception(err)) + repr(err) + str(err)


def test_no_secret_appears_in_logs_or_errors(serve: Callable[..., SandboxServer],
                                             admin_for: Callable[[SandboxServer], SandboxAdmin],
                                             caplog: pytest.LogCaptureFixture,
                                             sandbox_logs: _Collect) -> None:
    caplog.set_level(logging.DEBUG)
    server = serve("pipelogiq", api_keys={API_KEY: 12}, lease_seconds=2, visibility_timeout=30,
                   max_in_flight_deliveries=3)
    admin = admin_for(server)
    errors: list[BaseException] = []
    secrets: list[str] = [API_KEY, server.sandbox.broker_secret]  # type: ignore[attr-defined]

    def expect_error(call: Callable[[], object]) -> None:
        with pytest.raises(ServerlessWorkerError) as info:
            call()
        errors.append(info.value)

    admin.seed({"handler": "echo", "inputs": [{"card": "4111"}, 2, 3, 4]})
    identity = WorkerIdentity(instance_id="leaky", handlers=["echo"])
    with PipelogiqClient(server.url, API_KEY) as client, PipelogiqClient(server.url, API_KEY) as rival:
        old_session = client.open_session(identity)
        secrets.append(old_session.token.get_secret_value())
        client.heartbeat(WorkerStatus(state="ready"))
        deliveries = client.pull(PullRequest(handler="echo", max_items=4, wait_seconds=1))
        assert len(deliveries) == 3  # the fourth pull met the in-flight limit
        secrets += [d.token.get_secret_value() for d in deliveries if d.token]
        first, second, third = deliveries
        expect_error(lambda: client.pull(PullRequest(handler="echo", max_items=1)))  # 429
        client.acquire(first)
        client.renew(first)
        expect_error(lambda: client.acquire(first))  # lease_held
        admin.faults([{"kind": "drop_response", "endpoint": "result", "count": 1},
                      {"kind": "drop_response", "endpoint": "ack", "count": 1}])
        client.report(first, Outcome(kind=OutcomeKind.SUCCESS, value={"ok": True}))
        expect_error(lambda: client.acknowledge(first))  # NotFoundAfterRetryError
        expect_error(lambda: client.acknowledge(first))  # NotFoundError
        expect_error(lambda: client.report(second, Outcome(kind=OutcomeKind.SUCCESS, value="x" * 300_000)))
        expect_error(lambda: client.report(second.model_copy(update={"attempt": 0}),
                                           Outcome(kind=OutcomeKind.SUCCESS, value="x")))  # 400
        client.hand_back(second)
        client.discard(third)
        # A rival bootstrap of the same instance replaces our session token.
        new_session = rival.open_session(identity)
        secrets.append(new_session.token.get_secret_value())
        expect_error(lambda: client.heartbeat(WorkerStatus()))  # session replaced
        with PipelogiqClient(server.url, "wrong-" + API_KEY) as wrong:
            expect_error(lambda: wrong.open_session(identity))  # invalid key (which contains the real one)
        admin.faults([{"kind": "expire_session", "endpoint": "events", "count": 1}])
        expect_error(lambda: rival.send_events([WorkerEvent(event_type="t", message="m")]))  # expired
        rival.open_session(identity)
        assert rival.session is not None
        secrets.append(rival.session.token.get_secret_value())
        admin.faults([{"kind": "error_5xx", "endpoint": "*", "status": 503}])
        expect_error(lambda: rival.shutdown("bye"))
        admin.clear_faults()
        rival.shutdown("bye")
        redelivered = rival.pull(PullRequest(handler="echo", max_items=1, wait_seconds=1))
        assert [d.ledger_id for d in redelivered] == [second.ledger_id]  # the handed-back one
        secrets += [d.token.get_secret_value() for d in redelivered if d.token]
        texts = [repr(client), repr(rival), repr(old_session), str(new_session), repr(deliveries),
                 str(deliveries), first.model_dump_json(), json.dumps(admin.jobs()),
                 json.dumps(admin.stats())]

    log_text = caplog.text + "\n".join(sandbox_logs.lines)
    error_text = "\n".join(_exception_text(err) for err in errors)
    assert "http POST pull -> 200" in log_text  # DEBUG output really was captured
    assert len(errors) == 10 and "lease_held" in error_text and "replaced" in error_text
    assert len(set(secrets)) == len(secrets) >= 8
    for secret in secrets:
        assert secret not in log_text, "a secret reached a log line"
        assert secret not in error_text, "a secret reached an exception"
        for text in texts:
            assert secret not in text, "a secret reached a repr or an admin view"


def test_reprs_mask_credentials_but_records_keep_them() -> None:
    token, session_token = "delivery-token-9c1e", "session-token-77aa"
    with PipelogiqClient("http://127.0.0.1:9", API_KEY) as client:
        state = SessionState(worker_id="w", token=SecretStr(session_token), issued_at=0, expires_at=1)
        client.use_session(state)
        delivery = Delivery(protocol="pipelogiq", handler="echo", job_id="1", ledger_id="1:e",
                            token=SecretStr(token), wire={"stageId": 1})
        for text in (repr(client), str(client), repr(state), str(state), repr(delivery), str(delivery),
                     state.model_dump_json(), delivery.model_dump_json()):
            assert API_KEY not in text and session_token not in text and token not in text
        assert state.to_record()["token"] == session_token  # revealed only for storage
        assert delivery.to_record()["token"] == token


class _NoWorkerIdSandbox(PipelogiqSandbox):
    """A broken server: the bootstrap answer lacks ``workerId``. A raw pydantic error for a
    missing field quotes the whole answer, session token and broker URL included."""

    async def _bootstrap(self, request: Request) -> Response:
        response = await super()._bootstrap(request)
        body = json.loads(bytes(response.body))
        del body["workerId"]
        return JSONResponse(body)


def test_a_malformed_answer_does_not_leak_through_the_error_chain(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    sandbox = _NoWorkerIdSandbox(api_keys={API_KEY: 12})
    with (SandboxServer(sandbox) as server, PipelogiqClient(server.url, API_KEY) as client,
          pytest.raises(ProtocolViolationError) as info):
        client.open_session(WorkerIdentity(instance_id="i", handlers=["echo"]))
    [session_token] = sandbox.sessions
    text = _exception_text(info.value)
    assert "workerId" in text  # the chain still says what was wrong
    for secret in (session_token, sandbox.broker_secret, API_KEY):
        assert secret not in text and secret not in caplog.text
