"""Pipelogiq servers that bend one rule, through the sandbox's fault switches: an empty pull
answered at once whatever wait was asked (``ignore_wait``), a lease granted with a
``leaseExpiresAt`` without a time zone (``naive_lease_time``), and a server that rejects
every session it issues (``expire_session``): what the client and the session keeper make
of each (docs/protocols.md, "Pacing empty pulls and refusals")."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from serverless_worker.errors import ProtocolViolationError, SessionExpiredError, SessionRecoveryPausedError
from serverless_worker.protocols.base import PullRequest, WorkerIdentity, WorkerStatus
from serverless_worker.protocols.pipelogiq import PipelogiqClient
from serverless_worker.runtime.polling import answered_early
from serverless_worker.runtime.session import RECOVERY_FIRST_SECONDS, SessionKeeper
from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin
from serverless_worker.state import SqliteStateStore
from support.clock import TickClock
from support.pipelogiq import history

KEY = "sandbox-api-key"


@pytest.fixture
def server(serve: Callable[..., SandboxServer]) -> SandboxServer:
    return serve("pipelogiq", api_keys={KEY: 12})


@pytest.fixture
def admin(server: SandboxServer, admin_for: Callable[[SandboxServer], SandboxAdmin]) -> SandboxAdmin:
    return admin_for(server)


@pytest.fixture
def client(server: SandboxServer) -> Iterator[PipelogiqClient]:
    with PipelogiqClient(server.url, KEY) as client:
        yield client


def test_ignore_wait_answers_an_empty_pull_with_204_at_once(server: SandboxServer, admin: SandboxAdmin,
                                                            client: PipelogiqClient) -> None:
    # given a server that ignores waitSeconds, as the older public release does
    admin.faults([{"kind": "ignore_wait", "endpoint": "pull"}])
    client.open_session(WorkerIdentity(instance_id="at-once", handlers=["echo"]))

    # when the client long-polls an empty queue for the longest wait the protocol allows
    # (a held poll would take all 20 s; "early" is under half of it, room for a loaded machine)
    started = time.monotonic()
    got = client.pull(PullRequest(handler="echo", max_items=1, wait_seconds=20))
    took = time.monotonic() - started

    # then the empty answer is a 204, and it came back too soon to count as a held long poll
    assert got == []
    assert [p["status"] for p in admin.overview()["pulls"]] == [204]
    assert answered_early(20, took), took
    # and work waiting is still handed out (the switch changes only the empty answer)
    admin.seed({"handler": "echo", "inputs": [{"n": 1}]})
    assert len(client.pull(PullRequest(handler="echo", max_items=1, wait_seconds=5))) == 1


def test_a_lease_without_a_time_zone_is_a_protocol_violation_naming_the_value(
        admin: SandboxAdmin, client: PipelogiqClient) -> None:
    # given a server that grants leases with a leaseExpiresAt that has no time zone
    client.open_session(WorkerIdentity(instance_id="naive", handlers=["echo"]))
    admin.seed({"handler": "echo", "inputs": [{"n": 1}]})
    admin.faults([{"kind": "naive_lease_time", "endpoint": "lease.acquire"}])
    [delivery] = client.pull(PullRequest(handler="echo", max_items=1, wait_seconds=1))

    # when the worker acquires the lease
    with pytest.raises(ProtocolViolationError) as caught:
        client.acquire(delivery)

    # then the error names the value and says why the job is not run
    granted = history(admin, delivery.job_id, "lease_acquired")[0]["leaseExpiresAt"]
    assert granted.endswith("Z")
    message = str(caught.value)
    assert f"leaseExpiresAt '{granted.removesuffix('Z')}' without a time zone" in message
    assert "not run" in message and "lease.acquire" in message


def test_a_server_rejecting_fresh_sessions_is_rebootstrapped_at_a_doubling_pace(
        server: SandboxServer, admin: SandboxAdmin, client: PipelogiqClient, tmp_path: Path) -> None:
    # given a server that expires every session on its first heartbeat, and a keeper on a
    # clock the test moves (jitter at the top of each step: the bare steps)
    admin.faults([{"kind": "expire_session", "endpoint": "heartbeat"}])
    clock = TickClock()
    keeper = SessionKeeper(store=SqliteStateStore(tmp_path / "state.sqlite3"), protocol_name="pipelogiq",
                           instance="paced", identity=WorkerIdentity(instance_id="paced", handlers=["echo"]),
                           refresh_margin=0, clock=clock, rng=lambda: 1.0)
    first = keeper.ensure(client)
    assert first is not None
    beat = WorkerStatus(state="ready")
    with pytest.raises(SessionExpiredError):
        client.heartbeat(beat)

    # when recovery is asked for at once, then once each wait is over
    with pytest.raises(SessionRecoveryPausedError, match="next bootstrap is due in"):
        keeper.recover(client, failed=first)
    clock.now = first.issued_at + RECOVERY_FIRST_SECONDS
    second = keeper.recover(client, failed=first)
    assert second is not None and second.issued_at > first.issued_at
    with pytest.raises(SessionExpiredError):
        client.heartbeat(beat)
    clock.now = second.issued_at + 0.5
    with pytest.raises(SessionRecoveryPausedError):
        keeper.recover(client, failed=second)
    assert keeper.recovery_pause(second) == pytest.approx(2 * RECOVERY_FIRST_SECONDS - 0.5, abs=0.01)

    # then the server saw one bootstrap per wait, not one per rejection
    assert admin.stats()["calls"]["bootstrap"] == 2
    # and a session rejected long after its issue is replaced at once
    clock.now = second.issued_at + 3600
    assert keeper.recovery_pause(second) == 0.0
    third = keeper.recover(client, failed=second)
    assert third is not None and admin.stats()["calls"]["bootstrap"] == 3
    # as is one the server had taken before it expired it (an expiry, not a refusal loop)
    admin.clear_faults()
    client.heartbeat(beat)
    clock.now = third.issued_at + 0.1
    assert client.session_confirmed(third) and keeper.recovery_pause(third, client) == 0.0
    assert keeper.recover(client, failed=third) is not None
    assert admin.stats()["calls"]["bootstrap"] == 4
