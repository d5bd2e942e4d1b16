"""One job, one fate, whatever else is in its batch: a delivery the ledger cannot hold
(content nested past pydantic's serialisation depth, not valid Unicode, past the item
limit; an id no key can hold) is settled on its own and the rest of its pulled batch is
recorded and dispatched; a pull answer nested past the JSON decoder's depth is an
unusable answer, never a crash of the tick.

Real sandboxes on loopback and a real SQLite store (the local worker's; the DynamoDB
path is tests/aws/test_poison.py); the dispatcher only notes the keys it is given.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from serverless_worker.model import LedgerStatus
from serverless_worker.registry import HandlerRegistry
from serverless_worker.runtime.context import LocalContext
from serverless_worker.runtime.dispatch import Dispatcher
from serverless_worker.runtime.scheduler import Scheduler, TickReport
from serverless_worker.runtime.services import Services
from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin
from serverless_worker.settings import Settings
from serverless_worker.state import SqliteStateStore
from support.poison import incompressible, nested
from support.waiting import wait_for

INSTANCE = "poison-test"
CREDENTIALS = {"pipelogiq": "sandbox-api-key", "priostack": "sandbox-api-key", "claimqueue": "sandbox-token"}




# Each poison's job content, and the words its reason must carry.
POISONS: dict[str, tuple[dict[str, Any], str]] = {
    "nested 300 deep": ({"deep": nested(300)}, "nests too deep"),
    "1 MiB of variables": ({"blob": incompressible(1 << 20)}, "item limit"),
    "a lone surrogate in the content": ({"text": "\ud800"}, "not valid Unicode"),
}


class NotingDispatcher(Dispatcher):
    def __init__(self) -> None:
        self.invoked: list[str] = []

    def invoke_executor(self, ledger_key: str) -> None:
        self.invoked.append(ledger_key)

    def start_execution(self, ledger_key: str, handover_epoch: str | None = None) -> None:
        raise AssertionError("no handler here is long-running")


@pytest.fixture
def worker(tmp_path: Path) -> Any:
    made: list[tuple[Services, SqliteStateStore]] = []

    def _make(protocol: str, url: str) -> tuple[Services, NotingDispatcher]:
        registry = HandlerRegistry()
        registry.handler("work", timeout=5)(lambda job: {"ok": True})
        store = SqliteStateStore(tmp_path / f"{protocol}.sqlite3")
        dispatcher = NotingDispatcher()
        settings = Settings(protocol=protocol, base_url=url, api_key=CREDENTIALS[protocol], instance_id=INSTANCE,
                            handlers=["work"], batch_size=10, max_in_flight=50)
        services = Services(settings=settings, store=store, registry=registry, dispatcher=dispatcher)
        made.append((services, store))
        return services, dispatcher

    yield _make
    for services, store in made:
        services.close()
        store.close()


def tick(services: Services, window: float = 0.5) -> TickReport:
    scheduler = Scheduler(services, sleep=lambda seconds: None)
    try:
        return scheduler.tick(LocalContext("scheduler", timeout_seconds=30), window=window)
    finally:
        scheduler.close()


def seed(admin: SandboxAdmin, protocol: str, inputs: list[dict[str, Any]]) -> list[str]:
    if protocol == "priostack":
        return list(admin.seed({"jobs": [{"type": "work", "variables": v, "retries": 3} for v in inputs]}))
    if protocol == "pipelogiq":
        return list(admin.seed({"handler": "work", "inputs": inputs})["jobIds"])
    return list(admin.seed({"queue": "work", "items": inputs}))


def poisoned_outcome(protocol: str, job: dict[str, Any]) -> str:
    """The poisoned job's definite outcome on the server, as its error text."""
    if protocol == "priostack":
        assert job["state"] == "incident" and job["retries"] == 0, job  # fail with retries 0
        return str(job["error_message"])
    if protocol == "pipelogiq":
        assert job["status"] == "Failed" and job["errorCode"] == "VALIDATION_ERROR", job
        return str([h for h in job["history"] if h["event"].startswith("result")])
    assert job["status"] == "finished" and job["result"]["errorCode"] == "VALIDATION_ERROR", job
    return str(job["result"]["error"])


CASES = [("priostack", name) for name in POISONS] + [
    ("claimqueue", "nested 300 deep"), ("claimqueue", "1 MiB of variables"),
    ("pipelogiq", "1 MiB of variables")]


