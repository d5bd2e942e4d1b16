"""Pipelogiq pull (long poll, every status of the pull table), delivery decoding, the
visibility timeout and acknowledgement (docs/protocols.md)."""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from serverless_worker.errors import (
    BadRequestError,
    ForbiddenError,
    InvalidApiKeyError,
    NotFoundAfterRetryError,
    NotFoundError,
    RateLimitedError,
    ServerUnavailableError,
)
from serverless_worker.model import Delivery
from serverless_worker.protocols.base import PullRequest, WorkerIdentity
from serverless_worker.protocols.pipelogiq import PipelogiqClient
from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin
from serverless_worker.sandbox.pipelogiq import PipelogiqSandbox, _Message
from support.pipelogiq import history, overview
from support.waiting import wait_for

KEY = "sandbox-api-key"
QUEUE = "app_12_echo_StageNext"


@pytest.fixture
def server(serve: Callable[..., SandboxServer]) -> SandboxServer:
    return serve("pipelogiq", api_keys={KEY: 12, "key-13": 13}, visibility_timeout=0.6, lease_seconds=5)


@pytest.fixture
def admin(server: SandboxServer, admin_for: Callable[[SandboxServer], SandboxAdmin]) -> SandboxAdmin:
    return admin_for(server)


@pytest.fixture
def client(server: SandboxServer) -> Iterator[PipelogiqClient]:
    with PipelogiqClient(server.url, KEY, read_timeout=5) as client:
        client.open_session(WorkerIdentity(instance_id="puller", handlers=["echo"]))
        yield client


def pull(client: PipelogiqClient, max_items: int = 1, wait: float = 0) -> list[Delivery]:
    return client.pull(PullRequest(handler="echo", max_items=max_items, wait_seconds=wait))




def raw_pull(server: SandboxServer, body: Any, key: str = KEY) -> requests.Response:
    return requests.post(f"{server.url}/jobs/pull", headers={"X-API-Key": key}, json=body, timeout=30)


# -- 200 -----------------------------------------------------------------------------------
def test_a_delivery_maps_to_the_neutral_model(admin: SandboxAdmin, client: PipelogiqClient) -> None:
    created = admin.seed({"handler": "echo", "inputs": [{"message": "hello"}],
                          "options": {"maxRetries": 2, "retryInterval": 5, "timeoutSeconds": 30}})
    [delivery] = pull(client, wait=2)
    [job] = admin.jobs()
    execution = job["executions"][0]
    assert delivery.protocol == "pipelogiq" and delivery.handler == "echo"
    assert delivery.job_id == created["jobIds"][0] == str(delivery.wire["stageId"])
    assert delivery.ledger_id == f"{delivery.job_id}:{execution['executionId']}"
    assert delivery.attempt == 1 and delivery.timeout_seconds == 30
    assert delivery.payload == json.dumps({"message": "hello"})  # the input string, undecoded
    assert delivery.token is not None and delivery.token.get_secret_value()
    assert delivery.wire["pipelineId"] == created["pipelineIds"][0]
    assert delivery.wire["executionId"] == execution["executionId"]
    assert delivery.wire["queue"] == QUEUE and delivery.wire["messageId"]
    assert delivery.wire["prevStageOutput"] == "" and delivery.wire["context"] == []
    assert delivery.wire["headers"]["traceparent"].startswith("00-")
    assert "token" not in json.dumps(delivery.wire)
    [delivered] = history(admin, delivery.job_id, "delivered")
    assert delivered["messageId"] == delivery.wire["messageId"]
    assert delivery.token.get_secret_value() not in json.dumps(admin.jobs())


def test_pull_takes_at_most_max_items_long_polling_only_the_first_call(
        server: SandboxServer, admin: SandboxAdmin, client: PipelogiqClient) -> None:
    admin.seed({"handler": "echo", "inputs": [1, 2, 3, 4, 5]})
    first = pull(client, max_items=3, wait=7.9)
    assert len(first) == 3
    assert [p["waitSeconds"] for p in overview(server)["pulls"]] == [7, 0, 0]
    second = pull(client, max_items=5, wait=0)
    assert len(second) == 2
    assert [p["status"] for p in overview(server)["pulls"][3:]] == [200, 200, 204]
    assert len({d.ledger_id for d in first + second}) == 5


