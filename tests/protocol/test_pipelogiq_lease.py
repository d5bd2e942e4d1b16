"""Pipelogiq execution leases: acquire, renew, every refusal reason produced for real,
lease expiry and recovery, and reconciliation of an acquire with an unknown outcome
(docs/protocols.md)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from serverless_worker.errors import LeaseRefusedError, NotFoundError, ServerUnavailableError
from serverless_worker.model import Delivery, Outcome, OutcomeKind
from serverless_worker.protocols.base import PullRequest, WorkerIdentity
from serverless_worker.protocols.pipelogiq import PipelogiqClient
from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin
from serverless_worker.sandbox.pipelogiq import PipelogiqSandbox
from support.clock import SandboxClock
from support.pipelogiq import history
from support.waiting import wait_for

KEY, OTHER_KEY = "sandbox-api-key", "key-of-app-13"
SUCCESS = Outcome(kind=OutcomeKind.SUCCESS, value="done")


@pytest.fixture
def server(serve: Callable[..., SandboxServer]) -> SandboxServer:
    return serve("pipelogiq", api_keys={KEY: 12, OTHER_KEY: 13}, lease_seconds=1.0, visibility_timeout=30)


@pytest.fixture
def admin(server: SandboxServer, admin_for: Callable[[SandboxServer], SandboxAdmin]) -> SandboxAdmin:
    return admin_for(server)


@pytest.fixture
def make_client(server: SandboxServer) -> Iterator[Callable[..., PipelogiqClient]]:
    clients: list[PipelogiqClient] = []

    def _make(instance: str = "worker-a", key: str = KEY) -> PipelogiqClient:
        client = PipelogiqClient(server.url, key)
        client.open_session(WorkerIdentity(instance_id=instance, handlers=["echo"]))
        clients.append(client)
        return client

    yield _make
    for client in clients:
        client.close()


@pytest.fixture
def client(make_client: Callable[..., PipelogiqClient]) -> PipelogiqClient:
    return make_client()


def pull(client: PipelogiqClient, max_items: int = 1) -> list[Delivery]:
    return client.pull(PullRequest(handler="echo", max_items=max_items, wait_seconds=2))




def refusal(call: Callable[[], Any]) -> LeaseRefusedError:
    with pytest.raises(LeaseRefusedError) as info:
        call()
    return info.value


def duplicated(admin: SandboxAdmin, client: PipelogiqClient,
               body: dict[str, Any]) -> tuple[Delivery, Delivery]:
    """Seed one pipeline and take its first stage twice (the broker's duplicate delivery)."""
    admin.seed(body)
    admin.faults([{"kind": "duplicate_delivery", "endpoint": "pull", "count": 1}])
    first, second = pull(client, max_items=2)
    assert first.ledger_id == second.ledger_id
    return first, second


# -- granted ---------------------------------------------------------------------------------------
def test_acquire_grants_a_lease_with_expiry_and_attempt(admin: SandboxAdmin, client: PipelogiqClient) -> None:
    admin.seed({"handler": "echo", "inputs": [1]})
    [delivery] = pull(client)
    lease = client.acquire(delivery)
    assert lease.renewable and lease.attempt == 1
    assert lease.expires_at is not None and lease.expires_at == pytest.approx(time.time() + 1.0, abs=0.5)
    [job] = admin.jobs()
    assert job["status"] == "Running"
    assert job["executions"][0]["lease"]["workerId"] == client.session.worker_id  # type: ignore[union-attr]


def test_renew_extends_the_lease(admin: SandboxAdmin, client: PipelogiqClient,
                                 sandbox_clock: SandboxClock) -> None:
    admin.seed({"handler": "echo", "inputs": [1]})
    [delivery] = pull(client)
    first = client.acquire(delivery)
    sandbox_clock.advance(0.3)
    renewed = client.renew(delivery)
    assert first.expires_at is not None and renewed.expires_at is not None
    assert renewed.expires_at >= first.expires_at + 0.25
    sandbox_clock.advance(0.8)  # past the first expiry, within the renewed one
    assert client.renew(delivery).renewable


# -- refusals, each produced for real -----------------------------------------------------------------
def test_acquire_is_not_reentrant_lease_held(admin: SandboxAdmin, client: PipelogiqClient,
                                             make_client: Callable[..., PipelogiqClient]) -> None:
    admin.seed({"handler": "echo", "inputs": [1]})
    [delivery] = pull(client)
    client.acquire(delivery)
    again = refusal(lambda: client.acquire(delivery))
    assert (again.reason, again.action, again.job_id) == ("lease_held", "discard", delivery.job_id)
    other = refusal(lambda: make_client("worker-b").acquire(delivery))
    assert other.reason == "lease_held"


def test_renew_without_holding_the_lease_is_lease_not_acquired(
        admin: SandboxAdmin, client: PipelogiqClient, make_client: Callable[..., PipelogiqClient]) -> None:
    admin.seed({"handler": "echo", "inputs": [1]})
    [delivery] = pull(client)
    unheld = refusal(lambda: client.renew(delivery))
    assert (unheld.reason, unheld.action) == ("lease_not_acquired", "discard")
    client.acquire(delivery)
    other = refusal(lambda: make_client("worker-b").renew(delivery))
    assert other.reason == "lease_not_acquired"


def test_a_stale_execution_is_refused_after_a_failed_attempt_was_retried(
        admin: SandboxAdmin, client: PipelogiqClient) -> None:
    first, duplicate = duplicated(admin, client, {"handler": "echo", "inputs": [1],
                                                  "options": {"maxRetries": 1, "retryInterval": 0}})
    client.acquire(first)
    client.report(first, Outcome(kind=OutcomeKind.FAILURE, message="boom"))
    wait_for(lambda: history(admin, first.job_id, "retry_scheduled"))
    stale = refusal(lambda: client.acquire(duplicate))
    assert (stale.reason, stale.action) == ("stale_execution", "discard")
    [retry] = pull(client)
    assert retry.attempt == 2 and retry.ledger_id != first.ledger_id
    assert client.acquire(retry).attempt == 2


def test_a_completed_stage_of_a_running_pipeline_is_stage_not_active(
        admin: SandboxAdmin, client: PipelogiqClient) -> None:
    two_stages = {"pipelines": [{"name": "two", "stages": [
        {"stageName": "one", "stageHandlerName": "echo", "input": "1"},
        {"stageName": "two", "stageHandlerName": "later", "input": "2"}]}]}
    first, duplicate = duplicated(admin, client, two_stages)
    client.acquire(first)
    client.report(first, SUCCESS)
    wait_for(lambda: history(admin, first.job_id, "result_applied"))
    refused = refusal(lambda: client.acquire(duplicate))
    assert (refused.reason, refused.action) == ("stage_not_active", "discard")


def test_a_finished_pipeline_is_pipeline_terminal(admin: SandboxAdmin, client: PipelogiqClient) -> None:
    first, duplicate = duplicated(admin, client, {"handler": "echo", "inputs": [1]})
    client.acquire(first)
    client.report(first, Outcome(kind=OutcomeKind.BUSINESS_ERROR, error_code="NO", message="rejected"))
    wait_for(lambda: history(admin, first.job_id, "stage_failed"))
    refused = refusal(lambda: client.acquire(duplicate))
    assert (refused.reason, refused.action) == ("pipeline_terminal", "discard")


def test_an_expired_lease_awaiting_recovery_is_lease_expired(
        serve: Callable[..., SandboxServer], admin_for: Callable[[SandboxServer], SandboxAdmin],
        sandbox_clock: SandboxClock) -> None:
    server = serve("pipelogiq", lease_seconds=0.4, lease_recovery_delay=30)
    admin = admin_for(server)
    with PipelogiqClient(server.url, KEY) as client:
        client.open_session(WorkerIdentity(instance_id="i", handlers=["echo"]))
        first, duplicate = duplicated(admin, client, {"handler": "echo", "inputs": [1]})
        client.acquire(first)
        sandbox_clock.advance(0.6)
        expired = refusal(lambda: client.renew(first))
        assert (expired.reason, expired.action) == ("lease_expired", "leave")
        assert refusal(lambda: client.acquire(duplicate)).reason == "lease_expired"
        assert not history(admin, first.job_id, "lease_recovered")


def test_a_worker_of_another_application_is_application_mismatch(
        admin: SandboxAdmin, client: PipelogiqClient, make_client: Callable[..., PipelogiqClient]) -> None:
    admin.seed({"handler": "echo", "inputs": [1]})
    [delivery] = pull(client)
    foreign = make_client("foreign", key=OTHER_KEY)
    refused = refusal(lambda: foreign.acquire(delivery))
    assert (refused.reason, refused.action) == ("application_mismatch", "stop")
    assert client.acquire(delivery).renewable  # the refusal took nothing


class _NewReasonSandbox(PipelogiqSandbox):
    """A newer server with a refusal reason this client does not know."""

    def _lease_refusal(self, *args: Any) -> str | None:
        return "some_future_reason"


def test_an_unknown_refusal_reason_is_left_alone() -> None:
    with SandboxServer(_NewReasonSandbox()) as server, PipelogiqClient(server.url, KEY) as client:
        SandboxAdmin(server.url).seed({"handler": "echo", "inputs": [1]})
        client.open_session(WorkerIdentity(instance_id="i", handlers=["echo"]))
        [delivery] = pull(client)
        refused = refusal(lambda: client.acquire(delivery))
        assert (refused.reason, refused.action) == ("some_future_reason", "leave")


def test_acquire_of_an_unknown_stage_is_not_found(client: PipelogiqClient) -> None:
    ghost = Delivery(protocol="pipelogiq", handler="echo", job_id="999999", ledger_id="999999:e",
                     wire={"stageId": 999999, "executionId": "e", "pipelineId": 1})
    with pytest.raises(NotFoundError):
        client.acquire(ghost)


# -- expiry and recovery ----------------------------------------------------------------------------------
def test_lease_expiry_recovery_redispatches_a_new_attempt(
        serve: Callable[..., SandboxServer], admin_for: Callable[[SandboxServer], SandboxAdmin]) -> None:
    server = serve("pipelogiq", lease_seconds=0.5, lease_recovery_delay=0.2)
    admin = admin_for(server)
    admin.seed({"handler": "echo", "inputs": [1]})
    with PipelogiqClient(server.url, KEY) as client:
        client.open_session(WorkerIdentity(instance_id="i", handlers=["echo"]))
        [old] = pull(client)
        client.acquire(old)
        client.acknowledge(old)
        wait_for(lambda: history(admin, old.job_id, "lease_recovered"))
        [new] = pull(client)
        assert new.job_id == old.job_id and new.attempt == 2 and new.ledger_id != old.ledger_id
        assert refusal(lambda: client.renew(old)).reason == "stale_execution"
        client.acquire(new)
        client.report(old, SUCCESS)  # the lost execution finishes late: fenced
        client.report(new, Outcome(kind=OutcomeKind.SUCCESS, value="second"))
        wait_for(lambda: client.pipeline_status(new.wire["pipelineId"])["status"] == "Completed")
    [job] = admin.jobs()
    assert [e["cause"] for e in job["executions"]] == ["activation", "recovery"]
    assert job["executions"][0]["status"] == "lease_expired" and job["output"] == "second"
    fenced = [h for h in job["history"] if h["event"] == "result_fenced"]
    assert [(h["executionId"], h["reason"]) for h in fenced] == [(old.wire["executionId"], "stale_execution")]


# -- retries and reconciliation ---------------------------------------------------------------------------
def test_an_acquire_whose_answer_was_lost_is_reconciled_by_renew(
        admin: SandboxAdmin, client: PipelogiqClient) -> None:
    admin.seed({"handler": "echo", "inputs": [1]})
    [delivery] = pull(client)
    admin.faults([{"kind": "drop_response", "endpoint": "lease.acquire", "count": 1}])
    lease = client.acquire(delivery)
    assert lease.renewable and lease.attempt == 1
    events = [h["event"] for h in history(admin, delivery.job_id) if h["event"].startswith("lease")]
    assert events == ["lease_acquired", "lease_renewed"]  # never a lease_held refusal
    assert client.calls["lease.acquire"] == 1 and client.calls["lease.renew"] == 1


def test_an_acquire_that_failed_before_taking_effect_is_tried_once_more(
        admin: SandboxAdmin, client: PipelogiqClient) -> None:
    admin.seed({"handler": "echo", "inputs": [1]})
    [delivery] = pull(client)
    admin.faults([{"kind": "error_5xx", "endpoint": "lease.acquire", "status": 503, "count": 1}])
    assert client.acquire(delivery).renewable
    lease_events = [(h["event"], h.get("reason")) for h in history(admin, delivery.job_id)
                    if h["event"].startswith("lease")]
    assert lease_events == [("lease_refused", "lease_not_acquired"), ("lease_acquired", None)]
    assert client.calls["lease.acquire"] == 2 and client.calls["lease.renew"] == 1


def test_acquire_is_not_retried_when_reconciliation_fails(admin: SandboxAdmin,
                                                          client: PipelogiqClient) -> None:
    admin.seed({"handler": "echo", "inputs": [1]})
    [delivery] = pull(client)
    admin.faults([{"kind": "error_5xx", "endpoint": "*", "status": 503}])
    with pytest.raises(ServerUnavailableError):
        client.acquire(delivery)
    assert client.calls["lease.acquire"] == 1  # renew was retried; acquire never blindly


def test_renew_is_retried_on_transient_failures(admin: SandboxAdmin, client: PipelogiqClient) -> None:
    admin.seed({"handler": "echo", "inputs": [1]})
    [delivery] = pull(client)
    client.acquire(delivery)
    admin.faults([{"kind": "error_5xx", "endpoint": "lease.renew", "count": 2},
                  {"kind": "drop_response", "endpoint": "lease.renew", "count": 1}])
    assert client.renew(delivery).renewable
    assert client.calls["lease.renew"] == 4
    assert len(history(admin, delivery.job_id, "lease_renewed")) == 2
