"""Priostack wire models and the client's status translation, without a server."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from serverless_worker.errors import (
    BadRequestError,
    InvalidApiKeyError,
    NotFoundError,
    ProtocolViolationError,
    RateLimitedError,
    ServerUnavailableError,
)
from serverless_worker.protocols._http import HttpResponse
from serverless_worker.protocols.priostack import PriostackClient
from serverless_worker.protocols.priostack_models import (
    ActivateRequest,
    CompleteRequest,
    FailRequest,
    Incident,
    PriostackJob,
    ProcessInstance,
    WorkerRecord,
)

JOB: dict[str, Any] = {
    "key": "a99f579d62ae71f8764f",
    "type": "payment-processor",
    "processInstanceKey": "run_1ce49bbc5260b39423bd",
    "processDefinitionKey": "7f3c2a91b04e5d6c8a12",
    "variables": {"orderId": "ORD-001", "amount": 149.99, "currency": "EUR"},
    "retries": 3,
    "deadline": 1746456780000,
    "createdAt": "0001-01-01T00:00:00Z",
}


def test_the_documented_job_decodes_and_unknown_fields_are_tolerated() -> None:
    job = PriostackJob.model_validate({**JOB, "bpmnProcessId": "x", "somethingNew": [1]})
    assert (job.key, job.retries, job.deadline, job.createdAt) == \
        ("a99f579d62ae71f8764f", 3, 1746456780000, "0001-01-01T00:00:00Z")


@pytest.mark.parametrize("field,value", [
    ("key", 12345),
    ("processInstanceKey", 987),
    ("processDefinitionKey", 1.5),
    ("retries", "3"),
    ("retries", True),
    ("variables", [1, 2]),
    ("type", None),
])
def test_keys_must_be_strings_and_nothing_is_silently_converted(field: str, value: Any) -> None:
    with pytest.raises(ValidationError):
        PriostackJob.model_validate({**JOB, field: value})


def test_informational_fields_never_invalidate_a_job() -> None:
    job = PriostackJob.model_validate({**JOB, "deadline": "soon", "createdAt": 17})
    assert (job.deadline, job.createdAt) == (None, None)
    job = PriostackJob.model_validate({k: v for k, v in JOB.items() if k not in ("deadline", "createdAt")})
    assert job.deadline is None


def test_request_bodies_always_carry_what_the_server_needs() -> None:
    activate = ActivateRequest(type="t", maxJobsToActivate=5)
    assert activate.model_dump() == {"type": "t", "maxJobsToActivate": 5}
    with pytest.raises(ValidationError):
        ActivateRequest(type="t", maxJobsToActivate=0)
    assert FailRequest(retries=0, errorMessage="x").model_dump() == {"retries": 0, "errorMessage": "x"}
    assert CompleteRequest().model_dump(exclude_none=True) == {}


def test_the_echoed_worker_api_key_is_masked_and_never_dumped() -> None:
    record = WorkerRecord.model_validate({"id": "wkr-1", "api_key": "ps_live_secret", "topics": ["t"],
                                          "active": True, "group_name": "g"})
    assert record.api_key is not None and record.api_key.get_secret_value() == "ps_live_secret"
    for text in (repr(record), str(record), record.model_dump_json(), repr(record.model_dump())):
        assert "ps_live_secret" not in text


def test_reads_tolerate_any_shape() -> None:
    incident = Incident.model_validate({"id": 7, "error_code": "JOB_FAILED", "whatever": {"a": 1}})
    assert (incident.id, incident.error_code) == (7, "JOB_FAILED")
    assert incident.model_extra == {"whatever": {"a": 1}}
    instance = ProcessInstance.model_validate({"state": "COMPLETED", "bpmnProcessId": "p"})
    assert (instance.state, instance.key, instance.variables) == ("COMPLETED", None, None)


@pytest.fixture
def client() -> Any:
    made = PriostackClient("http://127.0.0.1:9", "k")
    yield made
    made.close()


def _response(status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> HttpResponse:
    return HttpResponse(status, headers or {}, body, "complete")


@pytest.mark.parametrize("status,body,expected,text", [
    (400, b'{"error":"invalid json"}', BadRequestError, "invalid json"),
    (401, b'{"error":"unauthorized"}', InvalidApiKeyError, "API key rejected"),
    (404, b'{"error":"job not found"}', NotFoundError, "job k1 not found"),
    (404, b'{"error":"unknown action"}', ProtocolViolationError, "unknown action"),
    (404, b"", NotFoundError, "not found"),
    (429, b"", RateLimitedError, "rate limited"),
    (500, b'{"error":"db down"}', ServerUnavailableError, "db down"),
    (502, b"<html>bad gateway</html>", ServerUnavailableError, "server error"),
    (403, b"", ProtocolViolationError, "unexpected status"),
    (409, b"", ProtocolViolationError, "unexpected status"),
    (302, b"", ProtocolViolationError, "unexpected status"),
])
def test_statuses_translate_in_one_place(client: PriostackClient, status: int, body: bytes,
                                         expected: type[Exception], text: str) -> None:
    with pytest.raises(expected, match=text) as caught:
        client._raise_for_status(_response(status, body), job_key="k1")
    assert type(caught.value) is expected
    assert caught.value.status == status  # type: ignore[attr-defined]


def test_retry_after_is_carried_and_2xx_with_any_body_is_success(client: PriostackClient) -> None:
    with pytest.raises(RateLimitedError) as caught:
        client._raise_for_status(_response(429, headers={"Retry-After": "2.5"}))
    assert caught.value.retry_after == 2.5
    for status in (200, 201, 202, 204):
        client._raise_for_status(_response(status, b""))
        client._raise_for_status(_response(status, b"not json"))
