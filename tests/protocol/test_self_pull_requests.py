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

from serverless_worker.model import DispatchMode, LedgerStatus
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
