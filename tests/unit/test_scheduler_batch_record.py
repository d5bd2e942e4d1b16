"""A tick on the local SQLite state file records each pulled batch in one transaction
(``record_new``), on its own thread, then dispatches it; a delivery the ledger already has
still goes through ``record_delivery`` on the dispatch pool, which tells it is a duplicate.

A real Priostack sandbox on loopback and a real SQLite store; the dispatcher only notes
the keys it is given (running them is the executor's tier).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from serverless_worker.model import Delivery, LedgerStatus
from serverless_worker.registry import HandlerRegistry
from serverless_worker.runtime.context import LocalContext
from serverless_worker.runtime.dispatch import Dispatcher
from serverless_worker.runtime.scheduler import Scheduler
from serverless_worker.runtime.services import Services
from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin
from serverless_worker.settings import Settings
from serverless_worker.state import SqliteStateStore

INSTANCE = "batch-test"


class NotingDispatcher(Dispatcher):
    def __init__(self) -> None:
        self.invoked: list[str] = []

    def invoke_executor(self, ledger_key: str) -> None:
        self.invoked.append(ledger_key)

    def start_execution(self, ledger_key: str, handover_epoch: str | None = None) -> None:
        raise AssertionError("no handler here is long-running")


class CountingStore(SqliteStateStore):
    """The real store, noting how each delivery was recorded."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.batches: list[int] = []
        self.one_at_a_time = 0

    def record_new(self, deliveries: Any, **kwargs: Any) -> list[str | None]:
        self.batches.append(len(deliveries))
        return super().record_new(deliveries, **kwargs)

    def record_delivery(self, *args: Any, **kwargs: Any) -> str | None:
        self.one_at_a_time += 1
        return super().record_delivery(*args, **kwargs)


def _tick(services: Services) -> Any:
    scheduler = Scheduler(services, sleep=lambda seconds: None)
    try:
        return scheduler.tick(LocalContext("scheduler", timeout_seconds=30), window=0.5)
    finally:
        scheduler.close()


def _delivery(job_key: str) -> Delivery:
    """The delivery the sandbox will hand out for ``job_key`` (seeded with 3 retries)."""
    return Delivery(protocol="priostack", handler="work", job_id=job_key, ledger_id=f"{job_key}:r3", attempt=1,
                    payload={}, timeout_seconds=300.0, token=SecretStr(job_key), wire={})


def test_a_pulled_batch_is_recorded_at_once_and_what_the_ledger_has_goes_one_at_a_time(
        tmp_path: Path, serve: Callable[..., SandboxServer],
        admin_for: Callable[[SandboxServer], SandboxAdmin]) -> None:
    server = serve("priostack")
    jobs = admin_for(server).seed({"jobs": [{"type": "work", "variables": {"n": n}, "retries": 3}
                                            for n in range(6)]})
    registry = HandlerRegistry()
    registry.handler("work", timeout=5)(lambda job: {"ok": True})
    store = CountingStore(tmp_path / "state.sqlite3")
    dispatcher = NotingDispatcher()
    settings = Settings(protocol="priostack", base_url=server.url, api_key="sandbox-api-key", instance_id=INSTANCE,
                        handlers=["work"], batch_size=10, max_in_flight=50)
    services = Services(settings=settings, store=store, registry=registry, dispatcher=dispatcher)
    # given the ledger already has two of the jobs: one running (a duplicate when it comes
    # again), one handed back (its redelivery is the one asked for)
    running = store.record_delivery(_delivery(jobs[0]), instance=INSTANCE, deadline=time.time() + 60,
                                    dispatch_mode="invoke")
    assert running is not None and store.start_run(running, "run-1", time.time() + 60) is not None
    handed = store.record_delivery(_delivery(jobs[1]), instance=INSTANCE, deadline=time.time() + 60,
                                   dispatch_mode="invoke")
    assert handed is not None and store.mark_handed_back(handed, "shutdown")
    store.one_at_a_time = 0
    try:
        report = _tick(services)

        assert report.pulled == 6 and report.errors == []
        assert store.batches == [6] and store.one_at_a_time == 2
        assert report.dispatched == 5 and report.duplicates == 1
        assert sorted(dispatcher.invoked) == sorted(f"delivery#priostack#{job}:r3" for job in jobs[1:])
        for key in dispatcher.invoked:
            item = store.get(key)
            assert item is not None and item.status is LedgerStatus.RECORDED and item.instance == INSTANCE
        item = store.get(running)
        assert item is not None and item.status is LedgerStatus.RUNNING and item.epoch == "run-1"
    finally:
        store.close()
