"""The older public Pipelogiq server (the sandbox's ``legacy`` mode, docs/protocols.md
"Older Pipelogiq servers"): the sandbox holds to what that release does, and the client
never acknowledges its deliveries away but names what the server lacks."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import requests

from serverless_worker.errors import UnsupportedServerError
from serverless_worker.protocols.base import PullRequest, WorkerIdentity
from serverless_worker.protocols.pipelogiq import PipelogiqClient
from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin
from support.pipelogiq import history, overview

KEY = "sandbox-api-key"
QUEUE = "app_12_echo_StageNext"
HEADERS = {"X-API-Key": KEY}


@pytest.fixture
def server(serve: Callable[..., SandboxServer]) -> SandboxServer:
    return serve("pipelogiq", legacy=True, visibility_timeout=30)


@pytest.fixture
def admin(server: SandboxServer, admin_for: Callable[[SandboxServer], SandboxAdmin]) -> SandboxAdmin:
    return admin_for(server)


@pytest.fixture
def client(server: SandboxServer) -> Iterator[PipelogiqClient]:
    with PipelogiqClient(server.url, KEY, read_timeout=5) as client:
        client.open_session(WorkerIdentity(instance_id="legacy", handlers=["echo"]))
        yield client


# -- the sandbox holds to the older release ------------------------------------------------------------
def test_an_empty_pull_answers_204_at_once_whatever_wait_was_asked(server: SandboxServer) -> None:
    # A read timeout far below the 20 s asked for: a server that waited would fail this call.
    answer = requests.post(f"{server.url}/jobs/pull", json={"queue": QUEUE, "waitSeconds": 20},
                           headers=HEADERS, timeout=3)
    assert answer.status_code == 204
    assert requests.post(f"{server.url}/jobs/pull", json={"queue": QUEUE, "waitSeconds": 99},
                         headers=HEADERS, timeout=3).status_code == 204  # not even range-checked


def test_a_delivery_has_the_older_shape_and_no_execution_identity(server: SandboxServer,
                                                                  admin: SandboxAdmin) -> None:
    job_id = admin.seed({"handler": "echo", "inputs": [1]})["jobIds"][0]
    answer = requests.post(f"{server.url}/jobs/pull", json={"queue": QUEUE}, headers=HEADERS, timeout=5)
    delivery = answer.json()
    assert answer.status_code == 200 and set(delivery) == {"token", "queue", "messageId", "payload", "headers"}
    payload = delivery["payload"]
    assert "executionId" not in payload and "attempt" not in payload
    assert (str(payload["stageId"]), payload["stageHandlerName"]) == (job_id, "echo")
    for path in (f"/stages/{job_id}/lease/acquire", f"/stages/{job_id}/lease/renew", f"/stages/{job_id}/result"):
        assert requests.post(server.url + path, json={}, headers=HEADERS, timeout=5).status_code == 404, path
    ack = requests.post(f"{server.url}/jobs/ack", json={"token": delivery["token"], "requeue": True}, timeout=5)
    assert (ack.status_code, ack.json()) == (200, {"status": "ok"})
    assert requests.post(f"{server.url}/jobs/ack", json={"token": delivery["token"], "requeue": False},
                         timeout=5).status_code == 404
    assert [h["event"] for h in history(admin, job_id)][-2:] == ["delivered", "requeue"]


# -- the client against it -----------------------------------------------------------------------------
def test_the_client_names_what_the_server_lacks_and_hands_every_delivery_back(
        server: SandboxServer, admin: SandboxAdmin, client: PipelogiqClient) -> None:
    job_ids = admin.seed({"handler": "echo", "inputs": [1, 2, 3]})["jobIds"]
    with pytest.raises(UnsupportedServerError) as info:
        client.pull(PullRequest(handler="echo", max_items=5, wait_seconds=20))
    assert str(info.value).startswith("deliveries carry no executionId: this server speaks a Pipelogiq "
                                      "worker protocol older than the lease API")
    for job_id in job_ids:  # never acknowledged away: each one handed back, queued again
        events = [h["event"] for h in history(admin, job_id)]
        assert events[-2:] == ["delivered", "requeue"] and "ack" not in events, events
    assert overview(server)["queues"][QUEUE] == 3 and overview(server)["inFlight"] == 0
    assert server.sandbox.calls["lease.acquire"] == 0 and server.sandbox.calls["result"] == 0