def test_wait_is_capped_at_20_seconds(server: SandboxServer, admin: SandboxAdmin,
                                      client: PipelogiqClient) -> None:
    admin.seed({"handler": "echo", "inputs": [1]})
    assert len(pull(client, wait=45.5)) == 1
    assert overview(server)["pulls"][-1]["waitSeconds"] == 20


# -- 204 and the long poll ----------------------------------------------------------------------
def test_an_empty_queue_answers_204_at_the_deadline(server: SandboxServer, client: PipelogiqClient) -> None:
    started = time.monotonic()
    assert pull(client, wait=0) == []
    at_once = time.monotonic() - started
    started = time.monotonic()
    assert pull(client, wait=1) == []
    held = time.monotonic() - started
    # A ratio within the run, not a fixed sub-second bound: load slows both pulls alike.
    assert held >= 0.9 and at_once < held / 2, (at_once, held)
    assert [p["status"] for p in overview(server)["pulls"]] == [204, 204]


def test_the_long_poll_returns_work_published_while_waiting(admin: SandboxAdmin,
                                                            client: PipelogiqClient) -> None:
    timer = threading.Timer(0.5, lambda: admin.seed({"handler": "echo", "inputs": ["late"]}))
    timer.start()
    started = time.monotonic()
    deliveries = pull(client, wait=5)
    timer.join()
    assert len(deliveries) == 1 and deliveries[0].payload == '"late"'
    assert 0.4 <= time.monotonic() - started < 4.5  # before the 5 s deadline, however loaded


def test_the_read_timeout_exceeds_the_requested_wait(server: SandboxServer) -> None:
    with PipelogiqClient(server.url, KEY, read_timeout=0.3) as client:
        client.open_session(WorkerIdentity(instance_id="slow", handlers=["echo"]))
        started = time.monotonic()
        assert pull(client, wait=1.5) == []
        assert time.monotonic() - started >= 0.9


# -- 400, 401, 403 ---------------------------------------------------------------------------------
@pytest.mark.parametrize("body", [{"queue": QUEUE, "waitSeconds": 21}, {"queue": QUEUE, "waitSeconds": -1},
                                  {"queue": QUEUE, "waitSeconds": 1.5}, {"waitSeconds": 0}, {"queue": ""}])
def test_the_server_rejects_a_bad_queue_or_wait_with_400(server: SandboxServer, body: dict[str, Any]) -> None:
    assert raw_pull(server, body).status_code == 400


def test_a_400_becomes_bad_request(admin: SandboxAdmin, client: PipelogiqClient) -> None:
    admin.faults([{"kind": "error_5xx", "endpoint": "pull", "status": 400, "count": 1}])
    with pytest.raises(BadRequestError) as info:
        pull(client)
    assert info.value.status == 400


def test_a_wrong_key_is_401_and_pull_ignores_the_session(server: SandboxServer,
                                                        client: PipelogiqClient) -> None:
    assert raw_pull(server, {"queue": QUEUE}).status_code == 204  # no session header at all
    assert raw_pull(server, {"queue": QUEUE}, key="nope").status_code == 401
    with PipelogiqClient(server.url, "nope") as wrong:
        wrong.use_session(client.session)
        with pytest.raises(InvalidApiKeyError):
            pull(wrong)


def test_a_queue_of_another_application_is_403(server: SandboxServer, admin: SandboxAdmin,
                                              client: PipelogiqClient) -> None:
    admin.seed({"handler": "echo", "inputs": [1]})
    with PipelogiqClient(server.url, "key-13") as other:
        other.use_session(client.session)  # app_12's queue names, app 13's key
        with pytest.raises(ForbiddenError):
            pull(other)
    assert raw_pull(server, {"queue": "app_1_echo_StageNext"}).status_code == 403
    assert len(pull(client)) == 1  # nothing was taken


