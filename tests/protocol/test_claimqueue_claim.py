"""Claim queue conformance, claiming: oldest matching item, criteria operators, fail
closed, empty, bounded pulls, duplicates, 401. Client against the sandbox on loopback."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator

import pytest
import requests

from serverless_worker.errors import ForbiddenError, InvalidApiKeyError, NotFoundError, ServerUnavailableError
from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin
from support.claimqueue import QUEUE, TOKEN, ClientMaker, client_maker, job, pull


@pytest.fixture
def queue(serve: Callable[..., SandboxServer], admin_for: Callable[[SandboxServer], SandboxAdmin]
          ) -> tuple[SandboxServer, SandboxAdmin]:
    server = serve("claimqueue", lease_seconds=60)
    return server, admin_for(server)


@pytest.fixture
def client_for() -> Iterator[ClientMaker]:
    with client_maker() as make:
        yield make


def test_claim_hands_out_the_oldest_matching_item_with_its_lease(queue, client_for) -> None:
    server, admin = queue
    ids = admin.seed({"queue": QUEUE, "items": [
        {"format": "png", "width": 100},
        {"format": "jpg", "width": 3000},
        {"format": "jpg", "width": 800},
        {"format": "jpg", "width": 500},
    ]})
    client = client_for(server)
    criteria = {"format": "jpg", "width": {"lte": 2000}}

    before = time.time()
    [first] = pull(client, criteria)
    [second] = pull(client, criteria)

    assert (first.job_id, second.job_id) == (ids[2], ids[3])
    assert first.payload == {"format": "jpg", "width": 800}
    assert first.attempt == 1 and first.ledger_id == f"{ids[2]}:1"
    assert first.protocol == "claimqueue" and first.handler == QUEUE
    assert first.wire["queue"] == QUEUE and first.wire["lease"]["worker"] == "box-1"
    assert before + 59 <= first.lease_expires_at <= time.time() + 61
    assert first.lease_expires_at == first.wire["lease"]["until"] / 1000
    assert pull(client, criteria) == []
    leased = job(admin, ids[2])
    assert leased["status"] == "processing" and leased["lease"]["worker"] == "box-1"
    assert job(admin, ids[0])["status"] == job(admin, ids[1])["status"] == "pending"


def test_a_requeued_item_keeps_its_place_in_creation_order(serve, admin_for, client_for, sandbox_clock) -> None:
    server = serve("claimqueue", lease_seconds=0.5)
    admin = admin_for(server)
    older, newer = admin.seed({"queue": QUEUE, "items": [{"n": 1}, {"n": 2}]})
    box1, box2 = client_for(server), client_for(server, worker_id="box-2")
    [taken] = pull(box1)
    assert taken.job_id == older

    sandbox_clock.advance(0.7)  # the lease lapses: the older item is pending again
    [retaken] = pull(box2)

    assert retaken.job_id == older and retaken.attempt == 2
    assert job(admin, newer)["status"] == "pending"


OPERATOR_CASES = [
    # (matcher, item value, claimed?)
    ("jpg", "jpg", True),
    ("jpg", "png", False),
    ({"eq": 800}, 800, True),
    ({"eq": 800}, 801, False),
    ({"ne": "png"}, "jpg", True),
    ({"ne": "png"}, "png", False),
    ({"lt": 512}, 511, True),
    ({"lt": 512}, 512, False),
    ({"lte": 512}, 512, True),
    ({"lte": 512}, 513, False),
    ({"gt": 512}, 513, True),
    ({"gt": 512}, 512, False),
    ({"gte": 512}, 512, True),
    ({"gte": 512}, 511, False),
    ({"in": ["thumb", "preview"]}, "preview", True),
    ({"in": ["thumb", "preview"]}, "poster", False),
    ({"nin": ["thumb", "preview"]}, "poster", True),
    ({"nin": ["thumb", "preview"]}, "thumb", False),
    ({"lt": "b"}, "a", True),          # strings are ordered with strings
    ({"lt": 3}, "a", False),           # type mismatch fails closed
    ({"gte": "a"}, 5, False),
    ({"eq": 1}, True, False),          # JSON true is not 1
    (1, True, False),
    ({"in": "jpg"}, "jpg", False),     # an `in` operand that is not a list fails closed
    ({"eq": 1.0}, 1, True),            # numbers compare by value
]


@pytest.mark.parametrize(("matcher", "value", "claimed"), OPERATOR_CASES,
                         ids=[f"{m}-{v}-{c}" for m, v, c in OPERATOR_CASES])
def test_each_criteria_operator_matches_or_not(queue, client_for, matcher, value, claimed) -> None:
    server, admin = queue
    [item_id] = admin.seed({"queue": QUEUE, "items": [{"field": value}]})

    got = pull(client_for(server), {"field": matcher})

    assert [d.job_id for d in got] == ([item_id] if claimed else [])
    assert job(admin, item_id)["status"] == ("processing" if claimed else "pending")


@pytest.mark.parametrize("criteria", [
    {"height": {"lte": 2000}},                 # missing field
    {"height": {"ne": 1}},                     # missing field, even with ne
    {"format": {"like": "jp%"}},               # unknown operator
    {"width": {"gte": 100, "lte": 2000}},      # several operators in one object
    {"width": {}},                             # no operator at all
    {"format": "jpg", "width": {"lt": 100}},   # every criterion must match
])
def test_criteria_fail_closed(queue, client_for, criteria) -> None:
    server, admin = queue
    [item_id] = admin.seed({"queue": QUEUE, "items": [{"format": "jpg", "width": 800}]})

    assert pull(client_for(server), criteria) == []
    assert job(admin, item_id)["attempts"] == 0


@pytest.mark.parametrize("criteria", [None, {}])
def test_no_criteria_takes_any_pending_item(queue, client_for, criteria) -> None:
    server, admin = queue
    [item_id] = admin.seed({"queue": QUEUE, "items": [{"anything": [1, 2]}]})

    [delivery] = pull(client_for(server), criteria)

    assert delivery.job_id == item_id


def test_empty_queue_and_other_queues_give_nothing(queue, client_for) -> None:
    server, admin = queue
    admin.seed({"queue": "other", "items": [{"a": 1}]})
    client = client_for(server)

    assert pull(client, max_items=3) == []
    assert client.calls["claim"] == 1
    raw = requests.post(f"{server.url}/{QUEUE}/claim", json={"worker": "w"},
                        headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
    assert raw.status_code == 200 and raw.json() == {"ok": True, "empty": True}


def test_pull_claims_one_item_per_call_up_to_max_items_and_stops_at_empty(queue, client_for) -> None:
    server, admin = queue
    admin.seed({"queue": QUEUE, "items": [{"n": 1}, {"n": 2}, {"n": 3}]})
    client = client_for(server)

    assert [d.payload["n"] for d in pull(client, max_items=2)] == [1, 2]
    assert client.calls["claim"] == 2
    assert [d.payload["n"] for d in pull(client, max_items=5)] == [3]
    assert client.calls["claim"] == 4  # one item, then the empty answer
    assert admin.stats()["calls"]["claim"] == 4


def test_the_claim_body_carries_worker_id_and_criteria(queue, client_for) -> None:
    server, admin = queue
    [item_id] = admin.seed({"queue": QUEUE, "items": [{"format": "webp"}]})

    pull(client_for(server, worker_id="gpu-box"), {"format": "webp"})

    claim = [h for h in job(admin, item_id)["history"] if h["event"] == "claim"]
    assert [h["worker"] for h in claim] == ["gpu-box"]


def test_wrong_or_missing_token_is_401(queue, client_for) -> None:
    server, admin = queue
    [item_id] = admin.seed({"queue": QUEUE, "items": [{"n": 1}]})

    with pytest.raises(InvalidApiKeyError) as caught:
        pull(client_for(server, token="not-the-token"))
    assert caught.value.status == 401
    missing = requests.post(f"{server.url}/{QUEUE}/claim", json={}, timeout=5)
    assert missing.status_code == 401 and missing.json()["ok"] is False
    assert job(admin, item_id)["status"] == "pending"


def _seed_where_second_draw_fires(probability: float) -> int:
    """A fault-plan seed whose first draw passes and second fires (one draw per claim)."""
    for seed in range(1000):
        rng = random.Random(seed)
        if rng.random() >= probability and rng.random() < probability:
            return seed
    raise AssertionError("no such seed")


def test_pull_keeps_what_it_claimed_when_a_later_claim_fails(queue, client_for) -> None:
    server, admin = queue
    ids = admin.seed({"queue": QUEUE, "items": [{"n": 1}, {"n": 2}, {"n": 3}]})
    admin.faults([{"kind": "error_5xx", "endpoint": "claim", "probability": 0.5, "count": 1}],
                 seed=_seed_where_second_draw_fires(0.5))

    got = pull(client_for(server), max_items=3)

    assert [d.job_id for d in got] == ids[:1]  # the second claim failed before acting: stop there
    assert [job(admin, i)["status"] for i in ids] == ["processing", "pending", "pending"]
    assert admin.stats()["calls"]["claim"] == 2


def test_a_failing_first_claim_raises_and_is_not_retried(queue, client_for) -> None:
    server, admin = queue
    [item_id] = admin.seed({"queue": QUEUE, "items": [{"n": 1}]})
    admin.faults([{"kind": "drop_response", "endpoint": "claim", "count": 1}])
    client = client_for(server)

    with pytest.raises(ServerUnavailableError) as caught:
        pull(client, max_items=2)

    assert caught.value.ambiguous
    assert client.calls["claim"] == 1
    # The lost answer left the item leased to nobody until its lease lapses: exactly why
    # a blind retry would only have claimed another one.
    assert job(admin, item_id)["status"] == "processing"


def test_duplicate_delivery_fault_hands_out_a_leased_item_again(queue, client_for) -> None:
    server, admin = queue
    [item_id, _] = admin.seed({"queue": QUEUE, "items": [{"n": 1}, {"n": 2}]})
    [original] = pull(client_for(server))
    admin.faults([{"kind": "duplicate_delivery", "endpoint": "claim", "count": 1}])

    [duplicate] = pull(client_for(server, worker_id="box-2"))

    assert duplicate.job_id == item_id and duplicate.ledger_id == original.ledger_id
    events = [h["event"] for h in job(admin, item_id)["history"]]
    assert events == ["created", "claim", "duplicate_delivery"]


def test_a_claim_on_a_queue_the_server_does_not_have_is_not_found(serve, admin_for, client_for) -> None:
    # given a server whose only queue is another one
    server = serve("claimqueue", known_queues=["elsewhere"])
    admin_for(server).seed({"queue": QUEUE, "items": [{"format": "jpg"}]})

    # then a claim on ours is a 404, which the client reads as an unknown queue
    with pytest.raises(NotFoundError, match="unknown queue") as refused:
        pull(client_for(server), None)
    assert refused.value.status == 404


def test_a_token_not_allowed_on_the_queue_is_forbidden_there_only(serve, admin_for, client_for) -> None:
    # given a queue that only another (valid) token may claim from
    server = serve("claimqueue", tokens=[TOKEN, "other-token"], queues={QUEUE: {"tokens": ["other-token"]}})
    admin_for(server).seed({"queue": QUEUE, "items": [{"format": "jpg"}]})

    # then our token is refused there with 403, and the allowed one claims the item
    with pytest.raises(ForbiddenError) as refused:
        pull(client_for(server), None)
    assert refused.value.status == 403
    assert len(pull(client_for(server, token="other-token"), None)) == 1


def test_sequential_ids_start_over_when_the_queue_is_reset(serve, admin_for) -> None:
    # given a queue whose item ids come from a counter that starts with the server
    admin = admin_for(serve("claimqueue", sequential_ids=True))
    first = admin.seed({"queue": "q", "items": [{"n": 1}, {"n": 2}]})

    # when it is re-created (reset) and seeded again
    admin.reset()
    again = admin.seed({"queue": "q", "items": [{"n": 3}, {"n": 4}]})

    # then the new items carry the ids of the last ones
    assert again == first and len(set(first)) == 2
    assert [item["id"] for item in admin.jobs()] == first
