"""Pipelogiq results: the outcome mapping of docs/outcomes.md, size caps, retries with the same
bytes, asynchronous application and fencing, stage retry options and terminal error
codes, and the result extras (docs/protocols.md)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests

from serverless_worker.errors import BadRequestError, PayloadTooLargeError
from serverless_worker.model import (
    AppendedStage,
    ContextUpdate,
    Delivery,
    Outcome,
    OutcomeKind,
    ResultExtras,
    ResultLog,
)
from serverless_worker.protocols.base import PullRequest, WorkerIdentity
from serverless_worker.protocols.pipelogiq import PipelogiqClient
from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin
from support.pipelogiq import history, job, overview
from support.waiting import wait_for

KEY = "sandbox-api-key"
RESULT_CAP, REQUEST_CAP = 262_144, 327_680


@pytest.fixture
def server(serve: Callable[..., SandboxServer]) -> SandboxServer:
    return serve("pipelogiq", lease_seconds=5, retry_interval_scale=0.01)


@pytest.fixture
def admin(server: SandboxServer, admin_for: Callable[[SandboxServer], SandboxAdmin]) -> SandboxAdmin:
    return admin_for(server)


@pytest.fixture
def client(server: SandboxServer) -> Iterator[PipelogiqClient]:
    with PipelogiqClient(server.url, KEY) as client:
        client.open_session(WorkerIdentity(instance_id="reporter", handlers=["echo"]))
        yield client


def take(client: PipelogiqClient, handler: str = "echo") -> Delivery:
    """Pull one delivery and acquire its lease."""
    [delivery] = client.pull(PullRequest(handler=handler, max_items=1, wait_seconds=3))
    client.acquire(delivery)
    return delivery




def settled(admin: SandboxAdmin, job_id: str) -> dict[str, Any]:
    """The job once its last received result was applied or fenced."""

    def done() -> dict[str, Any] | None:
        current = job(admin, job_id)
        events = [h["event"] for h in current["history"]]
        received = events.count("result_received")
        return current if received and events.count("result_applied") + events.count(
            "result_fenced") == received else None

    return wait_for(done)


def seed_one(admin: SandboxAdmin, value: Any = 1, **options: Any) -> str:
    return admin.seed({"handler": "echo", "inputs": [value], "options": options})["jobIds"][0]


# -- success -----------------------------------------------------------------------------------------
def test_a_two_stage_pipeline_completes_passing_the_previous_output(admin: SandboxAdmin,
                                                                    client: PipelogiqClient) -> None:
    created = admin.seed({"pipelines": [{"name": "two", "stages": [
        {"stageName": "first", "stageHandlerName": "echo", "input": '{"message":"hello"}'},
        {"stageName": "second", "stageHandlerName": "echo", "input": "2"}]}]})
    first = take(client)
    receipt = client.report(first, Outcome(kind=OutcomeKind.SUCCESS, value={"ok": True, "n": [1, 2]}))
    assert (receipt.accepted, receipt.status) == (True, "accepted")
    client.acknowledge(first)
    second = take(client)
    assert second.wire["prevStageOutput"] == '{"ok":true,"n":[1,2]}'
    assert second.wire["stageName"] == "second"
    client.report(second, Outcome(kind=OutcomeKind.SUCCESS, value="plain text stays as is"))
    client.acknowledge(second)
    pipeline_id = created["pipelineIds"][0]
    status = wait_for(lambda: (s := client.pipeline_status(pipeline_id))["status"] == "Completed" and s)
    assert [s["status"] for s in status["stages"]] == ["Completed", "Completed"]
    assert status["stages"][1]["output"] == "plain text stays as is"


def test_202_only_queues_the_result(serve: Callable[..., SandboxServer],
                                    admin_for: Callable[[SandboxServer], SandboxAdmin]) -> None:
    server = serve("pipelogiq", result_apply_delay=0.6)
    admin = admin_for(server)
    job_id = seed_one(admin)
    with PipelogiqClient(server.url, KEY) as client:
        client.open_session(WorkerIdentity(instance_id="i", handlers=["echo"]))
        delivery = take(client)
        client.report(delivery, Outcome(kind=OutcomeKind.SUCCESS, value="x"))
        assert client.pipeline_status(delivery.wire["pipelineId"])["status"] == "Running"
        assert history(admin, job_id, "result_received") and not history(admin, job_id, "result_applied")
        wait_for(lambda: client.pipeline_status(delivery.wire["pipelineId"])["status"] == "Completed")


# -- the outcome mapping --------------------------------------------------------------------------------
def test_a_failure_always_sends_is_success_false(admin: SandboxAdmin, client: PipelogiqClient) -> None:
    job_id = seed_one(admin)
    delivery = take(client)
    client.report(delivery, Outcome(kind=OutcomeKind.FAILURE, message="database down"))
    [received] = history(admin, job_id, "result_received")
    assert received["isSuccessPresent"] is True and received["isSuccess"] is False
    assert (received["errorCode"], received["retryable"], received["result"]) == (
        "HANDLER_ERROR", True, "database down")
    assert received["fields"] == sorted(["pipelineId", "stageId", "executionId", "attempt", "isSuccess",
                                         "result", "errorCode", "retryable"])


def test_an_omitted_is_success_decodes_as_false(server: SandboxServer, admin: SandboxAdmin,
                                                client: PipelogiqClient) -> None:
    job_id = seed_one(admin)
    delivery = take(client)
    body = {"pipelineId": delivery.wire["pipelineId"], "stageId": delivery.wire["stageId"],
            "executionId": delivery.wire["executionId"], "attempt": 1, "result": "looks fine"}
    response = raw_result(server, client, delivery.wire["stageId"], json.dumps(body).encode())
    assert response.status_code == 202
    [received] = history(admin, job_id, "result_received")
    assert received["isSuccessPresent"] is False and received["isSuccess"] is False
    assert settled(admin, job_id)["status"] == "Failed"


def test_a_business_error_is_rejected_for_good(admin: SandboxAdmin, client: PipelogiqClient) -> None:
    job_id = seed_one(admin, maxRetries=3, retryInterval=0)
    delivery = take(client)
    client.report(delivery, Outcome(kind=OutcomeKind.BUSINESS_ERROR, error_code="CARD_DECLINED",
                                    message="insufficient funds", value={"declineReason": "funds"}))
    [received] = history(admin, job_id, "result_received")
    assert (received["isSuccess"], received["errorCode"], received["retryable"]) == (
        False, "BUSINESS_REJECTED", False)
    assert json.loads(received["result"]) == {"code": "CARD_DECLINED", "message": "insufficient funds",
                                              "variables": {"declineReason": "funds"}}
    final = settled(admin, job_id)
    assert (final["status"], final["pipelineStatus"], len(final["executions"])) == ("Failed", "Failed", 1)


def test_bad_input_is_a_validation_error_and_not_retried(admin: SandboxAdmin,
                                                         client: PipelogiqClient) -> None:
    job_id = seed_one(admin, maxRetries=3, retryInterval=0)
    delivery = take(client)
    client.report(delivery, Outcome(kind=OutcomeKind.BAD_INPUT, message="amount: field required"))
    [received] = history(admin, job_id, "result_received")
    assert (received["errorCode"], received["retryable"]) == ("VALIDATION_ERROR", False)
    assert received["result"] == "amount: field required"
    final = settled(admin, job_id)
    assert final["status"] == "Failed" and final["errorCode"] == "VALIDATION_ERROR"


def test_retryable_cannot_override_a_terminal_error_code(admin: SandboxAdmin,
                                                         client: PipelogiqClient) -> None:
    job_id = seed_one(admin, maxRetries=3, retryInterval=0)
    delivery = take(client)
    client.report(delivery, Outcome(kind=OutcomeKind.FAILURE, error_code="BUSINESS_REJECTED"))
    [received] = history(admin, job_id, "result_received")
    assert (received["errorCode"], received["retryable"]) == ("BUSINESS_REJECTED", True)
    assert settled(admin, job_id)["status"] == "Failed"
    assert not history(admin, job_id, "retry_scheduled")


def test_a_failure_is_retried_per_stage_options_until_they_run_out(
        admin: SandboxAdmin, client: PipelogiqClient) -> None:
    job_id = seed_one(admin, maxRetries=2, retryInterval=5)  # 5 s x 0.01 scale
    seen = []
    for kind in (OutcomeKind.FAILURE, OutcomeKind.TIMEOUT, OutcomeKind.FAILURE):
        delivery = take(client)
        seen.append((delivery.attempt, delivery.ledger_id))
        code = "DB_DOWN" if kind is OutcomeKind.FAILURE else None
        client.report(delivery, Outcome(kind=kind, error_code=code))
        client.acknowledge(delivery)
        settled(admin, job_id)
    assert [attempt for attempt, _ in seen] == [1, 2, 3]
    assert len({ledger for _, ledger in seen}) == 3
    codes = [h["errorCode"] for h in history(admin, job_id, "result_received")]
    assert codes == ["DB_DOWN", "HANDLER_TIMEOUT", "DB_DOWN"]
    assert [h["afterSeconds"] for h in history(admin, job_id, "retry_scheduled")] == [0.05, 0.05]
    final = job(admin, job_id)
    assert (final["status"], final["pipelineStatus"], final["failures"]) == ("Failed", "Failed", 3)
    assert client.pull(PullRequest(handler="echo", max_items=1)) == []


def test_a_retried_stage_can_still_succeed(admin: SandboxAdmin, client: PipelogiqClient) -> None:
    job_id = seed_one(admin, maxRetries=1, retryInterval=0)
    first = take(client)
    client.report(first, Outcome(kind=OutcomeKind.TIMEOUT))
    second = take(client)
    assert second.attempt == 2
    client.report(second, Outcome(kind=OutcomeKind.SUCCESS, value="fine"))
    final = settled(admin, job_id)
    assert (final["status"], final["pipelineStatus"], final["output"]) == ("Completed", "Completed", "fine")


@pytest.mark.parametrize("kind", [OutcomeKind.NOT_STARTED, OutcomeKind.LEASE_LOST])
def test_outcomes_that_are_not_results_are_refused(admin: SandboxAdmin, client: PipelogiqClient,
                                                   kind: OutcomeKind) -> None:
    seed_one(admin)
    delivery = take(client)
    with pytest.raises(ValueError, match="not reported"):
        client.report(delivery, Outcome(kind=kind))
    assert client.calls["result"] == 0


# -- size caps ---------------------------------------------------------------------------------------------
def test_a_result_at_the_cap_is_sent_and_one_byte_more_is_refused_before_sending(
        admin: SandboxAdmin, client: PipelogiqClient) -> None:
    seed_one(admin)
    delivery = take(client)
    with pytest.raises(PayloadTooLargeError) as info:
        client.report(delivery, Outcome(kind=OutcomeKind.SUCCESS, value="x" * (RESULT_CAP + 1)))
    assert (info.value.size, info.value.limit) == (RESULT_CAP + 1, RESULT_CAP)
    with pytest.raises(PayloadTooLargeError):  # the cap counts UTF-8 bytes, not characters
        client.report(delivery, Outcome(kind=OutcomeKind.SUCCESS, value="é" * (RESULT_CAP // 2 + 1)))
    assert admin.stats()["calls"].get("result", 0) == 0
    assert client.report(delivery, Outcome(kind=OutcomeKind.SUCCESS, value="x" * RESULT_CAP)).accepted


def test_the_whole_request_cap_counts_logs_context_and_stages(admin: SandboxAdmin,
                                                              client: PipelogiqClient) -> None:
    seed_one(admin)
    delivery = take(client)
    logs = [ResultLog(message="y" * 1000, created="2025-01-01T00:00:00Z") for _ in range(100)]
    big = Outcome(kind=OutcomeKind.SUCCESS, value="x" * 250_000, extras=ResultExtras(logs=logs))
    with pytest.raises(PayloadTooLargeError) as info:
        client.report(delivery, big)
    assert info.value.limit == REQUEST_CAP and info.value.size > REQUEST_CAP
    assert admin.stats()["calls"].get("result", 0) == 0


def raw_result(server: SandboxServer, client: PipelogiqClient, stage_id: int,
               data: bytes) -> requests.Response:
    session = client.session
    assert session is not None
    return requests.post(f"{server.url}/stages/{stage_id}/result", data=data, timeout=10, headers={
        "X-API-Key": KEY, "X-Worker-Session": session.token.get_secret_value(),
        "Content-Type": "application/json"})


def test_the_server_rejects_oversize_and_malformed_results(server: SandboxServer, admin: SandboxAdmin,
                                                           client: PipelogiqClient) -> None:
    job_id = seed_one(admin)
    delivery = take(client)
    stage_id = delivery.wire["stageId"]
    base = {"pipelineId": delivery.wire["pipelineId"], "stageId": stage_id,
            "executionId": delivery.wire["executionId"], "attempt": 1, "isSuccess": True}

    def send(**changes: Any) -> int:
        return raw_result(server, client, stage_id, json.dumps({**base, **changes}).encode()).status_code

    assert send(result="x" * (RESULT_CAP + 1)) == 400
    assert send(result="x" * 1000, logs=[{"message": "z" * 330_000, "created": "t"}]) == 413
    assert send(stageId=stage_id + 1) == 400
    assert send(executionId="") == 400
    assert send(attempt=0) == 400
    assert send(isSuccess="yes") == 400
    assert not history(admin, job_id, "result_received")
    assert send(result="ok", someFutureField={"x": 1}) == 202  # unknown fields are tolerated
    assert "someFutureField" in history(admin, job_id, "result_received")[0]["fields"]


def test_a_400_from_the_server_is_a_bad_request(admin: SandboxAdmin, client: PipelogiqClient) -> None:
    seed_one(admin)
    delivery = take(client).model_copy(update={"attempt": 0})
    with pytest.raises(BadRequestError, match="attempt") as info:
        client.report(delivery, Outcome(kind=OutcomeKind.SUCCESS, value="x"))
    assert info.value.status == 400 and client.calls["result"] == 1


# -- retries with the same bytes, fencing --------------------------------------------------------------------
@pytest.mark.parametrize("faults", [
    [{"kind": "error_5xx", "endpoint": "result", "status": 503, "count": 2}],
    [{"kind": "rate_limit", "endpoint": "result", "count": 2, "retry_after": 0}],
    [{"kind": "drop_response", "endpoint": "result", "count": 1}],
], ids=["503", "429", "lost-answer"])
def test_a_report_is_retried_with_the_same_bytes(server: SandboxServer, admin: SandboxAdmin,
                                                 client: PipelogiqClient,
                                                 faults: list[dict[str, Any]]) -> None:
    job_id = seed_one(admin)
    delivery = take(client)
    admin.faults(faults)
    receipt = client.report(delivery, Outcome(kind=OutcomeKind.SUCCESS, value={"ok": 1}))
    assert receipt.accepted
    sent = [r for r in overview(server)["requests"]
            if r["label"] == "result"]
    assert len(sent) == receipt.detail["attempts"] == client.calls["result"] >= 2
    assert len({r["bodySha256"] for r in sent}) == 1
    final = settled(admin, job_id)
    assert final["status"] == "Completed" and len(final["executions"]) == 1
    applied = [h for h in final["history"] if h["event"] == "result_applied"]
    fenced = [h["reason"] for h in final["history"] if h["event"] == "result_fenced"]
    assert len(applied) == 1
    assert fenced == (["duplicate_result"] if faults[0]["kind"] == "drop_response" else [])


def test_a_second_result_for_an_execution_is_fenced(admin: SandboxAdmin, client: PipelogiqClient) -> None:
    job_id = seed_one(admin, maxRetries=2, retryInterval=0)
    delivery = take(client)
    client.report(delivery, Outcome(kind=OutcomeKind.SUCCESS, value="first"))
    client.report(delivery, Outcome(kind=OutcomeKind.FAILURE, message="second thoughts"))
    final = settled(admin, job_id)
    assert (final["status"], final["output"]) == ("Completed", "first")
    assert [h["reason"] for h in final["history"] if h["event"] == "result_fenced"] == ["duplicate_result"]


def test_a_result_without_a_lease_is_fenced(admin: SandboxAdmin, client: PipelogiqClient) -> None:
    job_id = seed_one(admin)
    [delivery] = client.pull(PullRequest(handler="echo", max_items=1))
    assert client.report(delivery, Outcome(kind=OutcomeKind.SUCCESS, value="sneaky")).accepted
    final = settled(admin, job_id)
    assert final["status"] == "Pending" and final["output"] is None
    assert [h["reason"] for h in final["history"] if h["event"] == "result_fenced"] == ["no_lease"]


# -- extras -----------------------------------------------------------------------------------------
def test_context_updates_and_tombstones_reach_later_stages_and_the_pipeline(
        admin: SandboxAdmin, client: PipelogiqClient) -> None:
    created = admin.seed({"pipelines": [{"name": "ctx", "stages": [
        {"stageName": "a", "stageHandlerName": "echo", "input": "1"},
        {"stageName": "b", "stageHandlerName": "echo", "input": "2"}]}]})
    first = take(client)
    client.report(first, Outcome(kind=OutcomeKind.SUCCESS, value="a", extras=ResultExtras(
        logs=[ResultLog(message="step a done", logLevel="INFO", created="2025-01-01T00:00:00Z")],
        context=[ContextUpdate(key="customer", value="42", valueType="string"),
                 ContextUpdate(key="temporary", value="x")])))
    second = take(client)
    assert {c["key"]: c["value"] for c in second.wire["context"]} == {"customer": "42", "temporary": "x"}
    client.report(second, Outcome(kind=OutcomeKind.SUCCESS, value="b", extras=ResultExtras(
        context=[ContextUpdate(key="temporary", isDeleted=True),
                 ContextUpdate(key="card", value="4111", isSensitive=True)])))
    received = history(admin, first.job_id, "result_received")[0]
    assert "logs" in received["fields"] and "context" in received["fields"]
    pipeline_id = created["pipelineIds"][0]
    status = wait_for(lambda: (s := client.pipeline_status(pipeline_id))["status"] == "Completed" and s)
    assert {c["key"]: c["value"] for c in status["context"]} == {"customer": "42", "card": "***"}


def test_appended_stages_run_after_the_pipeline(admin: SandboxAdmin, client: PipelogiqClient) -> None:
    job_id = seed_one(admin)
    first = take(client)
    client.report(first, Outcome(kind=OutcomeKind.SUCCESS, value="base", extras=ResultExtras(
        appended_stages=[AppendedStage(stageName="notify", stageHandlerName="echo", input='{"to":"ops"}',
                                       options={"maxRetries": 0})])))
    appended = take(client)
    assert appended.job_id != job_id and appended.payload == '{"to":"ops"}'
    assert appended.wire["stageName"] == "notify" and appended.wire["prevStageOutput"] == "base"
    client.report(appended, Outcome(kind=OutcomeKind.SUCCESS, value="sent"))
    status = wait_for(lambda: (s := client.pipeline_status(first.wire["pipelineId"]))["status"] == "Completed"
                      and s)
    assert [s["stageName"] for s in status["stages"]] == ["echo", "notify"]


def test_waiting_for_approval_parks_the_stage(admin: SandboxAdmin, client: PipelogiqClient) -> None:
    admin.seed({"pipelines": [{"name": "approve", "stages": [
        {"stageName": "ask", "stageHandlerName": "echo", "input": "1"},
        {"stageName": "after", "stageHandlerName": "echo", "input": "2"}]}]})
    first = take(client)
    client.report(first, Outcome(kind=OutcomeKind.SUCCESS, value="please approve",
                                 extras=ResultExtras(wait_for_approval=True)))
    assert history(admin, first.job_id, "result_received")[0]["isWaitingForApproval"] is True
    final = settled(admin, first.job_id)
    assert (final["status"], final["pipelineStatus"]) == ("WaitingForApproval", "WaitingForApproval")
    assert client.pull(PullRequest(handler="echo", max_items=1, wait_seconds=0.5)) == []