# -- 429 ----------------------------------------------------------------------------------------------
def test_429_at_the_in_flight_limit_returns_what_was_taken(
        serve: Callable[..., SandboxServer], admin_for: Callable[[SandboxServer], SandboxAdmin]) -> None:
    server = serve("pipelogiq", max_in_flight_deliveries=2)
    admin = admin_for(server)
    admin.seed({"handler": "echo", "inputs": [1, 2, 3]})
    with PipelogiqClient(server.url, KEY) as client:
        client.open_session(WorkerIdentity(instance_id="i", handlers=["echo"]))
        taken = pull(client, max_items=3)
        assert len(taken) == 2
        with pytest.raises(RateLimitedError) as info:
            pull(client)
        assert info.value.status == 429
        client.acknowledge(taken[0])
        assert len(pull(client)) == 1
    assert [p["status"] for p in overview(server)["pulls"]] == [200, 200, 429, 429, 200]


# -- 500 and transport failures: never retried ---------------------------------------------------------
def test_a_500_is_raised_and_never_retried(admin: SandboxAdmin, client: PipelogiqClient) -> None:
    admin.seed({"handler": "echo", "inputs": [1]})
    admin.faults([{"kind": "error_5xx", "endpoint": "pull", "status": 500, "count": 1}])
    with pytest.raises(ServerUnavailableError) as info:
        pull(client, max_items=3)
    assert info.value.status == 500
    assert admin.stats()["calls"]["pull"] == 1
    assert len(pull(client)) == 1  # nothing was lost: the fault answered before any delivery


def test_a_failure_after_some_deliveries_returns_them(admin: SandboxAdmin, client: PipelogiqClient) -> None:
    # A seed whose first draw lets the call through and whose second fails it.
    seed = next(s for s in range(1000)
                if (rng := random.Random(s)).random() >= 0.5 and rng.random() < 0.5)
    admin.seed({"handler": "echo", "inputs": [1, 2, 3]})
    admin.faults([{"kind": "error_5xx", "endpoint": "pull", "status": 500, "probability": 0.5}], seed=seed)
    deliveries = pull(client, max_items=3)
    assert len(deliveries) == 1
    assert admin.stats()["calls"]["pull"] == 2


def test_a_lost_pull_answer_is_redelivered_after_the_visibility_timeout(
        admin: SandboxAdmin, client: PipelogiqClient) -> None:
    job_id = admin.seed({"handler": "echo", "inputs": [1]})["jobIds"][0]
    admin.faults([{"kind": "drop_response", "endpoint": "pull", "count": 1}])
    with pytest.raises(ServerUnavailableError) as info:
        pull(client)
    assert info.value.ambiguous
    assert admin.stats()["calls"]["pull"] == 1  # not retried: the delivery went to nobody
    assert len(history(admin, job_id, "delivered")) == 1
    wait_for(lambda: history(admin, job_id, "visibility_requeue"))
    [delivery] = pull(client)
    assert delivery.job_id == job_id and len(history(admin, job_id, "delivered")) == 2


# -- duplicates and the visibility timeout ----------------------------------------------------------------
def test_a_duplicate_delivery_has_the_same_ledger_id_and_another_token(
        admin: SandboxAdmin, client: PipelogiqClient) -> None:
    job_id = admin.seed({"handler": "echo", "inputs": [1]})["jobIds"][0]
    admin.faults([{"kind": "duplicate_delivery", "endpoint": "pull", "count": 1}])
    first, second = pull(client, max_items=2)
    assert first.ledger_id == second.ledger_id and first.attempt == second.attempt
    assert first.token is not None and second.token is not None
    assert first.token.get_secret_value() != second.token.get_secret_value()
    fingerprints = {h["tokenFingerprint"] for h in history(admin, job_id, "delivered")}
    assert len(fingerprints) == 2


def test_an_unacknowledged_delivery_is_redelivered_and_its_old_token_is_404(
        admin: SandboxAdmin, client: PipelogiqClient) -> None:
    job_id = admin.seed({"handler": "echo", "inputs": [1]})["jobIds"][0]
    [old] = pull(client)
    assert pull(client) == []
    wait_for(lambda: history(admin, job_id, "visibility_requeue"))
    [new] = pull(client)
    assert new.ledger_id == old.ledger_id
    assert new.token is not None and old.token is not None
    assert new.token.get_secret_value() != old.token.get_secret_value()
    with pytest.raises(NotFoundError) as info:
        client.acknowledge(old)
    assert type(info.value) is NotFoundError
    client.acknowledge(new)
    assert [h["event"] for h in history(admin, job_id)][-2:] == ["delivered", "ack"]


