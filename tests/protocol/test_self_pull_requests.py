"""What an executor that keeps pulling asks each job server, read from the sandbox's own
records: one delivery a pull, for the handler it just ran (``runtime/self_pull.py``).

Pipelogiq: ``waitSeconds: 0`` with the stored worker session, never a bootstrap (a bootstrap
replaces the token every container of the instance uses). Priostack: ``activate`` with the
handler's ``type`` and ``maxJobsToActivate: 1``, so nothing is held that cannot start. The
claim queue: ``claim`` with the handler's criteria.

Real sandboxes on loopback and a real SQLite store; the executor runs as a puller
(``executor.pull_for``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from serverless_worker.model import DispatchMode, LedgerStatus, Outcome, OutcomeKind, ReportReceipt
from serverless_worker.protocols.base import PullRequest
from serverless_worker.registry import HandlerRegistry
from serverless_worker.runtime.context import LocalContext
from serverless_worker.runtime.executor import pull_for
from serverless_worker.runtime.services import Services
from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin
from serverless_worker.settings import Settings
from serverless_worker.state import SqliteStateStore

CREDENTIALS = {"pipelogiq": "sandbox-api-key", "priostack": "sandbox-api-key", "claimqueue": "sandbox-token"}
GOLD = {"tier": "gold"}


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Callable[..., Services]]:
    made: list[tuple[Services, SqliteStateStore]] = []

    def _make(protocol: str, url: str) -> Services:
        registry = HandlerRegistry()
        registry.handler("work", timeout=5, criteria=GOLD if protocol == "claimqueue" else None)(
            lambda job: {"done": job.input})
        store = SqliteStateStore(tmp_path / f"{protocol}.sqlite3")
        settings = Settings(protocol=protocol, base_url=url, api_key=CREDENTIALS[protocol], instance_id="self-pull",
                            handlers=["work"], max_in_flight=5, self_pull=True)
        services = Services(settings=settings, store=store, registry=registry)
        made.append((services, store))
        return services

    yield _make
    for services, store in made:
        services.close()
        store.close()


def puller(services: Services) -> dict[str, Any]:
    return pull_for(services, "work", time.time() + 60, LocalContext("executor", timeout_seconds=60))


def check_all_self_pulled(services: Services, result: dict[str, Any], count: int) -> None:
    assert [p["action"] for p in result["self_pulled"]] == ["reported"] * count, result
    assert result["stopped"] == "empty"
    items = [services.store.get(p["ledger_key"]) for p in result["self_pulled"]]
    assert all(i is not None and i.status is LedgerStatus.ACKNOWLEDGED for i in items), items
    assert {i.dispatch_mode for i in items if i is not None} == {DispatchMode.SELF_PULLED}
    assert services.store.count_in_flight(services.protocol_name, services.instance) == 0


def test_pipelogiq_pulls_without_waiting_with_the_stored_session(
        serve: Callable[..., SandboxServer], admin_for: Callable[[SandboxServer], SandboxAdmin],
        worker: Callable[..., Services]) -> None:
    server = serve("pipelogiq", poll_interval=0.05)
    admin = admin_for(server)
    admin.seed({"handler": "work", "inputs": [{"n": n} for n in range(4)]})
    services = worker("pipelogiq", server.url)
    services.ensure_session()  # the scheduler's: bootstraps and stores the session

    result = puller(services)

    check_all_self_pulled(services, result, 4)
    seen = admin.overview()
    assert [w["bootstraps"] for w in seen["workers"]] == [1]  # the scheduler's only
    assert [(p["waitSeconds"], p["status"]) for p in seen["pulls"]] == [(0, 200)] * 4 + [(0, 204)]


def test_pipelogiq_without_a_stored_session_never_bootstraps(
        serve: Callable[..., SandboxServer], admin_for: Callable[[SandboxServer], SandboxAdmin],
        worker: Callable[..., Services]) -> None:
    server = serve("pipelogiq")
    admin = admin_for(server)
    admin.seed({"handler": "work", "inputs": [{"n": 1}]})
    services = worker("pipelogiq", server.url)

    result = puller(services)

    assert result == {"handler": "work", "self_pulled": [], "stopped": "session"}
    seen = admin.overview()
    assert seen["workers"] == [] and seen["pulls"] == []
    assert admin.stats()["calls"].get("bootstrap", 0) == 0


def test_priostack_activates_one_job_of_the_handlers_type(
        serve: Callable[..., SandboxServer], admin_for: Callable[[SandboxServer], SandboxAdmin],
        worker: Callable[..., Services]) -> None:
    server = serve("priostack")
    admin = admin_for(server)
    admin.seed({"jobs": [{"type": "work", "variables": {"n": n}, "retries": 3} for n in range(3)]
                + [{"type": "other", "variables": {"n": n}, "retries": 3} for n in range(2)]})
    services = worker("priostack", server.url)

    result = puller(services)

    check_all_self_pulled(services, result, 3)
    jobs = admin.jobs()
    # Asked for more than one, the first activation would have handed out all three (and
    # the surplus been failed back, a second activation each): one each, one a call.
    assert sorted((j["type"], len(j["activations"]), j["state"]) for j in jobs) == \
        [("other", 0, "waiting")] * 2 + [("work", 1, "completed")] * 3
    assert admin.stats()["calls"]["activate"] == 4  # three jobs, then the empty one that stops it


def test_claimqueue_claims_with_the_handlers_criteria(
        serve: Callable[..., SandboxServer], admin_for: Callable[[SandboxServer], SandboxAdmin],
        worker: Callable[..., Services]) -> None:
    server = serve("claimqueue")
    admin = admin_for(server)
    admin.seed({"queue": "work", "items": [{**GOLD, "n": n} for n in range(3)] + [{"tier": "silver", "n": 9}] * 2})
    services = worker("claimqueue", server.url)

    result = puller(services)

    check_all_self_pulled(services, result, 3)
    jobs = admin.jobs()
    claimed = {j["item"]["tier"]: [h["event"] for h in j["history"] if h["event"] == "claim"] for j in jobs}
    assert claimed == {"gold": ["claim"], "silver": []}
    assert sorted((j["item"]["tier"], j["status"]) for j in jobs) == \
        [("gold", "finished")] * 3 + [("silver", "pending")] * 2


def test_a_delivery_for_another_handler_is_handed_back_unstarted(
        serve: Callable[..., SandboxServer], admin_for: Callable[[SandboxServer], SandboxAdmin],
        worker: Callable[..., Services]) -> None:
    # A server that ignores the type asked for: the job it hands out is not this executor's
    # to run. It is given back untouched, never recorded (runtime/pulling.py), and the loop ends.
    server = serve("priostack")
    admin = admin_for(server)
    admin.seed({"jobs": [{"type": "work", "variables": {"n": n}, "retries": 3} for n in range(2)]})
    admin.faults([{"kind": "corrupt_delivery", "endpoint": "activate", "field": "type", "value": "other",
                   "count": 1}])
    services = worker("priostack", server.url)

    result = puller(services)

    assert result == {"handler": "work", "self_pulled": [], "stopped": "refused", "not_asked_for": 1}
    assert admin.stats()["calls"]["activate"] == 1  # nothing pulled after it
    assert services.store.count_in_flight(services.protocol_name, services.instance) == 0
    jobs = admin.jobs()
    assert sorted((len(j["activations"]), j["state"]) for j in jobs) == [(0, "waiting"), (1, "waiting")]
    (handed,) = [j for j in jobs if j["activations"]]
    # Failed back with its retries unchanged: handing back uses no attempt.
    assert [(c["action"], c["body"]["retries"]) for c in handed["calls"]] == [("fail", 3)]


def test_a_duplicate_is_discarded_unrun_and_the_loop_goes_on(
        serve: Callable[..., SandboxServer], admin_for: Callable[[SandboxServer], SandboxAdmin],
        worker: Callable[..., Services]) -> None:
    # The scheduler holds one item (recorded, its executor not started yet) when the server
    # hands the same item to a pulling executor: the ledger refuses it as a duplicate.
    server = serve("claimqueue")
    admin = admin_for(server)
    admin.seed({"queue": "work", "items": [{**GOLD, "n": n} for n in range(3)]})
    services = worker("claimqueue", server.url)
    (held,) = services.call(lambda p: p.pull(PullRequest(handler="work", max_items=1, criteria=GOLD)))
    held_key = services.store.record_delivery(held, instance=services.instance, deadline=time.time() + 60,
                                              dispatch_mode=DispatchMode.INVOKE)
    admin.faults([{"kind": "duplicate_delivery", "endpoint": "claim", "count": 1}])

    result = puller(services)

    assert [p["action"] for p in result["self_pulled"]] == ["reported"] * 2 and result["stopped"] == "empty", result
    assert admin.stats()["calls"]["claim"] == 1 + 4  # the scheduler's; the duplicate, two jobs, the empty one
    item = services.store.get(str(held_key))
    assert item is not None and item.status is LedgerStatus.RECORDED and item.redelivered


def test_a_forgotten_job_coming_back_is_re_reported_never_run(
        serve: Callable[..., SandboxServer], admin_for: Callable[[SandboxServer], SandboxAdmin],
        worker: Callable[..., Services]) -> None:
    # Our outcome for the job is stored, and the server answered "not found" when it was
    # reported (it forgot the job); after its restart the job comes back to a pulling executor.
    server = serve("priostack")
    admin = admin_for(server)
    admin.seed({"jobs": [{"type": "work", "variables": {"n": 1}, "retries": 3}]})
    services = worker("priostack", server.url)
    (job,) = services.call(lambda p: p.pull(PullRequest(handler="work", max_items=1)))
    store = services.store
    key = store.record_delivery(job, instance=services.instance, deadline=time.time() + 60,
                                dispatch_mode=DispatchMode.INVOKE)
    assert key is not None and store.start_run(key, epoch="first-run", deadline=time.time() + 60) is not None
    store.store_outcome(key, "first-run", Outcome(kind=OutcomeKind.SUCCESS, value={"stored": True}))
    store.mark_acknowledged(key, ReportReceipt(accepted=False, status="not_found"))
    requests.post(f"{server.url}/_admin/restart", timeout=5).raise_for_status()

    result = puller(services)

    assert result["self_pulled"] == [{"ledger_key": key, "action": "reported"}], result
    (back,) = admin.jobs()
    assert back["state"] == "completed" and len(back["activations"]) == 2
    # The stored outcome went out, not a second run's ({"done": ...}).
    assert [(c["action"], c["body"]) for c in back["calls"] if c.get("applied")] == \
        [("complete", {"variables": {"stored": True}})]


@pytest.mark.parametrize(("fault", "reason"), [
    pytest.param({"kind": "rate_limit", "retry_after": 30}, "rate_limited", id="429"),
    pytest.param({"kind": "error_5xx", "status": 503}, "pull_error", id="503"),
])
def test_a_failed_pull_stops_the_loop_without_waiting(
        serve: Callable[..., SandboxServer], admin_for: Callable[[SandboxServer], SandboxAdmin],
        worker: Callable[..., Services], fault: dict[str, Any], reason: str) -> None:
    server = serve("claimqueue")
    admin = admin_for(server)
    admin.seed({"queue": "work", "items": [GOLD]})
    admin.faults([{**fault, "endpoint": "claim"}])
    services = worker("claimqueue", server.url)
    waits: list[float] = []
    services.sleep = waits.append

    result = puller(services)

    assert result == {"handler": "work", "self_pulled": [], "stopped": reason}
    assert admin.stats()["calls"]["claim"] == 1 and waits == []  # one call, never retried nor slept on


def test_pipelogiq_stops_once_the_session_is_replaced(
        serve: Callable[..., SandboxServer], admin_for: Callable[[SandboxServer], SandboxAdmin],
        tmp_path: Path) -> None:
    # At the second run our clock passes the session's expiry: the calls settling that run
    # renew it (as any executor's calls do), and the loop, which pulls only with the session
    # it began with, stops rather than pull under another.
    server = serve("pipelogiq")
    admin = admin_for(server)
    admin.seed({"handler": "work", "inputs": [{"n": n} for n in range(5)]})
    ahead = [0.0]
    runs: list[int] = []

    def work(job: Any) -> Any:
        runs.append(1)
        if len(runs) == 2:
            ahead[0] = 10 * 86400.0
        return {"n": job.input}

    registry = HandlerRegistry()
    registry.handler("work", timeout=5)(work)
    store = SqliteStateStore(tmp_path / "session.sqlite3")
    settings = Settings(protocol="pipelogiq", base_url=server.url, api_key=CREDENTIALS["pipelogiq"],
                        instance_id="self-pull", handlers=["work"], max_in_flight=5, self_pull=True)
    services = Services(settings=settings, store=store, registry=registry, clock=lambda: time.time() + ahead[0])
    try:
        services.ensure_session()
        result = puller(services)
    finally:
        services.close()
        store.close()

    assert result["stopped"] == "session" and len(runs) == 2, result
    assert [p["action"] for p in result["self_pulled"]] == ["reported"] * 2
    assert len(admin.overview()["pulls"]) == 2  # none after the session changed
