"""A drain treats a delivery an executor pulled and recorded itself (``record_running``) as
a run in flight: never handed back (it is never ``RECORDED``), waited for until its final
write, while what the scheduler recorded and no executor started goes back at once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from e2e_support import HANDLERS_PATH, in_flight, ledger

from serverless_worker.model import DispatchMode, LedgerStatus, Outcome, OutcomeKind, ReportReceipt
from serverless_worker.protocols.base import PullRequest
from serverless_worker.runtime.drain import drain

pytestmark = pytest.mark.aws

HANDLER = "e2e.echo"


def test_a_drain_waits_for_a_self_pulled_run_and_hands_back_only_the_unstarted(
        worker_env: Callable[..., Any]) -> None:
    env = worker_env("priostack", handlers=[HANDLER], handler_module=HANDLERS_PATH)
    services = env.stack.services()
    env.seed(HANDLER, [{"n": 1}, {"n": 2}])
    services.ensure_session()
    pulled = services.call(lambda p: p.pull(PullRequest(handler=HANDLER, max_items=2, wait_seconds=1)))
    unstarted, running = sorted(pulled, key=lambda d: d.payload["n"])
    store, now = services.store, services.clock()
    recorded = store.record_delivery(unstarted, instance=services.instance, deadline=now + 60,
                                     dispatch_mode="invoke")
    item = store.record_running(running, instance=services.instance, epoch="req-1/a1", deadline=now + 300)
    assert recorded is not None and item is not None and in_flight(env) == 2
    polls: list[dict[str, Any]] = []

    def executor_finishes(_: float) -> None:
        # Each drain poll: what the ledger holds then; at the first, the executor settles its run.
        polls.append({i.key: i.status for i in ledger(env)})
        if len(polls) == 1:
            store.store_outcome(item.key, "req-1/a1", Outcome(kind=OutcomeKind.SUCCESS, value={"ok": True}))
            assert store.mark_acknowledged(item.key, ReportReceipt(status="completed"))

    report = drain(services, grace_seconds=600, sleep=executor_finishes, shutdown=False)

    # the first pass handed back the unstarted one and left the self-pulled run running
    assert polls == [{recorded: LedgerStatus.HANDED_BACK, item.key: LedgerStatus.RUNNING}]
    assert (report.handed_back, report.finished_in_flight, report.still_running) == (1, 1, 0), report
    final = {i.key: (i.status, i.dispatch_mode) for i in ledger(env)}
    assert final == {recorded: (LedgerStatus.HANDED_BACK, DispatchMode.INVOKE),
                     item.key: (LedgerStatus.ACKNOWLEDGED, DispatchMode.SELF_PULLED)}
    assert in_flight(env) == 0