@pytest.mark.parametrize(("protocol", "poison"), CASES, ids=[f"{p}-{n}" for p, n in CASES])
def test_a_poisoned_job_gets_its_outcome_and_the_rest_of_its_batch_is_dispatched(
        protocol: str, poison: str, worker: Any, serve: Callable[..., SandboxServer],
        admin_for: Callable[[SandboxServer], SandboxAdmin]) -> None:
    # given five jobs waiting, the third of them poisoned
    content, reason = POISONS[poison]
    server = serve(protocol)
    admin = admin_for(server)
    inputs = [{"n": 0}, {"n": 1}, content, {"n": 3}, {"n": 4}]
    ids = seed(admin, protocol, inputs)
    services, dispatcher = worker(protocol, server.url)

    # when one tick pulls them
    report = tick(services)

    # then the tick ended normally, the four good jobs are in the ledger and dispatched
    assert report.pulled == 5 and report.errors == [] and report.stopped is None, report
    assert report.dispatched == 4 and report.unrecordable == 1 and report.unsettled == [], report
    assert len(dispatcher.invoked) == 4
    for key in dispatcher.invoked:
        item = services.store.get(key)
        assert item is not None and item.status is LedgerStatus.RECORDED and item.delivery.job_id != ids[2]
    # and the poisoned one has its definite outcome on the server, naming why
    def poisoned() -> dict[str, Any]:
        return next(job for job in admin.jobs() if job.get("key", job.get("job_id", job.get("id"))) == ids[2])

    if protocol == "pipelogiq":  # its server applies a result after answering 202
        wait_for(lambda: poisoned()["status"] != "Running", what="the poisoned stage's result applied")
    text = poisoned_outcome(protocol, poisoned())
    assert "VALIDATION_ERROR" in text or protocol != "priostack", text
    assert reason in text and "cannot record" in text, text


def test_a_job_key_no_request_can_name_is_left_unsettled_and_said_so(
        worker: Any, serve: Callable[..., SandboxServer], admin_for: Callable[[SandboxServer], SandboxAdmin]) -> None:
    # given five Priostack jobs, one of them keyed with a lone surrogate (as JSON "\ud800")
    server = serve("priostack")
    admin = admin_for(server)
    admin.seed({"jobs": [{"type": "work", "variables": {"n": n}, "retries": 3} for n in range(2)]
                + [{"type": "work", "key": "\ud800", "retries": 3}]
                + [{"type": "work", "variables": {"n": n}, "retries": 3} for n in range(3, 5)]})
    services, dispatcher = worker("priostack", server.url)

    report = tick(services)

    # then the four others are dispatched; the poisoned one cannot be failed (no URL names it,
    # a guess could name another job), so the tick reports it unsettled, with its id and why
    assert report.pulled == 5 and report.errors == [] and report.dispatched == 4, report
    assert report.unrecordable == 1 and len(report.unsettled) == 1, report
    assert "'\\ud800'" in report.unsettled[0] and "not valid Unicode" in report.unsettled[0], report.unsettled
    assert len(dispatcher.invoked) == 4
    poisoned = next(job for job in admin.jobs() if job["key"] == "\ud800")
    assert poisoned["state"] == "active" and poisoned["calls"] == [], poisoned  # no request went out for it


@pytest.mark.parametrize("protocol", ["priostack", "claimqueue", "pipelogiq"])
def test_a_pull_answer_nested_past_the_decoder_is_an_unusable_answer_not_a_crash(
        protocol: str, worker: Any, serve: Callable[..., SandboxServer],
        admin_for: Callable[[SandboxServer], SandboxAdmin]) -> None:
    # given a server whose next pull answer nests 100,000 deep
    server = serve(protocol)
    admin = admin_for(server)
    seed(admin, protocol, [{"n": 0}])
    label = {"priostack": "activate", "claimqueue": "claim", "pipelogiq": "pull"}[protocol]
    admin.faults([{"kind": "deep_answer", "endpoint": label, "count": 1}])
    services, dispatcher = worker(protocol, server.url)

    # when a tick pulls
    report = tick(services)

    # then the tick returns (no RecursionError) and the answer counts as unusable, once
    assert admin.stats()["faults_fired"] == 1
    assert dispatcher.invoked == []
    unusable = {"priostack": "nests too deep to decode", "claimqueue": "answer is not a JSON object"}
    if protocol == "pipelogiq":  # a pull answer with no readable token is skipped (its visibility timeout)
        assert report.errors == [], report
    else:
        assert [error for error in report.errors if unusable[protocol] in error], report
