"""Fixtures shared by every tier: sandboxes on loopback and retries without backoff."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import stamina

from serverless_worker.sandbox import create_sandbox
from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin
from serverless_worker.waits import allow_waits
from support.clock import SANDBOX_MODULES, SandboxClock, TickClock

PROTOCOLS = ("pipelogiq", "priostack", "claimqueue")
# The deployed tier needs LocalStack and a SAM build: only `make test-deployed` collects it.
collect_ignore = [] if os.environ.get("SWTEST_DEPLOYED_TIER") == "1" else ["deployed"]
CHECKOUT = Path(__file__).resolve().parents[1]


def _state_files_in_checkout() -> set[str]:
    """The local runner's state files at the checkout's top: its default directory and any
    SQLite file (with its lock) a ``--state`` put there."""
    return {entry.name for entry in os.scandir(CHECKOUT)
            if entry.name == ".serverless-worker" or ".sqlite3" in entry.name}


@pytest.fixture(autouse=True)
def _no_state_file_in_the_checkout() -> Iterator[None]:
    """A test keeps a worker's state in its temporary directory, never in the checkout (where
    it would be committed, or read by the next run). Under ``-n`` the test that wrote one may
    be another running at the same time; either way the failure names the file."""
    before = _state_files_in_checkout()
    yield
    written = _state_files_in_checkout() - before
    assert not written, f"a state file was written into the checkout {CHECKOUT}: {sorted(written)}"


@pytest.fixture(autouse=True)
def _package_log_level_reset() -> Iterator[None]:
    """A test that runs as in Lambda may set the package logger's level; the next starts unset."""
    yield
    logging.getLogger("serverless_worker").setLevel(logging.NOTSET)


@pytest.fixture(autouse=True)
def _no_backoff() -> Iterator[None]:
    """Retries keep their attempt counts but skip the sleeps."""
    stamina.set_testing(True, attempts=6)
    yield
    stamina.set_testing(False)


@pytest.fixture(autouse=True)
def _waits_allowed() -> Iterator[None]:
    """A test that abandoned the process's retry waits (``waits.abandon_waits``) leaves them allowed."""
    yield
    allow_waits()


@pytest.fixture
def serve() -> Iterator[Callable[..., SandboxServer]]:
    """Start a sandbox on a free loopback port: ``serve("pipelogiq", lease_seconds=3)``."""
    servers: list[SandboxServer] = []

    def _serve(protocol: str, **config: Any) -> SandboxServer:
        server = SandboxServer(create_sandbox(protocol, **config)).start()
        servers.append(server)
        return server

    yield _serve
    for server in servers:
        server.stop()


@pytest.fixture
def sandbox_clock(monkeypatch: pytest.MonkeyPatch) -> SandboxClock:
    """The sandboxes' clock, moved by the test (``sandbox_clock.advance(seconds)``) to let a
    lease or session lapse on the server without sleeping."""
    clock = SandboxClock()
    for module in SANDBOX_MODULES:
        monkeypatch.setattr(f"{module}.time", clock)
    return clock


@pytest.fixture
def tick_clock() -> TickClock:
    """The client side's clock, moved only by the waits of the code under test
    (``tick_clock.sleep``, noted in ``tick_clock.waits``) and by ``tick_clock.advance``: pass
    it as a Scheduler's or a store's clock, and its ``sleep`` as the waits, so a window or a
    deadline is counted in the code's own time, never the loaded machine's."""
    return TickClock()


@pytest.fixture
def admin_for() -> Iterator[Callable[[SandboxServer], SandboxAdmin]]:
    admins: list[SandboxAdmin] = []

    def _admin(server: SandboxServer) -> SandboxAdmin:
        admin = SandboxAdmin(server.url)
        admins.append(admin)
        return admin

    yield _admin
    for admin in admins:
        admin.close()
