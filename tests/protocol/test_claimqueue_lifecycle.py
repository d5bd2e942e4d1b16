"""Claim queue conformance, after the claim: lapses and re-queues, late results,
``accepted:false``, the queue timeout, progress, in-band errors, outcome mapping and
result retries. Client against the sandbox on loopback."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests

from serverless_worker.errors import BusinessError, ResultNotAcceptedError
from serverless_worker.model import Delivery, Outcome, OutcomeKind
from serverless_worker.protocols.base import PullRequest
from serverless_worker.protocols.claimqueue import ClaimQueueClient
from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin
from support.claimqueue import QUEUE, TOKEN, ClientMaker, client_maker, events, job, success
from support.waiting import wait_for


@pytest.fixture
def start(serve: Callable[..., SandboxServer], admin_for: Callable[[SandboxServer], SandboxAdmin]
          ) -> Callable[..., tuple[SandboxServer, SandboxAdmin]]:
    def _start(**config: Any) -> tuple[SandboxServer, SandboxAdmin]:
        server = serve("claimqueue", **config)
        return server, admin_for(server)

    return _start


@pytest.fixture
def client_for() -> Iterator[ClientMaker]:
    with client_maker() as make:
        yield make


def claim_one(client: ClaimQueueClient) -> Delivery:
    [delivery] = client.pull(PullRequest(handler=QUEUE, max_items=1))
    return delivery


def test_a_lapsed_lease_requeues_the_item_with_one_more_attempt(start, client_for) -> None:
    server, admin = start(lease_seconds=0.5)
    [item_id] = admin.seed({"queue": QUEUE, "items": [{"n": 1}]})
    first = claim_one(client_for(server))

    wait_for(lambda: job(admin, item_id)["status"] == "pending")  # the sweep re-queued it
    second = claim_one(client_for(server, worker_id="box-2"))

    assert (first.attempt, second.attempt) == (1, 2)
    assert second.job_id == item_id and second.ledger_id == f"{item_id}:2" != first.ledger_id
    [lapse] = events(admin, item_id, "lapse")
    assert lapse["lease"]["worker"] == "box-1"
    assert [h["worker"] for h in events(admin, item_id, "claim")] == ["box-1", "box-2"]


def test_a_late_result_after_a_lapse_is_accepted_and_ends_the_new_lease(start, client_for) -> None:
    server, admin = start(lease_seconds=0.5)
    [item_id] = admin.seed({"queue": QUEUE, "items": [{"n": 1}]})
    slow, fast = client_for(server), client_for(server, worker_id="box-2")
    late = claim_one(slow)
    wait_for(lambda: job(admin, item_id)["status"] == "pending")
    newer = claim_one(fast)

    receipt = slow.report(late, success({"output": "late"}))

    assert receipt.accepted and receipt.status == "finished"
    with pytest.raises(ResultNotAcceptedError) as caught:
        fast.report(newer, success({"output": "second"}))
    assert caught.value.item_status == "finished" and caught.value.job_id == item_id
    final = job(admin, item_id)
    assert final["status"] == "finished" and final["result"] == {"output": "late"} and final["lease"] is None
    results = events(admin, item_id, "result")
    assert [(r["accepted"], r["value"]["output"]) for r in results] == [(True, "late"), (False, "second")]
    assert results[0]["lease_ended"]["worker"] == "box-2"


def test_result_refused_when_another_worker_finished_first(start, client_for) -> None:
    server, admin = start(lease_seconds=0.5)
    [item_id] = admin.seed({"queue": QUEUE, "items": [{"n": 1}]})
    slow, fast = client_for(server), client_for(server, worker_id="box-2")
    late = claim_one(slow)
    wait_for(lambda: job(admin, item_id)["status"] == "pending")
    fast.report(claim_one(fast), success({"output": "fast"}))

    with pytest.raises(ResultNotAcceptedError) as caught:
        slow.report(late, success({"output": "slow"}))

    assert caught.value.item_status == "finished"
    assert job(admin, item_id)["result"] == {"output": "fast"}


def test_the_queue_timeout_fails_the_item_and_refuses_results_and_progress(start, client_for) -> None:
    server, admin = start(lease_seconds=60, timeout_seconds=1.0)
    [item_id] = admin.seed({"queue": QUEUE, "items": [{"n": 1}]})
    client = client_for(server)
    delivery = claim_one(client)

    wait_for(lambda: job(admin, item_id)["status"] == "failed")
    with pytest.raises(ResultNotAcceptedError) as result_refused:
        client.report(delivery, success({"output": "too late"}))
    with pytest.raises(ResultNotAcceptedError) as progress_refused:
        client.progress(delivery, {"percent": 99})

    assert result_refused.value.item_status == progress_refused.value.item_status == "failed"
    final = job(admin, item_id)
    assert final["error"] == "timeout" and final["result"] is None and final["progress"] is None
    assert len(events(admin, item_id, "timeout")) == 1
    assert [r["accepted"] for r in events(admin, item_id, "result")] == [False]


def test_per_queue_overrides_apply_to_that_queue_only(start, client_for) -> None:
    _, admin = start(lease_seconds=60, queues={"fast": {"timeout_seconds": 0.3}})
    [fast_id] = admin.seed({"queue": "fast", "items": [{"n": 1}]})
    [slow_id] = admin.seed({"queue": QUEUE, "items": [{"n": 2}]})

    wait_for(lambda: job(admin, fast_id)["status"] == "failed")

    assert job(admin, slow_id)["status"] == "pending"


def test_progress_keeps_the_last_value_and_is_ignored_once_terminal(start, client_for) -> None:
    server, admin = start()
    [item_id] = admin.seed({"queue": QUEUE, "items": [{"n": 1}]})
    client = client_for(server)
    delivery = claim_one(client)

    client.progress(delivery, {"percent": 10})
    client.progress(delivery, 40)  # a bare value becomes {"progress": 40}
    assert job(admin, item_id)["progress"] == {"progress": 40}
    client.report(delivery, success({"output": "done"}))
    with pytest.raises(ResultNotAcceptedError) as caught:
        client.progress(delivery, {"percent": 100})

    assert caught.value.item_status == "finished"
    assert job(admin, item_id)["progress"] == {"progress": 40}
    assert [p["accepted"] for p in events(admin, item_id, "progress")] == [True, True, False]


def test_progress_transport_failures_are_best_effort(start, client_for) -> None:
    server, admin = start()
    [item_id] = admin.seed({"queue": QUEUE, "items": [{"n": 1}]})
    client = client_for(server)
    delivery = claim_one(client)
    admin.faults([{"kind": "error_5xx", "endpoint": "progress"}])

    client.progress(delivery, {"percent": 10})  # logged, not raised, not retried

    assert client.calls["progress"] == 1
    assert job(admin, item_id)["progress"] is None


@pytest.mark.parametrize("value, record", [
    ({"output": "aGVsbG8="}, {"output": "aGVsbG8="}),
    ("plain", {"result": "plain"}),
    ([1, 2], {"result": [1, 2]}),
    (None, {"result": None}),
])
def test_a_success_becomes_the_result_record(start, client_for, value, record) -> None:
    server, admin = start()
    [item_id] = admin.seed({"queue": QUEUE, "items": [{"n": 1}]})
    client = client_for(server)

    client.report(claim_one(client), success(value))

    assert job(admin, item_id)["result"] == record


def _business() -> Outcome:
    err = BusinessError("UNSUPPORTED_FORMAT", "source image was not a PNG",
                        {"format": "tiff", "error": "must not overwrite"})
    return Outcome(kind=OutcomeKind.BUSINESS_ERROR, error_code=err.code, message=err.message,
                   value=err.variables)


@pytest.mark.parametrize("outcome, record", [
    (_business(), {"error": "source image was not a PNG", "errorCode": "UNSUPPORTED_FORMAT",
                   "format": "tiff"}),
    (Outcome(kind=OutcomeKind.BAD_INPUT, message="width: not an int"),
     {"error": "width: not an int", "errorCode": "VALIDATION_ERROR"}),
    (Outcome(kind=OutcomeKind.FAILURE, error_code="ValueError", message="bad URL"),
     {"error": "bad URL", "errorCode": "ValueError"}),
    (Outcome(kind=OutcomeKind.FAILURE), {"error": "HANDLER_ERROR", "errorCode": "HANDLER_ERROR"}),
], ids=["business", "bad-input", "failure", "failure-without-message"])
def test_errors_are_reported_in_band_and_finish_the_item(start, client_for, outcome, record) -> None:
    server, admin = start()
    [item_id] = admin.seed({"queue": QUEUE, "items": [{"n": 1}]})
    client = client_for(server)

    receipt = client.report(claim_one(client), outcome)

    assert receipt.accepted and receipt.status == "finished"
    final = job(admin, item_id)
    assert final["status"] == "finished" and final["result"] == record
    assert final["error"] is None  # the item's top-level error is the queue's, not ours


@pytest.mark.parametrize("kind", [OutcomeKind.TIMEOUT, OutcomeKind.LEASE_LOST])
def test_a_timed_out_run_sends_nothing_and_the_lease_lapses(start, client_for, kind) -> None:
    server, admin = start(lease_seconds=0.5)
    [item_id] = admin.seed({"queue": QUEUE, "items": [{"n": 1}]})
    client = client_for(server)
    delivery = claim_one(client)

    receipt = client.report(delivery, Outcome(kind=kind))

    assert (receipt.accepted, receipt.status) == (False, "lapsed")
    assert client.calls["result"] == 0
    wait_for(lambda: job(admin, item_id)["status"] == "pending")
    assert claim_one(client).attempt == 2


def test_never_started_is_handed_back_not_reported(start, client_for) -> None:
    server, admin = start(lease_seconds=0.5)
    [item_id] = admin.seed({"queue": QUEUE, "items": [{"n": 1}]})
    client = client_for(server)
    delivery = claim_one(client)

    with pytest.raises(ValueError, match="hand_back"):
        client.report(delivery, Outcome(kind=OutcomeKind.NOT_STARTED))
    client.hand_back(delivery)  # over HTTP: nothing to call, the lease lapses
    client.acknowledge(delivery)
    client.discard(delivery)

    assert sum(client.calls.values()) == 1  # only the claim
    wait_for(lambda: job(admin, item_id)["status"] == "pending")


def test_acquire_and_renew_return_the_claims_lease_without_a_call(start, client_for) -> None:
    server, admin = start()
    admin.seed({"queue": QUEUE, "items": [{"n": 1}]})
    client = client_for(server)
    delivery = claim_one(client)

    for lease in (client.acquire(delivery), client.renew(delivery)):
        assert lease.expires_at == delivery.lease_expires_at and not lease.renewable
        assert lease.attempt == 1
    assert sum(client.calls.values()) == 1
    assert (client.has_lease, client.lease_renewable, client.needs_session) == (False, False, False)


def test_item_status_reads_the_item_back(start, client_for) -> None:
    server, admin = start()
    [item_id] = admin.seed({"queue": QUEUE, "items": [{"n": 1}]})
    client = client_for(server)
    client.report(claim_one(client), success({"output": "x"}))

    status = client.item_status(QUEUE, item_id)

    assert (status.id, status.status, status.attempts) == (item_id, "finished", 1)
    assert status.result == {"output": "x"}
    assert status.terminal


def test_a_result_body_that_is_not_an_object_is_400(start, client_for) -> None:
    server, admin = start()
    [item_id] = admin.seed({"queue": QUEUE, "items": [{"n": 1}]})
    claim_one(client_for(server))
    url = f"{server.url}/{QUEUE}/items/{item_id}/result"
    headers = {"Authorization": f"Bearer {TOKEN}"}

    for body in ([1, 2], "done", 3):
        answer = requests.post(url, json=body, headers=headers, timeout=5)
        assert answer.status_code == 400 and answer.json()["ok"] is False
    assert requests.post(url, data=b"{not json", headers=headers, timeout=5).status_code == 400
    assert job(admin, item_id)["status"] == "processing"


def test_unknown_item_is_404(start, client_for) -> None:
    server, _ = start()
    answer = requests.post(f"{server.url}/{QUEUE}/items/nope/result", json={"a": 1},
                           headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
    assert answer.status_code == 404 and answer.json() == {"ok": False, "error": "no such item"}


@pytest.mark.parametrize("fault", [
    {"kind": "error_5xx", "status": 503},
    {"kind": "error_5xx", "status": 502},
    {"kind": "rate_limit", "retry_after": 0},
    {"kind": "drop_response"},
], ids=["503", "502", "429", "drop"])
def test_results_are_retried_with_the_same_body_and_count_once(start, client_for, fault) -> None:
    server, admin = start()
    [item_id] = admin.seed({"queue": QUEUE, "items": [{"n": 1}]})
    client = client_for(server)
    delivery = claim_one(client)
    admin.faults([{**fault, "endpoint": "result", "count": 2}])

    receipt = client.report(delivery, success({"output": "once"}))

    assert receipt.accepted and receipt.status == "finished"
    assert client.calls["result"] == 3
    results = events(admin, item_id, "result")
    assert [r for r in results if r["accepted"]] == results[:1]  # exactly one accepted, the first seen
    assert {repr(r["value"]) for r in results} == {repr({"output": "once"})}
    if fault["kind"] == "drop_response":
        # The first try took effect; the retries were refused as "finished" and the
        # read-back found our own result.
        assert receipt.already_applied and len(results) == 3
    else:
        assert not receipt.already_applied and len(results) == 1


def test_a_refusal_after_an_unknown_outcome_is_still_refused_when_the_result_is_not_ours(
        start, client_for) -> None:
    server, admin = start(lease_seconds=0.5)
    [item_id] = admin.seed({"queue": QUEUE, "items": [{"n": 1}]})
    slow, fast = client_for(server), client_for(server, worker_id="box-2")
    late = claim_one(slow)
    wait_for(lambda: job(admin, item_id)["status"] == "pending")
    fast.report(claim_one(fast), success({"output": "fast"}))
    admin.faults([{"kind": "error_5xx", "endpoint": "result", "count": 1}])

    with pytest.raises(ResultNotAcceptedError):
        slow.report(late, success({"output": "slow"}))

    assert slow.calls["items.get"] == 1
    assert job(admin, item_id)["result"] == {"output": "fast"}
