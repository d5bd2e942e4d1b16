"""What the protocol client owns (docs/retries.md): it retries exactly the errors
``runtime/retry_owners.CLIENT_RETRIED`` names, for its policy's attempts, and makes one
attempt for anything else, against a real sandbox answering each status. The attempts are
the sandbox's per-endpoint call counts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from serverless_worker.errors import ProtocolError
from serverless_worker.protocols.http_client import DEFAULT_RETRY
from serverless_worker.protocols.priostack import PriostackClient
from serverless_worker.runtime.retry_owners import CLIENT_RETRIED
from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin

KEY = "sandbox-api-key"

# A fault on Priostack's report endpoint, and whether the client owns its retry.
FAULTS: dict[str, tuple[dict[str, Any], bool]] = {
    "503": ({"kind": "error_5xx", "status": 503}, True),
    "500": ({"kind": "error_5xx", "status": 500}, True),
    "429": ({"kind": "rate_limit"}, True),
    "400": ({"kind": "error_5xx", "status": 400}, False),
    "401": ({"kind": "error_5xx", "status": 401}, False),
    "403": ({"kind": "error_5xx", "status": 403}, False),
    "404": ({"kind": "error_5xx", "status": 404}, False),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_the_client_retries_exactly_what_it_owns(fault: str, serve: Callable[..., SandboxServer],
                                                 admin_for: Callable[[SandboxServer], SandboxAdmin]) -> None:
    # given a sandbox answering every report with the fault
    server = serve("priostack")
    admin = admin_for(server)
    rule, owned = FAULTS[fault]
    admin.faults([{**rule, "endpoint": "complete"}])
    client = PriostackClient(server.url, KEY)

    # when a report is sent
    with pytest.raises(ProtocolError) as raised:
        client.complete("1", {"done": True})
    client.close()

    # then the error is one the client owns exactly when it retried it, for the policy's attempts
    # (the tests' stamina keeps the attempt count: tests/conftest.py)
    assert isinstance(raised.value, CLIENT_RETRIED) is owned, raised.value
    assert admin.stats()["calls"]["complete"] == (DEFAULT_RETRY.attempts if owned else 1)
    assert DEFAULT_RETRY.attempts == 6
