"""The bearer token never shows: not in any log line at DEBUG (ours, requests/urllib3,
websockets, the sandbox's), not in exception texts, not in reprs, not in URLs."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from serverless_worker.errors import (
    BadRequestError,
    ConfigurationError,
    InvalidApiKeyError,
    ProtocolError,
    ResultNotAcceptedError,
    ServerUnavailableError,
)
from serverless_worker.model import Outcome, OutcomeKind
from serverless_worker.protocols.base import PullRequest
from serverless_worker.protocols.claimqueue import ClaimQueueClient
from serverless_worker.protocols.claimqueue_models import raise_for_answer
from serverless_worker.protocols.claimqueue_socket import ClaimQueueSocket
from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin

TOKEN = "tok-Zq8vDISTINCTIVE7f3a9c"
WRONG = "tok-WRONGdistinctive11b2"
QUEUE = "resize"


@pytest.fixture
def sandbox(serve: Callable[..., SandboxServer], admin_for: Callable[[SandboxServer], SandboxAdmin]
            ) -> tuple[SandboxServer, SandboxAdmin]:
    server = serve("claimqueue", tokens=[TOKEN], lease_seconds=60)
    return server, admin_for(server)


@pytest.fixture
def clients() -> Iterator[list[ClaimQueueClient]]:
    made: list[ClaimQueueClient] = []
    yield made
    for client in made:
        client.close()


def texts_of(err: BaseException) -> list[str]:
    """str and repr of an exception and of everything chained to it."""
    out: list[str] = []
    seen: set[int] = set()
    cur: BaseException | None = err
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        out += [str(cur), repr(cur), repr(cur.args)]
        cur = cur.__cause__ or cur.__context__
    return out


def capture(raised: list[BaseException], fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception as err:
        raised.append(err)


@pytest.mark.parametrize("transport", ["http", "socket"])
def test_the_token_never_appears_in_logs_exceptions_or_reprs(sandbox, clients, caplog, transport) -> None:
    server, admin = sandbox
    admin.seed({"queue": QUEUE, "items": [{"n": i} for i in range(4)]})
    caplog.set_level(logging.DEBUG)
    raised: list[BaseException] = []

    client = ClaimQueueClient(server.url, TOKEN, worker_id="box-1", transport=transport)
    clients.append(client)
    deliveries = client.pull(PullRequest(handler=QUEUE, max_items=3))
    client.progress(deliveries[0], {"percent": 5})
    client.report(deliveries[0], Outcome(kind=OutcomeKind.SUCCESS, value={"output": 1}))
    capture(raised, lambda: client.report(deliveries[0], Outcome(kind=OutcomeKind.SUCCESS, value=2)))
    capture(raised, lambda: client.progress(deliveries[0], {"percent": 6}))
    ghost = deliveries[1].model_copy(update={"job_id": "nope"})
    capture(raised, lambda: client.report(ghost, Outcome(kind=OutcomeKind.FAILURE, message="x")))
    admin.faults([{"kind": "drop_response", "endpoint": "result", "count": 1},
                  {"kind": "error_5xx", "endpoint": "progress", "count": 1}])
    client.report(deliveries[1], Outcome(kind=OutcomeKind.BAD_INPUT, message="bad"))
    client.progress(deliveries[2], {"percent": 7})
    admin.faults([{"kind": "error_5xx", "endpoint": "*"}])
    capture(raised, lambda: client.report(deliveries[2], Outcome(kind=OutcomeKind.SUCCESS, value=3)))
    admin.clear_faults()
    client.hand_back(deliveries[2])
    client.release()
    capture(raised, lambda: client.acquire(deliveries[2]))

    wrong = ClaimQueueClient(server.url, WRONG, transport=transport)
    clients.append(wrong)
    capture(raised, lambda: wrong.pull(PullRequest(handler=QUEUE, max_items=1)))
    server_down = ClaimQueueClient("http://127.0.0.1:9", TOKEN, transport=transport,
                                   connect_timeout=0.5, read_timeout=0.5)
    clients.append(server_down)
    capture(raised, lambda: server_down.pull(PullRequest(handler=QUEUE, max_items=1)))

    assert len(raised) == (7 if transport == "socket" else 6)  # over HTTP, acquire has nothing to refuse
    texts = [text for err in raised for text in texts_of(err)]
    sockets = [repr(s) for s in client._sockets.values()]
    reprs = [repr(client), str(client), repr(wrong), repr(deliveries), *sockets]
    everything = "\n".join([caplog.text, *texts, *reprs, *(r.getMessage() for r in caplog.records)])
    for secret in (TOKEN, WRONG):
        assert secret not in everything
    assert "DEBUG" in caplog.text  # debug logging really was on


def test_classes_of_errors_seen_above_are_the_expected_ones(sandbox, clients) -> None:
    server, _ = sandbox
    wrong = ClaimQueueClient(server.url, WRONG)
    down = ClaimQueueClient("http://127.0.0.1:9", TOKEN, connect_timeout=0.5)
    clients += [wrong, down]

    with pytest.raises(InvalidApiKeyError):
        wrong.pull(PullRequest(handler=QUEUE, max_items=1))
    with pytest.raises(ServerUnavailableError):
        down.pull(PullRequest(handler=QUEUE, max_items=1))


def test_a_server_echoing_the_token_is_masked_in_the_error() -> None:
    body = {"ok": False, "error": f"token {TOKEN} is not allowed here"}

    for status in (200, 400, 401, 403, 404, 503, None):
        with pytest.raises(ProtocolError) as caught:
            raise_for_answer(status, body, endpoint="claim", secrets=(TOKEN,))
        assert TOKEN not in str(caught.value) and "is not allowed here" in str(caught.value)
    with pytest.raises(BadRequestError):
        raise_for_answer(None, {"type": "error", "error": "nope"}, endpoint="result")
    assert raise_for_answer(200, {"ok": True, "accepted": True}, endpoint="result") == {
        "ok": True, "accepted": True}


def test_reprs_and_configuration_errors_hide_the_token() -> None:
    client = ClaimQueueClient("http://127.0.0.1:1", TOKEN, transport="socket")
    sock = ClaimQueueSocket("ws://127.0.0.1:1/q/work", client._token)
    try:
        assert TOKEN not in repr(client) and "**********" in repr(client)
        assert TOKEN not in repr(sock) and TOKEN not in repr(vars(client)["_token"])
    finally:
        client.close()
    bad = f"{TOKEN} with space"
    with pytest.raises(ConfigurationError) as caught:
        ClaimQueueClient("http://127.0.0.1:1", bad)
    assert TOKEN not in str(caught.value)
    with pytest.raises(ConfigurationError):
        ClaimQueueClient("http://task.example.com", TOKEN)  # plain http to a non-loopback host


def test_result_not_accepted_names_item_and_status_only(sandbox, clients) -> None:
    server, admin = sandbox
    [item_id] = admin.seed({"queue": QUEUE, "items": [{"n": 1}]})
    client = ClaimQueueClient(server.url, TOKEN)
    clients.append(client)
    [delivery] = client.pull(PullRequest(handler=QUEUE, max_items=1))
    client.report(delivery, Outcome(kind=OutcomeKind.SUCCESS, value={}))

    with pytest.raises(ResultNotAcceptedError) as caught:
        client.report(delivery, Outcome(kind=OutcomeKind.SUCCESS, value={}))

    assert str(caught.value) == f"result: result for {item_id} not accepted; item is finished (HTTP 200)"
