"""CLI tier fixtures."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin
from support.local_aws import LocalAws, local_aws_server


@pytest.fixture
def local_aws() -> Iterator[LocalAws]:
    """moto's server on loopback with the stack's table and executor, fresh for each test."""
    with local_aws_server() as aws:
        yield aws


@pytest.fixture
def sandbox(request: pytest.FixtureRequest) -> Iterator[Callable[..., tuple[SandboxServer, SandboxAdmin]]]:
    """``sandbox(protocol, **config)``: a sandbox in this process (the worker is the
    subprocess) accepting only the credentials of the test module's ``SANDBOX_KEYS``."""
    from serverless_worker.sandbox import create_sandbox

    keys: dict[str, dict[str, Any]] = request.module.SANDBOX_KEYS
    started: list[tuple[SandboxServer, SandboxAdmin]] = []

    def _start(protocol: str, **config: Any) -> tuple[SandboxServer, SandboxAdmin]:
        server = SandboxServer(create_sandbox(protocol, **keys[protocol], **config)).start()
        started.append((server, SandboxAdmin(server.url)))
        return started[-1]

    yield _start
    for server, admin in started:
        admin.close()
        server.stop()
