"""Every protocol client passes a server's error text through logsafety.server_text: a
server that echoes the request (``echo_request`` fault: headers, query and body, then
control characters) gets neither the key, nor a session or delivery token, nor a raw
control character into the error the client raises or the line it logs."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable

import pytest

from serverless_worker.errors import ProtocolError
from serverless_worker.protocols.base import PullRequest, WorkerIdentity
from serverless_worker.protocols.claimqueue import ClaimQueueClient
from serverless_worker.protocols.pipelogiq import PipelogiqClient
from serverless_worker.protocols.priostack import PriostackClient
from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin

KEY = "echoed-key-0b5e77c1"
RAW = ("\x1b", "\r", "\n", "\x00", "\x9b")
ESCAPED = "\\x1b[2J\\r\\nX-Injected: yes\\x00\\x9b31m"


def _text(err: BaseException) -> str:
    return "".join(traceback.format_exception(err)) + repr(err)


def _assert_safe(err: BaseException, caplog: pytest.LogCaptureFixture, *secrets: str) -> None:
    message = str(err)
    assert "cannot handle POST" in message and ESCAPED in message and "[redacted]" in message
    for text in (_text(err), caplog.text):
        for secret in (KEY, *secrets):
            assert secret not in text
    for control in RAW:
        assert control not in message


@pytest.mark.parametrize("auth", ["header", "bearer", "query"])
@pytest.mark.parametrize("status", [400, 500])
def test_priostack(auth: str, status: int, serve: Callable[..., SandboxServer],
                   admin_for: Callable[[SandboxServer], SandboxAdmin], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    server = serve("priostack", api_keys=[KEY])
    admin_for(server).faults([{"kind": "echo_request", "endpoint": "activate", "status": status}])
    client = PriostackClient(server.url, KEY, auth=auth)  # type: ignore[arg-type]
    with client, pytest.raises(ProtocolError) as info:
        client.pull(PullRequest(handler="t", max_items=1))
    _assert_safe(info.value, caplog)


def test_pipelogiq_session_and_delivery_tokens(serve: Callable[..., SandboxServer],
                                               admin_for: Callable[[SandboxServer], SandboxAdmin],
                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    server = serve("pipelogiq", api_keys={KEY: 12})
    admin = admin_for(server)
    admin.seed({"handler": "echo", "inputs": [1]})
    with PipelogiqClient(server.url, KEY) as client:
        session = client.open_session(WorkerIdentity(instance_id="i", handlers=["echo"]))
        [delivery] = client.pull(PullRequest(handler="echo", max_items=1, wait_seconds=1))
        assert session is not None and delivery.token is not None
        tokens = (session.token.get_secret_value(), delivery.token.get_secret_value())
        admin.faults([{"kind": "echo_request", "endpoint": "lease.acquire", "status": 400},
                      {"kind": "echo_request", "endpoint": "ack", "status": 400}])
        with pytest.raises(ProtocolError) as acquire:  # the session token, in X-Worker-Session
            client.acquire(delivery)
        with pytest.raises(ProtocolError) as ack:  # the delivery token, in the body
            client.hand_back(delivery)
    _assert_safe(acquire.value, caplog, *tokens)
    _assert_safe(ack.value, caplog, *tokens)


def test_claim_queue(serve: Callable[..., SandboxServer],
                     admin_for: Callable[[SandboxServer], SandboxAdmin], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    server = serve("claimqueue", tokens=[KEY])
    admin = admin_for(server)
    admin.seed({"queue": "q", "items": [{"n": 1}]})
    admin.faults([{"kind": "echo_request", "endpoint": "claim", "status": 403}])
    with ClaimQueueClient(server.url, KEY, transport="http") as client, pytest.raises(ProtocolError) as info:
        client.pull(PullRequest(handler="q", max_items=1))
    _assert_safe(info.value, caplog)
