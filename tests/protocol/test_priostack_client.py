"""PriostackClient against the Priostack sandbox on loopback: pull, report, hand back,
retries, reconciliation, registration and reads."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests

from serverless_worker.errors import (
    ConfigurationError,
    InvalidApiKeyError,
    NotFoundAfterRetryError,
    NotFoundError,
    ProtocolViolationError,
    RateLimitedError,
    ServerUnavailableError,
    UnsupportedServerError,
)
from serverless_worker.model import Delivery, Outcome, OutcomeKind
from serverless_worker.protocols import protocol_class
from serverless_worker.protocols.base import PullRequest, WorkerIdentity, WorkerStatus
from serverless_worker.protocols.priostack import PriostackClient
from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin

KEY = "sandbox-api-key"


class Env:
    """One sandbox, its admin client and a client factory."""

    def __init__(self, server: SandboxServer, admin: SandboxAdmin) -> None:
        self.server, self.admin = server, admin
        self.clients: list[PriostackClient] = []

    def client(self, **kw: Any) -> PriostackClient:
        client = PriostackClient(self.server.url, kw.pop("api_key", KEY), **kw)
        self.clients.append(client)
        return client

    def job(self, key: str) -> dict[str, Any]:
        return next(job for job in self.admin.jobs() if job["key"] == key)


@pytest.fixture
def env(serve: Callable[..., SandboxServer],
        admin_for: Callable[[SandboxServer], SandboxAdmin]) -> Iterator[Callable[..., Env]]:
    envs: list[Env] = []

    def _env(**config: Any) -> Env:
        server = serve("priostack", **config)
        made = Env(server, admin_for(server))
        envs.append(made)
        return made

    yield _env
    for made in envs:
        for client in made.clients:
            client.close()


def pull_one(client: PriostackClient, handler: str = "t") -> Delivery:
    [delivery] = client.pull(PullRequest(handler=handler, max_items=1))
    return delivery


def outcome(kind: OutcomeKind, **kw: Any) -> Outcome:
    return Outcome(kind=kind, **kw)


# -- shape and configuration ----------------------------------------------------------------
def test_registry_resolves_the_client_and_its_capabilities() -> None:
    cls = protocol_class("priostack")
    assert cls is PriostackClient
    assert (cls.name, cls.needs_session, cls.has_lease) == ("priostack", False, False)


@pytest.mark.parametrize("kw,match", [
    ({"api_key": ""}, "empty"),
    ({"api_key": "has space"}, "whitespace"),
    ({"auth": "cookie"}, "auth"),
    ({"base_url": "http://priostack.example.com"}, "plain http"),
])
def test_bad_configuration_is_refused_without_naming_the_key(kw: dict[str, Any], match: str) -> None:
    args = {"base_url": "http://127.0.0.1:9", "api_key": "k", **kw}
    with pytest.raises(ConfigurationError, match=match) as caught:
        PriostackClient(args.pop("base_url"), args.pop("api_key"), **args)
    assert "has space" not in str(caught.value)


# -- pull ----------------------------------------------------------------------------------------
def test_pull_decodes_jobs_into_deliveries(env) -> None:
    e = env()
    [key] = e.admin.seed({"jobs": [{"type": "charge", "variables": {"orderId": "ORD-1"}, "retries": 4}]})
    client = e.client()
    delivery = pull_one(client, "charge")
    assert (delivery.protocol, delivery.handler, delivery.job_id, delivery.ledger_id) == \
        ("priostack", "charge", key, f"{key}:r4")
    assert (delivery.attempt, delivery.retries_left, delivery.payload) == (1, 4, {"orderId": "ORD-1"})
    assert delivery.token is None and delivery.lease_expires_at is None
    assert delivery.created_at is None  # the server's Go zero time means "unknown"
    assert set(delivery.wire) == {"processInstanceKey", "processDefinitionKey", "type", "deadline",
                                  "createdAt", "retries"}
    assert delivery.wire["processInstanceKey"] == e.job(key)["processInstanceKey"]
    assert isinstance(delivery.wire["deadline"], int)


def test_pull_sends_the_type_and_is_bounded(env) -> None:
    e = env()
    e.admin.seed({"jobs": [{"type": "a", "count": 5}, {"type": "b", "count": 2}]})
    client = e.client()
    got = client.pull(PullRequest(handler="a", max_items=3))
    assert len(got) == 3 and {d.handler for d in got} == {"a"}
    assert {j["type"] for j in e.admin.jobs() if j["state"] == "active"} == {"a"}


def test_pull_answers_at_once_whatever_wait_seconds_says(env) -> None:
    client = env().client()
    started = time.monotonic()
    assert client.pull(PullRequest(handler="t", max_items=5, wait_seconds=20)) == []
    assert time.monotonic() - started < 10  # not the 20 s asked for


def test_pull_is_not_retried_on_a_server_error(env) -> None:
    e = env()
    e.admin.seed({"jobs": [{"type": "t"}]})
    e.admin.faults([{"kind": "error_5xx", "endpoint": "activate", "count": 1}])
    client = e.client()
    with pytest.raises(ServerUnavailableError):
        client.pull(PullRequest(handler="t", max_items=1))
    assert client.calls["activate"] == 1
    assert e.admin.stats()["calls"]["activate"] == 1


def test_a_lost_activation_strands_jobs_until_a_server_restart(env) -> None:
    e = env()
    [key] = e.admin.seed({"jobs": [{"type": "t", "retries": 2}]})
    e.admin.faults([{"kind": "drop_response", "endpoint": "activate", "count": 1}])
    client = e.client()
    with pytest.raises(ServerUnavailableError) as caught:
        client.pull(PullRequest(handler="t", max_items=1))
    assert caught.value.ambiguous
    assert client.calls["activate"] == 1              # never blindly retried
    assert e.job(key)["state"] == "active"            # stranded: nobody holds it
    assert client.pull(PullRequest(handler="t", max_items=1)) == []

    requests.post(e.server.url + "/_admin/restart", timeout=10).raise_for_status()
    delivery = pull_one(client)
    assert (delivery.job_id, delivery.retries_left) == (key, 2)


def test_a_job_with_a_numeric_key_is_never_guessed_at_and_a_server_of_them_is_named(
        env, caplog: pytest.LogCaptureFixture) -> None:
    """A numeric key could address another job: nothing is sent for it. When no job so
    far had a usable key, the pull says this server speaks another API."""
    e = env(numeric_keys=True)
    e.admin.seed({"jobs": [{"type": "t", "variables": {"card": "4111-secret-variable"}}]})
    client = e.client()
    with caplog.at_level(logging.ERROR, logger="serverless_worker.protocols.priostack"), \
            pytest.raises(UnsupportedServerError) as info:
        client.pull(PullRequest(handler="t", max_items=1))
    assert str(info.value).startswith("activated jobs carry a key that is not a JSON string (int)")
    [record] = [r for r in caplog.records if r.name == "serverless_worker.protocols.priostack"]
    assert "not a JSON string" in record.getMessage()
    assert "4111-secret-variable" not in caplog.text + str(info.value)  # variables are never logged
    assert [j["calls"] for j in e.admin.jobs()] == [[]]  # no complete or fail to any key


def test_an_unusable_key_among_good_jobs_leaves_the_good_ones_running(env) -> None:
    """Once a job had a usable key, a later one without is a broken job, not another API."""
    e = env()
    e.admin.seed({"jobs": [{"type": "t"}]})
    client = e.client()
    assert len(client.pull(PullRequest(handler="t", max_items=1))) == 1
    e.admin.seed({"jobs": [{"type": "t"}]})
    e.admin.faults([{"kind": "corrupt_delivery", "endpoint": "activate", "field": "key", "count": 1}])
    assert client.pull(PullRequest(handler="t", max_items=1)) == []


def test_a_job_with_other_invalid_fields_is_delivered_marked_invalid(env) -> None:
    e = env()
    [good, bad] = e.admin.seed({"jobs": [
        {"type": "t"},
        {"type": "t", "wire_overrides": {"processInstanceKey": 12345, "variables": [1, 2]}},
    ]})
    client = e.client()
    deliveries = {d.job_id: d for d in client.pull(PullRequest(handler="t", max_items=5))}
    assert set(deliveries) == {good, bad}
    assert deliveries[good].invalid is None and "invalid" not in deliveries[good].wire
    reason = deliveries[bad].invalid
    assert reason is not None and "invalid" not in deliveries[bad].wire
    assert "processInstanceKey" in reason and "variables" in reason
    assert deliveries[bad].payload is None and deliveries[bad].retries_left == 3

    # The runtime reports BAD_INPUT: fail with retries 0, an incident, nothing stranded.
    receipt = client.report(deliveries[bad], outcome(OutcomeKind.BAD_INPUT, message=reason))
    assert receipt.accepted
    described = e.job(bad)
    assert described["state"] == "incident" and described["retries"] == 0


def test_every_job_a_server_ignoring_the_maximum_sends_is_returned(env) -> None:
    # None is dropped (it would be stranded: Priostack jobs never expire); giving back the
    # surplus is the runtime's (runtime/pulling.py, tests/aws/test_not_asked_for.py).
    e = env(overdeliver=2)
    e.admin.seed({"jobs": [{"type": "t", "count": 3, "retries": 5}]})
    client = e.client()
    got = client.pull(PullRequest(handler="t", max_items=1))
    assert len(got) == 3
    assert {j["key"]: (j["state"], j["retries"]) for j in e.admin.jobs()} == {d.job_id: ("active", 5) for d in got}


# -- report --------------------------------------------------------------------------------------
@pytest.mark.parametrize("value,expected", [
    ({"chargeId": "ch_1"}, {"variables": {"chargeId": "ch_1"}}),
    (42, {"variables": {"result": 42}}),
    ([1, 2], {"variables": {"result": [1, 2]}}),
    (None, {}),
])
def test_success_completes_with_variables(env, value: Any, expected: dict[str, Any]) -> None:
    e = env()
    [key] = e.admin.seed({"jobs": [{"type": "t", "variables": {"orderId": "O"}}]})
    client = e.client()
    receipt = client.report(pull_one(client), outcome(OutcomeKind.SUCCESS, value=value))
    assert (receipt.accepted, receipt.status, receipt.already_applied) == (True, "completed", False)
    described = e.job(key)
    assert [c["body"] for c in described["calls"]] == [expected]
    assert described["instance"]["state"] == "COMPLETED"
    assert described["instance"]["variables"] == {"orderId": "O", **expected.get("variables", {})}


def test_business_error_completes_with_outcome_variables(env) -> None:
    e = env()
    [key] = e.admin.seed({"jobs": [{"type": "t"}]})
    client = e.client()
    receipt = client.report(pull_one(client), outcome(
        OutcomeKind.BUSINESS_ERROR, value={"declineReason": "funds"}, error_code="CARD_DECLINED",
        message="insufficient funds"))
    assert receipt.status == "completed"
    described = e.job(key)
    assert [c["label"] for c in described["calls"]] == ["complete"]
    assert described["instance"]["variables"] == {
        "declineReason": "funds", "errorCode": "CARD_DECLINED", "errorMessage": "insufficient funds"}


def test_bad_input_fails_with_zero_retries_and_raises_an_incident(env) -> None:
    e = env()
    [key] = e.admin.seed({"jobs": [{"type": "t", "retries": 3}]})
    client = e.client()
    delivery = pull_one(client)
    client.report(delivery, outcome(OutcomeKind.BAD_INPUT, error_code="VALIDATION_ERROR",
                                    message="amount < 0"))
    described = e.job(key)
    assert described["calls"][0]["body"] == {"retries": 0, "errorMessage": "VALIDATION_ERROR: amount < 0"}
    assert described["incident"]["error_code"] == "JOB_FAILED"
    [incident] = client.list_incidents()
    assert incident.error_code == "JOB_FAILED" and incident.state == "ACTIVE"
    assert incident.model_extra["processInstanceKey"] == delivery.wire["processInstanceKey"]
    assert client.get_process_instance(delivery.wire["processInstanceKey"]).state == "INCIDENT"


def test_an_exception_failure_names_its_type_once(env) -> None:
    # given a failure as the handler runner stores an exception: code the type, message "Type: text"
    e = env()
    [key] = e.admin.seed({"jobs": [{"type": "t", "retries": 1}]})
    client = e.client()

    # when it is reported
    client.report(pull_one(client), outcome(OutcomeKind.FAILURE, error_code="ValueError", message="ValueError: boom"))

    # then the server's errorMessage says the type once
    assert e.job(key)["calls"][-1]["body"]["errorMessage"] == "ValueError: boom"


@pytest.mark.parametrize("kind", [OutcomeKind.FAILURE, OutcomeKind.TIMEOUT])
def test_failure_and_timeout_use_one_attempt(env, kind: OutcomeKind) -> None:
    e = env()
    [key] = e.admin.seed({"jobs": [{"type": "t", "retries": 2}]})
    client = e.client()
    receipt = client.report(pull_one(client), outcome(kind, message="gateway 503"))
    assert (receipt.status, receipt.detail) == ("failed", {"retries_sent": 1})
    again = pull_one(client)  # immediately activatable, retries as sent
    assert (again.job_id, again.retries_left) == (key, 1)
    client.report(again, outcome(kind))
    described = e.job(key)
    assert described["retries_history"] == [2, 1, 0]
    assert described["state"] == "incident"
    default = "handler timed out" if kind is OutcomeKind.TIMEOUT else "handler failed"
    assert described["calls"][-1]["body"] == {"retries": 0, "errorMessage": default}


@pytest.mark.parametrize("kind", [OutcomeKind.NOT_STARTED, OutcomeKind.LEASE_LOST])
def test_outcomes_that_are_not_reported_are_refused(env, kind: OutcomeKind) -> None:
    e = env()
    e.admin.seed({"jobs": [{"type": "t"}]})
    client = e.client()
    with pytest.raises(ValueError, match="hand_back"):
        client.report(pull_one(client), outcome(kind))


def test_hand_back_keeps_retries_and_requeues_at_once(env) -> None:
    e = env()
    [key] = e.admin.seed({"jobs": [{"type": "t", "retries": 3}]})
    client = e.client()
    client.hand_back(pull_one(client))
    again = pull_one(client)
    assert (again.job_id, again.retries_left) == (key, 3)
    assert e.job(key)["calls"][0]["body"]["retries"] == 3
    client.hand_back(again)
    client.hand_back(again)  # already handed back: the 404 is absorbed
    assert [c["status"] for c in e.job(key)["calls"]] == [204, 204, 404]


def test_a_404_on_the_first_attempt_is_not_found(env) -> None:
    e = env()
    [key] = e.admin.seed({"jobs": [{"type": "t"}]})
    client = e.client()
    delivery = pull_one(client)
    client.complete(key, {"done": True})
    with pytest.raises(NotFoundError) as caught:
        client.complete(key, {"done": True})
    assert type(caught.value) is NotFoundError
    assert key in str(caught.value)

    receipt = client.report(delivery, outcome(OutcomeKind.SUCCESS, value={"done": True}))
    assert (receipt.accepted, receipt.status, receipt.already_applied) == (False, "not_found", False)
    assert receipt.detail["state"] == "COMPLETED"


@pytest.mark.parametrize("action", ["complete", "fail"])
def test_a_404_after_a_lost_response_is_not_found_after_retry(env, action: str) -> None:
    e = env()
    [key] = e.admin.seed({"jobs": [{"type": "t", "retries": 1}]})
    client = e.client()
    pull_one(client)
    e.admin.faults([{"kind": "drop_response", "endpoint": action, "count": 1}])
    with pytest.raises(NotFoundAfterRetryError):
        if action == "complete":
            client.complete(key, {"x": 1})
        else:
            client.fail(key, 0, "boom")
    calls = e.job(key)["calls"]
    assert [(c["status"], c["applied"], c.get("dropped", False)) for c in calls] == \
        [(204, True, True), (404, False, False)]
    assert calls[0]["body"] == calls[1]["body"]


def test_report_after_a_lost_response_is_already_applied_with_the_instance(env) -> None:
    e = env()
    [key] = e.admin.seed({"jobs": [{"type": "t", "variables": {"a": 1}}]})
    client = e.client()
    delivery = pull_one(client)
    e.admin.faults([{"kind": "drop_response", "endpoint": "complete", "count": 1}])
    receipt = client.report(delivery, outcome(OutcomeKind.SUCCESS, value={"b": 2}))
    assert (receipt.accepted, receipt.already_applied, receipt.status) == (True, True, "already_applied")
    assert receipt.detail["processInstanceKey"] == delivery.wire["processInstanceKey"]
    assert receipt.detail["state"] == "COMPLETED"
    assert receipt.detail["variables_present"] is True
    assert receipt.detail["instance"]["variables"] == {"a": 1, "b": 2}
    assert client.calls["process-instances.get"] == 1
    assert len(e.job(key)["calls"]) == 2


def test_a_404_after_only_a_rate_limit_is_plain_not_found(env) -> None:
    """A 429 is answered before anything happens, so it cannot have applied the call."""
    e = env()
    [key] = e.admin.seed({"jobs": [{"type": "t"}]})
    client = e.client()
    pull_one(client)
    client.complete(key)
    e.admin.faults([{"kind": "rate_limit", "endpoint": "complete", "count": 1}])
    with pytest.raises(NotFoundError) as caught:
        client.complete(key)
    assert type(caught.value) is NotFoundError


@pytest.mark.parametrize("fault,status", [("error_5xx", 503), ("rate_limit", 429)])
@pytest.mark.parametrize("kind", [OutcomeKind.SUCCESS, OutcomeKind.FAILURE])
def test_transient_errors_are_retried_with_the_same_body(env, fault: str, status: int,
                                                         kind: OutcomeKind) -> None:
    e = env()
    [key] = e.admin.seed({"jobs": [{"type": "t", "retries": 3}]})
    client = e.client()
    delivery = pull_one(client)
    label = "complete" if kind is OutcomeKind.SUCCESS else "fail"
    e.admin.faults([{"kind": fault, "endpoint": label, "count": 2, "retry_after": 0}])
    receipt = client.report(delivery, outcome(kind, value={"v": 1}, message="m"))
    assert receipt.accepted and not receipt.already_applied
    calls = e.job(key)["calls"]
    assert [c["status"] for c in calls] == [status, status, 204]
    assert len({repr(c["body"]) for c in calls}) == 1
    assert client.calls[label] == 3


def test_retries_give_up_with_the_last_error(env) -> None:
    e = env()
    [key] = e.admin.seed({"jobs": [{"type": "t"}]})
    client = e.client()
    pull_one(client)
    e.admin.faults([{"kind": "rate_limit", "endpoint": "complete"}])
    with pytest.raises(RateLimitedError):
        client.complete(key)
    assert client.calls["complete"] == 6
    assert e.job(key)["state"] == "active"


def test_an_unknown_action_answer_is_a_protocol_violation(env) -> None:
    # A prefix that lands on the sandbox's /jobs/{key}/{action} route: the server says
    # "unknown action", which must not be mistaken for "the job is gone".
    e = env()
    client = e.client(api_prefix="/api/v1/jobs/k")
    with pytest.raises(ProtocolViolationError, match="unknown action"):
        client.complete("somekey")
    assert client.calls["complete"] == 1


def test_a_wrong_key_is_invalid_api_key(env) -> None:
    client = env().client(api_key="not-the-key")
    with pytest.raises(InvalidApiKeyError):
        client.pull(PullRequest(handler="t", max_items=1))


@pytest.mark.parametrize("auth", ["header", "bearer", "query"])
def test_every_auth_mode_works_end_to_end(env, auth: str) -> None:
    e = env()
    [key] = e.admin.seed({"jobs": [{"type": "t"}]})
    client = e.client(auth=auth)
    assert client.report(pull_one(client), outcome(OutcomeKind.SUCCESS, value={})).accepted
    assert e.job(key)["state"] == "completed"


# -- registration and reads ---------------------------------------------------------------------
def test_registration_on_open_session_and_heartbeats(env) -> None:
    e = env()
    client = e.client(register=True, group_name="payments")
    identity = WorkerIdentity(instance_id="i-1", handlers=["payment:charge", "payment:refund"])
    assert client.open_session(identity) is None
    assert client.worker_id is not None and client.worker_id.startswith("wkr-")
    assert client.open_session(identity) is None  # registers once per client
    listed = client.list_workers()
    assert listed.total == 1
    [worker] = listed.items
    assert (worker.id, worker.topics, worker.group_name, worker.active) == \
        (client.worker_id, ["payment:charge", "payment:refund"], "payments", True)
    client.heartbeat(WorkerStatus())
    assert client.calls["workers.heartbeat"] == 1
    assert client.worker_heartbeat(client.worker_id).status == "ok"


def test_without_registration_nothing_is_registered_or_heartbeaten(env) -> None:
    e = env()
    client = e.client()
    assert client.open_session(WorkerIdentity(instance_id="i", handlers=["t"])) is None
    client.heartbeat(WorkerStatus())
    assert client.worker_id is None
    assert dict(client.calls) == {}


def test_a_failed_heartbeat_is_logged_not_raised(env, caplog: pytest.LogCaptureFixture) -> None:
    e = env()
    client = e.client(register=True)
    client.open_session(WorkerIdentity(instance_id="i", handlers=["t"]))
    e.admin.faults([{"kind": "error_5xx", "endpoint": "workers.heartbeat"}])
    with caplog.at_level(logging.WARNING, logger="serverless_worker.protocols.priostack"):
        client.heartbeat(WorkerStatus())
    assert "heartbeat failed" in caplog.text


def test_a_failed_registration_does_not_stop_the_worker_but_a_bad_key_does(env) -> None:
    e = env()
    e.admin.faults([{"kind": "error_5xx", "endpoint": "workers.register", "count": 1}])
    client = e.client(register=True)
    identity = WorkerIdentity(instance_id="i", handlers=["t"])
    assert client.open_session(identity) is None
    assert client.worker_id is None
    assert client.calls["workers.register"] == 1  # registration is not retried
    with pytest.raises(InvalidApiKeyError):
        e.client(register=True, api_key="wrong").open_session(identity)


def test_process_instance_and_incident_reads(env) -> None:
    e = env()
    e.admin.seed({"jobs": [{"type": "t", "count": 2, "variables": {"k": "v"}}]})
    client = e.client()
    first, second = client.pull(PullRequest(handler="t", max_items=2))
    assert client.list_incidents() == []
    client.fail(first.job_id, 0, "gave up")
    client.complete(second.job_id, {"ok": True})
    [incident] = client.list_incidents()
    assert incident.error_code == "JOB_FAILED" and incident.key == first.job_id
    done = client.get_process_instance(second.wire["processInstanceKey"])
    assert (done.state, done.variables) == ("COMPLETED", {"k": "v", "ok": True})
    with pytest.raises(NotFoundError):
        client.get_process_instance("run_unknown")
