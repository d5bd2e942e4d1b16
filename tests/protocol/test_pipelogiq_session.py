"""Pipelogiq sessions and credentials: bootstrap, re-bootstrap, expiry, the credential
table per endpoint, heartbeat, events and shutdown (docs/protocols.md)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
from pydantic import SecretStr, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from serverless_worker.errors import (
    ConfigurationError,
    ForbiddenError,
    InvalidApiKeyError,
    ProtocolViolationError,
    SessionExpiredError,
)
from serverless_worker.model import Delivery, Outcome, OutcomeKind, SessionState
from serverless_worker.protocols import protocol_class
from serverless_worker.protocols.base import PullRequest, WorkerEvent, WorkerIdentity, WorkerStatus
from serverless_worker.protocols.pipelogiq import PipelogiqClient
from serverless_worker.protocols.pipelogiq_models import BootstrapResponse
from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin
from serverless_worker.sandbox.pipelogiq import PipelogiqSandbox
from support.clock import SandboxClock
from support.pipelogiq import overview

KEY = "sandbox-api-key"
OTHER_KEY = "other-application-key"
KEYS = {KEY: 12, OTHER_KEY: 13}


@pytest.fixture
def server(serve: Callable[..., SandboxServer]) -> SandboxServer:
    return serve("pipelogiq", api_keys=KEYS, lease_seconds=5, heartbeat_interval=7, offline_after=21)


@pytest.fixture
def admin(server: SandboxServer, admin_for: Callable[[SandboxServer], SandboxAdmin]) -> SandboxAdmin:
    return admin_for(server)


@pytest.fixture
def make_client(server: SandboxServer) -> Iterator[Callable[..., PipelogiqClient]]:
    clients: list[PipelogiqClient] = []

    def _make(key: str = KEY, instance: str | None = "instance-a", **kwargs: Any) -> PipelogiqClient:
        client = PipelogiqClient(server.url, key, **kwargs)
        clients.append(client)
        if instance is not None:
            client.open_session(WorkerIdentity(instance_id=instance, handlers=["echo"], version="1.2.3"))
        return client

    yield _make
    for client in clients:
        client.close()


def worker_view(server: SandboxServer, worker_id: str) -> dict[str, Any]:
    return next(w for w in overview(server)["workers"] if w["workerId"] == worker_id)


def pull_one(client: PipelogiqClient) -> Delivery:
    deliveries = client.pull(PullRequest(handler="echo", max_items=1, wait_seconds=2))
    assert len(deliveries) == 1
    return deliveries[0]


# -- bootstrap ------------------------------------------------------------------------------
def test_registry_resolves_the_client() -> None:
    assert protocol_class("pipelogiq") is PipelogiqClient
    assert (PipelogiqClient.needs_session, PipelogiqClient.has_lease, PipelogiqClient.lease_renewable,
            PipelogiqClient.supports_events) == (True, True, True, True)


def test_bootstrap_returns_and_adopts_the_session(server: SandboxServer,
                                                  make_client: Callable[..., PipelogiqClient]) -> None:
    before = time.time()
    client = make_client(session_ttl_seconds=600)
    state = client.session
    assert state is not None
    assert state.worker_id.startswith("worker-")
    assert isinstance(state.token, SecretStr) and state.token.get_secret_value()
    assert state.heartbeat_interval == 7 and state.offline_after == 21
    assert state.attributes["appId"] == "app_12"
    assert state.attributes["applicationId"] == 12
    assert state.attributes["stageNextPattern"] == "{appId}_{handler}_StageNext"
    assert state.attributes["configVersion"] == "1"
    assert before <= state.issued_at <= time.time()
    assert state.expires_at == pytest.approx(state.issued_at + 600)
    assert client.queue_for("CustomHttpHandler") == "app_12_CustomHttpHandler_StageNext"
    info = worker_view(server, state.worker_id)["info"]
    assert info["supportedHandlers"] == ["echo"] and info["workerVersion"] == "1.2.3"
    assert info["sdkVersion"].startswith("serverless-worker/")


def test_bootstrap_never_keeps_the_broker_connection_string(
        server: SandboxServer, make_client: Callable[..., PipelogiqClient]) -> None:
    broker_secret = server.sandbox.broker_secret  # type: ignore[attr-defined]
    raw = requests.post(f"{server.url}/workers/bootstrap", headers={"X-API-Key": KEY},
                        json={"workerName": "probe"}, timeout=5).json()
    assert broker_secret in raw["messageBroker"]["connectionString"]  # the server does send it
    client = make_client()
    state = client.session
    assert state is not None
    for text in (repr(state), str(state.to_record()), repr(client), str(vars(client))):
        assert broker_secret not in text and "amqp://" not in text


def test_server_stated_expiry_wins_over_the_configured_ttl(
        serve: Callable[..., SandboxServer]) -> None:
    server = serve("pipelogiq", announce_session_expiry=True, session_ttl_seconds=100)
    with PipelogiqClient(server.url, KEY, session_ttl_seconds=86400) as client:
        state = client.open_session(WorkerIdentity(instance_id="i", handlers=["echo"]))
    assert state.expires_at == pytest.approx(time.time() + 100, abs=5)


def test_use_session_adopts_a_stored_session(server: SandboxServer,
                                             make_client: Callable[..., PipelogiqClient]) -> None:
    stored = make_client().session
    assert stored is not None
    restored = SessionState.model_validate(stored.to_record())
    fresh = make_client(instance=None)
    fresh.use_session(restored)
    fresh.heartbeat(WorkerStatus(state="ready"))
    assert worker_view(server, stored.worker_id)["state"] == "ready"
    assert fresh.queue_for("echo") == "app_12_echo_StageNext"


def test_calls_needing_a_session_refuse_before_one_is_adopted(
        make_client: Callable[..., PipelogiqClient]) -> None:
    client = make_client(instance=None)
    with pytest.raises(ConfigurationError):
        client.heartbeat(WorkerStatus())
    with pytest.raises(ConfigurationError):
        client.pull(PullRequest(handler="echo", max_items=1))


def test_bootstrap_with_a_wrong_key_is_an_invalid_api_key(
        make_client: Callable[..., PipelogiqClient]) -> None:
    with pytest.raises(InvalidApiKeyError) as info:
        make_client(key="not-a-key")
    assert info.value.status == 401 and info.value.endpoint == "bootstrap"


def test_bootstrap_requires_worker_name_and_accepts_bearer(server: SandboxServer) -> None:
    missing = requests.post(f"{server.url}/workers/bootstrap", headers={"X-API-Key": KEY},
                            json={"instanceId": "x"}, timeout=5)
    assert missing.status_code == 400
    bearer = requests.post(f"{server.url}/workers/bootstrap", headers={"Authorization": f"Bearer {KEY}"},
                           json={"workerName": "w"}, timeout=5)
    assert bearer.status_code == 200
    body = bearer.json()
    # The session is also accepted as X-Worker-Token (a fact of the real server).
    beat = requests.post(f"{server.url}/workers/heartbeat",
                         headers={"X-Worker-Token": body["workerSessionToken"]},
                         json={"workerId": body["workerId"], "state": "ready"}, timeout=5)
    assert beat.status_code == 200
    unauth = requests.post(f"{server.url}/workers/bootstrap", json={"workerName": "w"}, timeout=5)
    assert (unauth.status_code, unauth.json()) == (401, {"error": "invalid api key"})


def test_application_id_must_be_a_number() -> None:
    answer = {"workerId": "w", "workerSessionToken": "t",
              "application": {"applicationId": "12", "applicationName": "a", "appId": "app_12"}}
    with pytest.raises(ValidationError):
        BootstrapResponse.model_validate(answer)
    answer["application"]["applicationId"] = 12  # type: ignore[index]
    assert BootstrapResponse.model_validate(answer).application.applicationId == 12


class _StringApplicationIdSandbox(PipelogiqSandbox):
    """A server that breaks the document: ``applicationId`` as a string."""

    async def _bootstrap(self, request: Request) -> Response:
        response = await super()._bootstrap(request)
        import json

        body = json.loads(bytes(response.body))
        body["application"]["applicationId"] = str(body["application"]["applicationId"])
        return JSONResponse(body)


def test_a_string_application_id_is_a_protocol_violation() -> None:
    with SandboxServer(_StringApplicationIdSandbox()) as server, PipelogiqClient(server.url, KEY) as client:
        with pytest.raises(ProtocolViolationError) as info:
            client.open_session(WorkerIdentity(instance_id="i", handlers=["echo"]))
        assert info.value.endpoint == "bootstrap"
        assert "applicationId" in str(info.value.__cause__)
        assert client.session is None


# -- re-bootstrap and expiry ----------------------------------------------------------------------
def test_rebootstrap_of_the_same_instance_replaces_the_token(
        server: SandboxServer, make_client: Callable[..., PipelogiqClient]) -> None:
    first = make_client(instance="shared")
    second = make_client(instance="shared")
    assert first.session is not None and second.session is not None
    assert first.session.worker_id == second.session.worker_id
    assert first.session.token.get_secret_value() != second.session.token.get_secret_value()
    with pytest.raises(SessionExpiredError, match="replaced"):
        first.heartbeat(WorkerStatus())
    second.heartbeat(WorkerStatus(state="ready"))
    assert worker_view(server, second.session.worker_id)["bootstraps"] == 2
    other = make_client(instance="another")
    assert other.session is not None and other.session.worker_id != second.session.worker_id


def test_an_expired_session_is_told_apart_and_heartbeats_do_not_extend_it(
        serve: Callable[..., SandboxServer], sandbox_clock: SandboxClock) -> None:
    server = serve("pipelogiq", session_ttl_seconds=0.8)
    with PipelogiqClient(server.url, KEY) as client:
        client.open_session(WorkerIdentity(instance_id="i", handlers=["echo"]))
        sandbox_clock.advance(0.4)
        client.heartbeat(WorkerStatus(state="ready"))  # still valid, and does not extend
        sandbox_clock.advance(0.6)
        with pytest.raises(SessionExpiredError, match="expired"):
            client.heartbeat(WorkerStatus(state="ready"))
        client.pull(PullRequest(handler="echo", max_items=1))  # pull checks only the key
        client.open_session(WorkerIdentity(instance_id="i", handlers=["echo"]))
        client.heartbeat(WorkerStatus(state="ready"))


def test_expire_session_fault_expires_it_before_the_check(
        server: SandboxServer, admin: SandboxAdmin, make_client: Callable[..., PipelogiqClient]) -> None:
    client = make_client()
    admin.faults([{"kind": "expire_session", "endpoint": "heartbeat", "count": 1}])
    with pytest.raises(SessionExpiredError, match="expired"):
        client.heartbeat(WorkerStatus())
    with pytest.raises(SessionExpiredError):
        client.send_events([WorkerEvent(event_type="x", message="y")])  # stays expired
    client.open_session(WorkerIdentity(instance_id="instance-a", handlers=["echo"]))
    client.heartbeat(WorkerStatus())


def test_a_session_used_for_another_worker_id_is_forbidden(
        make_client: Callable[..., PipelogiqClient]) -> None:
    a, b = make_client(instance="a"), make_client(instance="b")
    assert a.session is not None and b.session is not None
    a.use_session(a.session.model_copy(update={"worker_id": b.session.worker_id}))
    with pytest.raises(ForbiddenError):
        a.heartbeat(WorkerStatus())


# -- the credential table ------------------------------------------------------------------------------
def _seeded_delivery(admin: SandboxAdmin, client: PipelogiqClient, *, acquire: bool) -> Delivery:
    admin.seed({"handler": "echo", "inputs": [{"n": 1}]})
    delivery = pull_one(client)
    if acquire:
        client.acquire(delivery)
    return delivery


CallCase = Callable[[PipelogiqClient, PipelogiqClient, SandboxAdmin], Any]

# endpoint -> (call with the variant client, error with a wrong key, error with a bad session);
# None means the call succeeds because that endpoint does not check that credential.
CREDENTIAL_TABLE: dict[str, tuple[CallCase, type[Exception] | None, type[Exception] | None]] = {
    "bootstrap": (lambda c, good, adm: c.open_session(WorkerIdentity(instance_id="v", handlers=["echo"])),
                  InvalidApiKeyError, None),
    "pull": (lambda c, good, adm: c.pull(PullRequest(handler="echo", max_items=1)), InvalidApiKeyError, None),
    "lease.acquire": (lambda c, good, adm: c.acquire(_seeded_delivery(adm, good, acquire=False)),
                      None, SessionExpiredError),
    "lease.renew": (lambda c, good, adm: c.renew(_seeded_delivery(adm, good, acquire=True)),
                    None, SessionExpiredError),
    "result": (lambda c, good, adm: c.report(_seeded_delivery(adm, good, acquire=True),
                                             Outcome(kind=OutcomeKind.SUCCESS, value="ok")),
               InvalidApiKeyError, SessionExpiredError),
    "heartbeat": (lambda c, good, adm: c.heartbeat(WorkerStatus()), None, SessionExpiredError),
    "events": (lambda c, good, adm: c.send_events([WorkerEvent(event_type="t", message="m")]),
               None, SessionExpiredError),
    "shutdown": (lambda c, good, adm: c.shutdown("test"), None, SessionExpiredError),
    "ack": (lambda c, good, adm: c.acknowledge(_seeded_delivery(adm, good, acquire=False)), None, None),
    "pipelines.get": (lambda c, good, adm: c.pipeline_status(adm.seed({"handler": "echo", "inputs": [1]})
                                                             ["pipelineIds"][0]),
                      InvalidApiKeyError, None),
}


@pytest.mark.parametrize("variant", ["wrong_key", "bad_session"])
@pytest.mark.parametrize("endpoint", sorted(CREDENTIAL_TABLE))
def test_each_endpoint_checks_exactly_its_documented_credential(
        endpoint: str, variant: str, server: SandboxServer, admin: SandboxAdmin,
        make_client: Callable[..., PipelogiqClient]) -> None:
    call, wrong_key_error, bad_session_error = CREDENTIAL_TABLE[endpoint]
    good = make_client()
    assert good.session is not None
    if variant == "wrong_key":
        # The right session, the wrong key.
        probe = make_client(key="wrong-key", instance=None)
        probe.use_session(good.session)
        expected = wrong_key_error
    else:
        # The right key, a session token the server never issued.
        probe = make_client(instance=None)
        probe.use_session(good.session.model_copy(update={"token": SecretStr("never-issued")}))
        expected = bad_session_error
    if expected is None:
        call(probe, good, admin)
    else:
        with pytest.raises(expected) as info:
            call(probe, good, admin)
        assert info.value.status == 401  # type: ignore[attr-defined]
    assert admin.stats()["calls"].get(endpoint, 0) >= 1


def test_result_with_key_and_session_of_different_applications_is_forbidden(
        admin: SandboxAdmin, make_client: Callable[..., PipelogiqClient]) -> None:
    good = make_client()
    assert good.session is not None
    delivery = _seeded_delivery(admin, good, acquire=True)
    mixed = make_client(key=OTHER_KEY, instance=None)
    mixed.use_session(good.session)
    with pytest.raises(ForbiddenError):
        mixed.report(delivery, Outcome(kind=OutcomeKind.SUCCESS, value="ok"))


def test_result_401_is_classified_by_its_text(admin: SandboxAdmin,
                                             make_client: Callable[..., PipelogiqClient]) -> None:
    first = make_client(instance="same")
    delivery = _seeded_delivery(admin, first, acquire=True)
    make_client(instance="same")  # replaces first's session
    with pytest.raises(SessionExpiredError, match="replaced"):
        first.report(delivery, Outcome(kind=OutcomeKind.SUCCESS, value="ok"))


# -- heartbeat, events, shutdown ------------------------------------------------------------------------
def test_heartbeat_reports_state_and_counters(server: SandboxServer,
                                              make_client: Callable[..., PipelogiqClient]) -> None:
    client = make_client()
    assert client.session is not None
    worker_id, token = client.session.worker_id, client.session.token.get_secret_value()
    assert worker_view(server, worker_id)["state"] == "starting"
    client.heartbeat(WorkerStatus(state="ready", in_flight=2, processed=10, failed=1, uptime_seconds=12.7))
    view = worker_view(server, worker_id)
    assert view["state"] == "ready" and view["heartbeats"] == 1 and not view["offline"]
    assert view["counters"] == {"inFlightJobs": 2, "jobsProcessed": 10, "jobsFailed": 1, "uptimeSeconds": 12}
    for state in ("no-such-state", None):  # unknown or omitted keeps the previous state
        body = {"workerId": worker_id} | ({"state": state} if state else {})
        assert requests.post(f"{server.url}/workers/heartbeat", headers={"X-Worker-Session": token},
                             json=body, timeout=5).status_code == 200
    assert worker_view(server, worker_id)["state"] == "ready"
    client.heartbeat(WorkerStatus(state="draining"))
    assert worker_view(server, worker_id)["state"] == "draining"


def test_events_go_in_nonempty_batches_of_at_most_200(
        server: SandboxServer, admin: SandboxAdmin, make_client: Callable[..., PipelogiqClient]) -> None:
    client = make_client()
    assert client.session is not None
    client.send_events([])
    assert client.calls["events"] == 0
    events = [WorkerEvent(event_type="worker.tick", message=f"tick {i}", attributes={"i": i})
              for i in range(450)]
    client.send_events(events)
    assert client.calls["events"] == 3
    sizes = [r["bytes"] for r in overview(server)["requests"] if r["label"] == "events"]
    assert len(sizes) == 3 and sizes[0] > sizes[2]
    received = worker_view(server, client.session.worker_id)["events"]
    assert [e["message"] for e in received] == [f"tick {i}" for i in range(450)]
    assert received[0]["eventType"] == "worker.tick" and received[0]["level"] == "INFO"
    assert received[0]["metadata"] == {"i": 0}


def test_events_batch_limits_are_enforced_by_the_server(
        server: SandboxServer, make_client: Callable[..., PipelogiqClient]) -> None:
    client = make_client()
    assert client.session is not None
    headers = {"X-Worker-Session": client.session.token.get_secret_value()}
    event = {"level": "INFO", "eventType": "t", "message": "m"}
    for events in ([], [event] * 201):
        response = requests.post(f"{server.url}/workers/events", headers=headers,
                                 json={"workerId": client.session.worker_id, "events": events}, timeout=5)
        assert response.status_code == 400


def test_shutdown_marks_the_worker_stopped_without_revoking_the_session(
        server: SandboxServer, make_client: Callable[..., PipelogiqClient]) -> None:
    client = make_client()
    assert client.session is not None
    client.heartbeat(WorkerStatus(state="draining"))
    client.shutdown("example complete")
    view = worker_view(server, client.session.worker_id)
    assert view["state"] == "stopped" and view["shutdownReason"] == "example complete"
    client.heartbeat(WorkerStatus(state="stopped"))  # the token still works


def test_a_bootstrap_whose_answer_was_lost_is_retried_and_the_newest_token_wins(
        server: SandboxServer, admin: SandboxAdmin, make_client: Callable[..., PipelogiqClient]) -> None:
    admin.faults([{"kind": "drop_response", "endpoint": "bootstrap", "count": 1}])
    client = make_client()
    assert client.session is not None
    assert worker_view(server, client.session.worker_id)["bootstraps"] == 2
    client.heartbeat(WorkerStatus(state="ready"))  # the adopted token is the one in force


def test_reset_forgets_sessions_and_jobs(server: SandboxServer, admin: SandboxAdmin,
                                         make_client: Callable[..., PipelogiqClient]) -> None:
    client = make_client()
    admin.seed({"handler": "echo", "inputs": [1]})
    admin.reset()
    assert admin.jobs() == [] and overview(server)["workers"] == []
    with pytest.raises(SessionExpiredError, match="invalid"):
        client.heartbeat(WorkerStatus())
    assert client.pull(PullRequest(handler="echo", max_items=1)) == []


def test_pipelines_are_created_idempotently_and_read_per_application(
        server: SandboxServer, make_client: Callable[..., PipelogiqClient]) -> None:
    client = make_client()
    stages = [{"stageName": "hello", "stageHandlerName": "echo", "input": '{"message":"hello"}',
               "options": {"maxRetries": 2, "retryInterval": 5}}]
    first = client.create_pipeline("custom-http-example", stages, idempotency_key="key-1")
    again = client.create_pipeline("custom-http-example", stages, idempotency_key="key-1")
    other = client.create_pipeline("custom-http-example", stages, idempotency_key="key-2")
    assert (first["created"], again["created"], other["created"]) == (True, False, True)
    assert first["pipeline"]["id"] == again["pipeline"]["id"] != other["pipeline"]["id"]
    status = client.pipeline_status(first["pipeline"]["id"])
    assert status["status"] == "Running" and status["stages"][0]["stageName"] == "hello"
    assert len(client.pull(PullRequest(handler="echo", max_items=5))) == 2
    foreign = requests.get(f"{server.url}/pipelines/{first['pipeline']['id']}",
                           headers={"X-API-Key": OTHER_KEY}, timeout=5)
    assert foreign.status_code == 404
    bad = requests.post(f"{server.url}/pipelines/idempotent", headers={"X-API-Key": KEY},
                        json={"idempotencyKey": "k", "name": "n", "stages": [{"stageName": "s"}]}, timeout=5)
    assert bad.status_code == 400
