"""Claim queue conformance over the ``GET /<queue>/work`` WebSocket: the raw messages
against the sandbox, the immediate re-queue when a socket drops, and the client's
socket transport end to end."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from serverless_worker.errors import (
    BadRequestError,
    InvalidApiKeyError,
    LeaseRefusedError,
    ResultNotAcceptedError,
)
from serverless_worker.model import Outcome, OutcomeKind
from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin
from support.claimqueue import QUEUE, TOKEN, ClientMaker, client_maker, events, job, pull, success
from support.waiting import wait_for


@pytest.fixture
def start(serve: Callable[..., SandboxServer], admin_for: Callable[[SandboxServer], SandboxAdmin]
          ) -> Callable[..., tuple[SandboxServer, SandboxAdmin]]:
    def _start(**config: Any) -> tuple[SandboxServer, SandboxAdmin]:
        config.setdefault("lease_seconds", 60)
        server = serve("claimqueue", **config)
        return server, admin_for(server)

    return _start


@pytest.fixture
def client_for() -> Iterator[ClientMaker]:
    with client_maker(transport="socket") as make:
        yield make


@pytest.fixture
def raw_socket() -> Iterator[Callable[..., ClientConnection]]:
    sockets: list[ClientConnection] = []

    def _open(server: SandboxServer, *, token: str | None = TOKEN, query_token: str | None = None,
              queue: str = QUEUE) -> ClientConnection:
        url = f"ws://127.0.0.1:{server.port}/{queue}/work"
        if query_token is not None:
            url += f"?token={query_token}"
        headers = {"Authorization": f"Bearer {token}"} if token is not None else None
        ws = connect(url, additional_headers=headers, open_timeout=5, legacy=True)
        sockets.append(ws)
        return ws

    yield _open
    for ws in sockets:
        ws.close()


def ask(ws: ClientConnection, message: dict[str, Any]) -> dict[str, Any]:
    ws.send(json.dumps(message))
    return json.loads(ws.recv(timeout=5))


# -- the sandbox's socket, raw -----------------------------------------------------------

def test_socket_claim_progress_result_and_empty(start, raw_socket) -> None:
    server, admin = start()
    ids = admin.seed({"queue": QUEUE, "items": [{"format": "png"}, {"format": "jpg", "width": 800}]})
    ws = raw_socket(server)

    item = ask(ws, {"claim": {"worker": "box-1", "criteria": {"format": "jpg"}}})
    progress = ask(ws, {"progress": {"id": ids[1], "value": {"percent": 40}}})
    result = ask(ws, {"result": {"id": ids[1], "value": {"output": "aGVsbG8="}}})
    again = ask(ws, {"result": {"id": ids[1], "value": {"output": "again"}}})
    empty = ask(ws, {"claim": {"worker": "box-1", "criteria": {"format": "jpg"}}})

    assert item["type"] == "item" and item["id"] == ids[1] and item["attempts"] == 1
    assert item["item"] == {"format": "jpg", "width": 800} and item["lease"]["worker"] == "box-1"
    assert progress == {"type": "progress-ack", "id": ids[1], "accepted": True, "status": "processing"}
    assert result == {"type": "result-ack", "id": ids[1], "accepted": True, "status": "finished"}
    assert again == {"type": "result-ack", "id": ids[1], "accepted": False, "status": "finished"}
    assert empty == {"type": "empty"}
    final = job(admin, ids[1])
    assert final["result"] == {"output": "aGVsbG8="} and final["progress"] == {"percent": 40}
    assert [c["via"] for c in events(admin, ids[1], "claim")] == ["socket"]


def test_socket_refusals_are_error_messages_and_the_socket_stays_open(start, raw_socket) -> None:
    server, admin = start()
    [item_id] = admin.seed({"queue": QUEUE, "items": [{"n": 1}]})
    ws = raw_socket(server)

    assert ask(ws, {"hello": {}})["type"] == "error"
    assert ask(ws, {"result": {"id": "nope", "value": {}}}) == {
        "type": "error", "error": "no such item", "id": "nope"}
    assert ask(ws, {"result": {"id": item_id, "value": [1]}})["type"] == "error"
    ws.send("{broken")
    assert json.loads(ws.recv(timeout=5))["type"] == "error"
    assert ask(ws, {"claim": {}})["id"] == item_id  # same connection still works


def test_socket_accepts_the_token_in_the_query_and_refuses_a_bad_one(start, raw_socket) -> None:
    server, admin = start()
    [item_id] = admin.seed({"queue": QUEUE, "items": [{"n": 1}]})

    ws = raw_socket(server, token=None, query_token=TOKEN)
    assert ask(ws, {"claim": {"worker": "browser"}})["id"] == item_id
    for bad in ({"token": "wrong"}, {"token": None}, {"token": None, "query_token": "wrong"}):
        with pytest.raises(InvalidStatus) as caught:
            raw_socket(server, **bad)
        assert caught.value.response.status_code == 401


def test_a_dropped_socket_requeues_its_items_immediately(start, raw_socket, client_for) -> None:
    server, admin = start(lease_seconds=60)
    ids = admin.seed({"queue": QUEUE, "items": [{"n": 1}, {"n": 2}, {"n": 3}]})
    ws = raw_socket(server)
    first = ask(ws, {"claim": {"worker": "box-1"}})
    second = ask(ws, {"claim": {"worker": "box-1"}})
    ask(ws, {"result": {"id": second["id"], "value": {"output": "done"}}})
    third = ask(ws, {"claim": {"worker": "box-1"}})

    ws.close()
    wait_for(lambda: job(admin, ids[0])["status"] == job(admin, ids[2])["status"] == "pending")

    assert (first["id"], third["id"]) == (ids[0], ids[2])
    assert job(admin, ids[1])["status"] == "finished"  # finished items stay finished
    [drop] = events(admin, ids[0], "socket_drop_requeue")
    assert drop["lease"]["worker"] == "box-1"
    [retaken] = pull(client_for(server, transport="http", worker_id="box-2"))
    assert retaken.job_id == ids[0] and retaken.attempt == 2


def test_a_socket_drop_does_not_touch_items_leased_elsewhere(start, raw_socket, client_for) -> None:
    server, admin = start()
    ids = admin.seed({"queue": QUEUE, "items": [{"n": 1}, {"n": 2}]})
    [over_http] = pull(client_for(server, transport="http"))
    ws = raw_socket(server)
    ask(ws, {"claim": {}})

    ws.close()
    wait_for(lambda: job(admin, ids[1])["status"] == "pending")

    assert over_http.job_id == ids[0] and job(admin, ids[0])["status"] == "processing"


# -- the client's socket transport -------------------------------------------------------

def test_client_socket_transport_end_to_end(start, client_for) -> None:
    server, admin = start()
    ids = admin.seed({"queue": QUEUE, "items": [
        {"format": "jpg", "width": 800}, {"format": "png"}, {"format": "jpg", "width": 100}]})
    client = client_for(server)

    got = pull(client, max_items=5, criteria={"format": "jpg"})
    for delivery in got:
        client.progress(delivery, {"percent": 50})
    good = client.report(got[0], success({"output": "x"}))
    bad = client.report(got[1], Outcome(kind=OutcomeKind.FAILURE, message="bad URL"))

    assert [d.job_id for d in got] == [ids[0], ids[2]]
    assert all(d.wire["transport"] == "socket" and d.wire["connection"] for d in got)
    assert got[0].ledger_id == f"{ids[0]}:1" and got[0].lease_expires_at > time.time() + 50
    assert good.accepted and bad.accepted
    assert job(admin, ids[0])["result"] == {"output": "x"}
    assert job(admin, ids[2])["result"] == {"error": "bad URL", "errorCode": "HANDLER_ERROR"}
    assert job(admin, ids[2])["progress"] == {"percent": 50}
    assert pull(client, max_items=3, criteria={"format": "jpg"}) == []
    assert sum(client.calls.values()) == 0  # no HTTP at all
    assert admin.stats()["calls"]["work"] == 1  # one socket, shared by every call


def test_client_socket_result_refused_once_terminal(start, client_for) -> None:
    server, admin = start()
    admin.seed({"queue": QUEUE, "items": [{"n": 1}]})
    client = client_for(server)
    [delivery] = pull(client)
    client.report(delivery, success({"output": 1}))

    with pytest.raises(ResultNotAcceptedError) as result_refused:
        client.report(delivery, success({"output": 2}))
    with pytest.raises(ResultNotAcceptedError) as progress_refused:
        client.progress(delivery, {"percent": 1})

    assert result_refused.value.item_status == progress_refused.value.item_status == "finished"


@pytest.mark.parametrize("kind", ["drop_response", "error_5xx"])
def test_client_socket_result_survives_a_dropped_socket(start, client_for, kind) -> None:
    server, admin = start()
    [item_id] = admin.seed({"queue": QUEUE, "items": [{"n": 1}]})
    client = client_for(server)
    [delivery] = pull(client)
    admin.faults([{"kind": kind, "endpoint": "result", "count": 1}])

    receipt = client.report(delivery, success({"output": "once"}))

    assert receipt.accepted
    results = events(admin, item_id, "result")
    assert [r["accepted"] for r in results].count(True) == 1
    assert {r["value"]["output"] for r in results} == {"once"}
    assert admin.stats()["calls"]["work"] == 2  # reconnected once
    if kind == "drop_response":
        assert receipt.already_applied  # applied, answer lost, retry refused, read back ours
    else:
        # closed before acting: the drop re-queued the item, and the late result still counted
        assert [h["event"] for h in job(admin, item_id)["history"]][-2:] == ["socket_drop_requeue", "result"]


def test_client_socket_pull_reclaims_after_a_dropped_claim(start, client_for) -> None:
    server, admin = start()
    [item_id] = admin.seed({"queue": QUEUE, "items": [{"n": 1}]})
    admin.faults([{"kind": "drop_response", "endpoint": "claim", "count": 1}])
    client = client_for(server)

    [delivery] = pull(client, max_items=1)

    # The first claim's answer was lost with its socket, which re-queued the item at
    # once; the client claimed again on a fresh socket.
    assert delivery.job_id == item_id and delivery.attempt == 2
    assert [h["event"] for h in job(admin, item_id)["history"]] == [
        "created", "claim", "socket_drop_requeue", "claim"]


def _seed_where_second_draw_fires(probability: float) -> int:
    """A fault-plan seed whose first draw passes and second fires (one draw per claim)."""
    for seed in range(1000):
        rng = random.Random(seed)
        if rng.random() >= probability and rng.random() < probability:
            return seed
    raise AssertionError("no such seed")


def test_client_socket_pull_drops_items_whose_socket_died_mid_pull(start, client_for) -> None:
    server, admin = start()
    ids = admin.seed({"queue": QUEUE, "items": [{"n": 1}, {"n": 2}, {"n": 3}]})
    admin.faults([{"kind": "error_5xx", "endpoint": "claim", "probability": 0.5, "count": 1}],
                 seed=_seed_where_second_draw_fires(0.5))
    client = client_for(server)

    got = pull(client, max_items=3)

    # The first claim succeeded, then the socket closed on the second: the server
    # re-queued the first item, so the batch restarted on a fresh socket.
    assert [(d.job_id, d.attempt) for d in got] == [(ids[0], 2), (ids[1], 1), (ids[2], 1)]
    assert len({d.wire["connection"] for d in got}) == 1
    assert all(client.acquire(d).expires_at == d.lease_expires_at for d in got)
    assert admin.stats()["calls"]["work"] == 2


def test_a_lease_taken_on_a_socket_that_died_since_is_refused(start, client_for) -> None:
    server, admin = start()
    ids = admin.seed({"queue": QUEUE, "items": [{"n": 1}, {"n": 2}]})
    client = client_for(server)
    [first] = pull(client)
    admin.faults([{"kind": "error_5xx", "endpoint": "claim", "count": 1}])

    got = pull(client, max_items=2)  # its first claim kills the socket `first` was leased on

    with pytest.raises(LeaseRefusedError) as refused:
        client.acquire(first)
    assert refused.value.action == "leave" and refused.value.job_id == ids[0]
    assert [(d.job_id, d.attempt) for d in got] == [(ids[0], 2), (ids[1], 1)]


def test_release_requeues_everything_on_the_socket_and_voids_the_leases(start, client_for) -> None:
    server, admin = start()
    ids = admin.seed({"queue": QUEUE, "items": [{"n": 1}, {"n": 2}]})
    client = client_for(server)
    got = pull(client, max_items=2)
    assert client.acquire(got[0]).expires_at == got[0].lease_expires_at

    client.release(QUEUE)
    wait_for(lambda: all(job(admin, i)["status"] == "pending" for i in ids))

    with pytest.raises(LeaseRefusedError):
        client.renew(got[1])
    assert [d.attempt for d in pull(client, max_items=2)] == [2, 2]  # a fresh socket


def test_hand_back_closes_the_socket_once_nothing_else_is_leased_on_it(start, client_for) -> None:
    server, admin = start()
    ids = admin.seed({"queue": QUEUE, "items": [{"n": 1}, {"n": 2}, {"n": 3}]})
    client = client_for(server)
    first, second, third = pull(client, max_items=3)
    client.report(third, success({"output": 3}))

    client.hand_back(first)  # `second` is still leased on the socket: leave it open
    # A round trip after the hand-back: the server answers it on the same, still open socket.
    client.progress(second, {"step": 1})
    assert events(admin, ids[1], "progress")[-1]["via"] == "socket"
    assert admin.stats()["calls"]["work"] == 1
    assert job(admin, ids[0])["status"] == "processing"
    client.hand_back(second)  # the last one: close, which re-queues both now
    wait_for(lambda: job(admin, ids[0])["status"] == job(admin, ids[1])["status"] == "pending")

    assert job(admin, ids[2])["status"] == "finished"


def test_client_socket_bad_token_and_server_refusals(start, client_for) -> None:
    server, admin = start()
    [item_id] = admin.seed({"queue": QUEUE, "items": [{"n": 1}]})

    with pytest.raises(InvalidApiKeyError):
        pull(client_for(server, token="wrong-token"))
    assert job(admin, item_id)["status"] == "pending"
    client = client_for(server)
    [delivery] = pull(client)
    ghost = delivery.model_copy(update={"job_id": "nope"})
    with pytest.raises(BadRequestError, match="no such item"):
        client.report(ghost, success({"output": 1}))


def test_threads_share_one_socket_one_exchange_at_a_time(start, client_for) -> None:
    server, admin = start()
    ids = admin.seed({"queue": QUEUE, "items": [{"n": i} for i in range(24)]})
    client = client_for(server)
    done: list[str] = []

    def work() -> None:
        while got := pull(client, max_items=1):
            client.progress(got[0], {"percent": 50})
            assert client.report(got[0], success({"n": got[0].payload["n"]})).accepted
            done.append(got[0].job_id)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert sorted(done) == sorted(ids)  # every item exactly once
    assert all(j["status"] == "finished" and j["attempts"] == 1 for j in admin.jobs())
    assert admin.stats()["calls"]["work"] == 1


def test_a_read_timeout_closes_the_socket_and_the_late_answer_is_never_misread(start, client_for) -> None:
    server, admin = start()
    [item_id] = admin.seed({"queue": QUEUE, "items": [{"n": 1}]})
    admin.faults([{"kind": "latency", "endpoint": "claim", "latency_ms": 600, "count": 1}])
    client = client_for(server, read_timeout=0.2)

    [delivery] = pull(client)  # the first claim timed out; its socket was closed; claimed again

    assert delivery.job_id == item_id and delivery.attempt == 1
    # The slow first claim runs now, on a socket that is gone: wait until the server has handled it.
    wait_for(lambda: admin.stats()["handled"].get("claim", 0) >= 2, what="the delayed first claim")
    assert job(admin, item_id)["status"] == "processing" and job(admin, item_id)["attempts"] == 1
    assert client.acquire(delivery).expires_at == delivery.lease_expires_at
    assert client.report(delivery, success({"output": 1})).accepted
