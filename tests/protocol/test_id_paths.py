"""Ids reach the server as the same id: a Priostack job key or a claim-queue item id that
is ``.``, ``..``, holds ``/``, ``%``, ``?``, ``#``, a space or non-ASCII, is one path segment
of the report's URL (``protocols/_paths.py``), and the transport sends the path as given
(nothing re-quoted, no dot segment collapsed). Before, ``/jobs/../complete`` went out as ``/complete``, got 404
and the job was stranded. Pipelogiq puts only integers in its paths (stage and pipeline ids).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from serverless_worker.model import Outcome, OutcomeKind
from serverless_worker.protocols._paths import path_segment
from serverless_worker.protocols.base import PullRequest
from serverless_worker.protocols.claimqueue import ClaimQueueClient
from serverless_worker.protocols.priostack import PriostackClient
from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin

IDS = [".", "..", "a/b", "%2e", "../x", "?q=1#f", "with space", "ünï-ℵ", "...", "a%2Fb"]
KEY = "psk-paths-test-key"


@pytest.mark.parametrize(("value", "segment"), [
    (".", "%2E"), ("..", "%2E%2E"), ("...", "%2E%2E%2E"), ("a/b", "a%2Fb"), ("%2e", "%252e"),
    ("a.b", "a.b"), ("?#", "%3F%23"), ("ü", "%C3%BC"),
])
def test_an_id_is_one_segment_that_no_resolver_reads_as_a_dot_segment(value: str, segment: str) -> None:
    assert path_segment(value) == segment


def test_priostack_completes_and_fails_jobs_whatever_their_keys(
        serve: Callable[..., SandboxServer], admin_for: Callable[[SandboxServer], SandboxAdmin]) -> None:
    server = serve("priostack", api_keys=[KEY])
    admin = admin_for(server)
    created = admin.seed({"jobs": [{"type": "t", "key": key, "retries": 3} for key in IDS]})
    assert created == IDS
    with PriostackClient(server.url, KEY) as client:
        deliveries = client.pull(PullRequest(handler="t", max_items=len(IDS)))
        assert sorted(d.job_id for d in deliveries) == sorted(IDS)
        for number, delivery in enumerate(deliveries):
            if number % 2:  # half completed, half failed into an incident: both paths are used
                receipt = client.report(delivery, Outcome(kind=OutcomeKind.SUCCESS, value={"k": delivery.job_id}))
                assert receipt.status == "completed"
            else:
                receipt = client.report(delivery, Outcome(kind=OutcomeKind.BAD_INPUT, message="no"))
                assert receipt.status == "failed"
    states = {job["key"]: job["state"] for job in admin.jobs()}
    assert states == {d.job_id: ("completed" if n % 2 else "incident") for n, d in enumerate(deliveries)}
    assert admin.stats()["calls"].get("jobs.unknown-action", 0) == 0


@pytest.mark.parametrize("transport", ["http", "socket"])
@pytest.mark.parametrize("queue", ["q", "a/b ..", ".."])
def test_claim_queue_results_reach_items_whatever_their_ids(
        serve: Callable[..., SandboxServer], admin_for: Callable[[SandboxServer], SandboxAdmin],
        transport: str, queue: str) -> None:
    server = serve("claimqueue", tokens=[KEY])
    admin = admin_for(server)
    admin.seed({"queue": queue, "items": [{"n": n} for n in range(len(IDS))], "ids": IDS})
    with ClaimQueueClient(server.url, KEY, transport=transport) as client:  # type: ignore[arg-type]
        deliveries = client.pull(PullRequest(handler=queue, max_items=len(IDS)))
        while len(deliveries) < len(IDS):  # one claim per item; a pull may stop short
            more = client.pull(PullRequest(handler=queue, max_items=len(IDS) - len(deliveries)))
            assert more, "the queue ran dry before every item was claimed"
            deliveries += more
        assert sorted(d.job_id for d in deliveries) == sorted(IDS)
        for delivery in deliveries:
            receipt = client.report(delivery, Outcome(kind=OutcomeKind.SUCCESS, value={"id": delivery.job_id}))
            assert receipt.accepted
        # the producer-side read (a path too) finds each item under its own id
        assert {client.item_status(queue, item_id).status for item_id in IDS} == {"finished"}
    jobs = {job["id"]: job for job in admin.jobs()}
    assert set(jobs) == set(IDS)
    assert all(job["status"] == "finished" and job["result"] == {"id": item_id} for item_id, job in jobs.items())
