"""A header value the server hands us is checked as the API key is: a Pipelogiq session
token holding CR LF (header injection), a NUL or a space is refused at bootstrap as a
protocol violation, and never sent."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from pydantic import SecretStr

from serverless_worker.errors import ProtocolViolationError, SessionExpiredError
from serverless_worker.model import SessionState
from serverless_worker.protocols.base import WorkerIdentity, WorkerStatus
from serverless_worker.protocols.pipelogiq import PipelogiqClient
from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin

API_KEY = "plq-session-token-test-key"
IDENTITY = WorkerIdentity(instance_id="i-1", handlers=["echo"])


@pytest.mark.parametrize("suffix", ["\r\nX-Injected: yes", "\x00", " and more", "\x1b[2J"],
                         ids=["crlf-header", "nul", "space", "escape"])
def test_a_session_token_that_cannot_be_a_header_is_refused_and_never_sent(
        serve: Callable[..., SandboxServer], admin_for: Callable[[SandboxServer], SandboxAdmin],
        suffix: str) -> None:
    server = serve("pipelogiq", api_keys={API_KEY: 12}, session_token_suffix=suffix)
    admin = admin_for(server)
    with PipelogiqClient(server.url, API_KEY) as client:
        with pytest.raises(ProtocolViolationError, match=r"workerSessionToken .* cannot be sent as the "
                                                         r"X-Worker-Session header; refused and never sent") as info:
            client.open_session(IDENTITY)
        assert info.value.endpoint == "bootstrap"
        assert client.session is None
        [issued] = server.sandbox.sessions  # type: ignore[attr-defined]
        assert issued not in str(info.value)
        with pytest.raises(Exception, match="no Pipelogiq worker session"):
            client.heartbeat(WorkerStatus())
    # one bootstrap (a protocol violation is not retried), and nothing sent with the token
    assert admin.stats()["calls"] == {"bootstrap": 1}


def test_a_stored_session_token_that_cannot_be_a_header_means_re_bootstrap(
        serve: Callable[..., SandboxServer], admin_for: Callable[[SandboxServer], SandboxAdmin]) -> None:
    server = serve("pipelogiq", api_keys={API_KEY: 12})
    admin = admin_for(server)
    with PipelogiqClient(server.url, API_KEY) as client:
        client.use_session(SessionState(worker_id="w", token=SecretStr("tok\r\nX-Injected: yes"), issued_at=0,
                                        expires_at=4e9))
        with pytest.raises(SessionExpiredError, match="re-bootstrap"):
            client.heartbeat(WorkerStatus())
        assert admin.stats()["calls"] == {}
        client.open_session(IDENTITY)  # what the runtime does on SessionExpiredError
        client.heartbeat(WorkerStatus())
    assert admin.stats()["calls"] == {"bootstrap": 1, "heartbeat": 1}