# -- decoding ------------------------------------------------------------------------------------------------
def test_a_payload_that_cannot_be_addressed_is_never_acknowledged_away(
        server: SandboxServer, admin: SandboxAdmin, client: PipelogiqClient,
        caplog: pytest.LogCaptureFixture) -> None:
    """Given a server whose deliveries could be addressed so far, one that names no stage
    execution is left unacknowledged (never acked with requeue:false) and logged without
    its payload; the visibility timeout returns it to the queue."""
    admin.seed({"handler": "echo", "inputs": [1]})
    [good] = pull(client)
    client.acknowledge(good)
    secret_input = "do-not-log-this-input"
    admin.seed({"raw": [{"queue": QUEUE, "payload": {"pipelineId": 1, "input": secret_input}}]})
    with caplog.at_level(logging.ERROR, logger="serverless_worker"):
        assert pull(client) == []
    assert "cannot be addressed" in caplog.text and "not acknowledged" in caplog.text
    assert secret_input not in caplog.text
    assert [e["event"] for e in overview(server)["log"]] == ["delivered"]  # no ack, no requeue
    wait_for(lambda: [e["event"] for e in overview(server)["log"]] == ["delivered", "visibility_requeue"],
             what="the visibility timeout to return the message")
    assert overview(server)["queues"][QUEUE] == 1


def test_a_current_server_whose_first_deliveries_cannot_be_addressed_is_not_taken_for_an_older_one(
        server: SandboxServer, admin: SandboxAdmin, client: PipelogiqClient) -> None:
    """Given only unaddressable deliveries from the first pull on, but a server with the
    lease API (asked once: a lease call naming no execution is refused with 400, not
    404): they are broken messages, left for the visibility timeout like any other."""
    admin.seed({"raw": [{"queue": QUEUE, "payload": {"stageId": 5, "pipelineId": 1, "input": "x"}},
                        {"queue": QUEUE, "payload": {"stageId": 6, "pipelineId": 1, "input": "y"}}]})
    assert pull(client, max_items=5) == []
    assert pull(client, max_items=5) == []
    assert server.sandbox.calls["lease.renew"] == 1  # type: ignore[attr-defined]  # the probe, once
    assert [e["event"] for e in overview(server)["log"]] == ["delivered", "delivered"]  # no ack, no requeue
    assert overview(server)["inFlight"] == 2


def test_a_payload_with_an_address_but_bad_fields_becomes_an_invalid_delivery(
        admin: SandboxAdmin, client: PipelogiqClient) -> None:
    payload = {"stageId": 5, "pipelineId": 1, "executionId": "e-1", "attempt": 2, "input": 17,
               "handlerName": "echo", "context": "oops"}
    admin.seed({"raw": [{"queue": QUEUE, "payload": payload}]})
    [delivery] = pull(client)
    assert delivery.ledger_id == "5:e-1" and delivery.attempt == 2
    assert delivery.invalid is not None and "input" in delivery.invalid and "context" in delivery.invalid
    assert delivery.payload is None


def test_a_payload_sent_as_a_json_string_and_handler_name_alias_are_accepted(
        admin: SandboxAdmin, client: PipelogiqClient) -> None:
    payload = {"stageId": 7, "pipelineId": 3, "executionId": "e-7", "attempt": 1, "input": "{}",
               "handlerName": "echo", "prevStageOutput": "prev", "unknownField": True,
               "context": [{"key": "k", "value": "v", "valueType": "string", "isSensitive": False}]}
    admin.seed({"raw": [{"queue": QUEUE, "payload": json.dumps(payload)}]})
    [delivery] = pull(client)
    assert delivery.invalid is None
    assert (delivery.handler, delivery.payload, delivery.wire["prevStageOutput"]) == ("echo", "{}", "prev")
    assert delivery.wire["context"] == [
        {"key": "k", "value": "v", "valueType": "string", "isSensitive": False}]


class _TokenlessSandbox(PipelogiqSandbox):
    """A server that breaks the document: a 200 delivery without its token."""

    def _deliver(self, message: _Message) -> Response:
        response = super()._deliver(message)
        body = json.loads(bytes(response.body))
        del body["token"]
        return JSONResponse(body)

    async def _ack(self, request: Request) -> Response:  # pragma: no cover - must not be reached
        raise AssertionError("a delivery without a token cannot be acknowledged")


def test_deliveries_without_a_token_are_left_to_the_visibility_timeout(caplog: pytest.LogCaptureFixture) -> None:
    """Nothing can acknowledge a delivery without a token: none is attempted."""
    with SandboxServer(_TokenlessSandbox()) as server, PipelogiqClient(server.url, KEY) as client:
        SandboxAdmin(server.url).seed({"handler": "echo", "inputs": [1]})
        client.open_session(WorkerIdentity(instance_id="i", handlers=["echo"]))
        with caplog.at_level(logging.ERROR, logger="serverless_worker"):
            assert pull(client) == []
        assert "cannot be addressed (no delivery token)" in caplog.text
        assert server.sandbox.calls["ack"] == 0


# -- ack ----------------------------------------------------------------------------------------------------
def test_ack_answers_200_then_404(admin: SandboxAdmin, client: PipelogiqClient) -> None:
    job_id = admin.seed({"handler": "echo", "inputs": [1]})["jobIds"][0]
    [delivery] = pull(client)
    client.acknowledge(delivery)
    with pytest.raises(NotFoundError) as info:
        client.acknowledge(delivery)
    assert type(info.value) is NotFoundError and info.value.status == 404
    assert [h["event"] for h in history(admin, job_id)].count("ack") == 1


def test_ack_checks_only_the_token(server: SandboxServer) -> None:
    assert requests.post(f"{server.url}/jobs/ack", json={"token": "unknown", "requeue": False},
                         timeout=5).status_code == 404
    assert requests.post(f"{server.url}/jobs/ack", json={"requeue": False}, timeout=5).status_code == 400


def test_a_404_after_a_lost_ack_answer_is_not_found_after_retry(admin: SandboxAdmin,
                                                                client: PipelogiqClient) -> None:
    job_id = admin.seed({"handler": "echo", "inputs": [1]})["jobIds"][0]
    [delivery] = pull(client)
    admin.faults([{"kind": "drop_response", "endpoint": "ack", "count": 1}])
    with pytest.raises(NotFoundAfterRetryError):
        client.acknowledge(delivery)
    assert admin.stats()["calls"]["ack"] == 2
    assert [h["event"] for h in history(admin, job_id)].count("ack") == 1


def test_ack_is_retried_on_5xx(admin: SandboxAdmin, client: PipelogiqClient) -> None:
    job_id = admin.seed({"handler": "echo", "inputs": [1]})["jobIds"][0]
    [delivery] = pull(client)
    admin.faults([{"kind": "error_5xx", "endpoint": "ack", "count": 2},
                  {"kind": "rate_limit", "endpoint": "ack", "count": 1, "retry_after": 0}])
    client.acknowledge(delivery)
    assert admin.stats()["calls"]["ack"] == 4
    assert history(admin, job_id, "ack")


def test_hand_back_requeues_and_discard_acks(admin: SandboxAdmin, client: PipelogiqClient) -> None:
    job_id = admin.seed({"handler": "echo", "inputs": [1]})["jobIds"][0]
    [first] = pull(client)
    client.hand_back(first)
    [again] = pull(client)
    assert again.ledger_id == first.ledger_id and again.attempt == first.attempt
    client.discard(again)
    assert pull(client) == []
    assert [h["event"] for h in history(admin, job_id)][1:] == ["delivered", "requeue", "delivered", "ack"]
    job = next(j for j in admin.jobs() if j["job_id"] == job_id)
    assert len(job["executions"]) == 1  # a requeue creates no new attempt


def test_ack_without_a_token_is_a_caller_error(client: PipelogiqClient) -> None:
    delivery = Delivery(protocol="pipelogiq", handler="echo", job_id="1", ledger_id="1:e")
    with pytest.raises(ValueError, match="no delivery token"):
        client.acknowledge(delivery)
    assert client.calls["ack"] == 0
