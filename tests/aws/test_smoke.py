"""The shipped example handlers (functions/handlers) work jobs end to end on every protocol:
the module the template's HandlerModule names, not the test suite's own handlers."""

from __future__ import annotations

from typing import Any

import pytest
from e2e_support import PROTOCOLS, done, ledger, wait_for

from serverless_worker.model import LedgerStatus

pytestmark = pytest.mark.aws


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_example_echo_handler_gets_jobs_done(worker_env: Any, protocol: str) -> None:
    env = worker_env(protocol, handlers=["echo"])
    env.seed("echo", [{"n": i} for i in range(5)])

    report = env.tick(2.0)

    assert report["pulled"] == 5 and report["dispatched"] == 5 and not report["errors"], report
    env.stack.wait_idle()
    wait_for(lambda: all(done(protocol, job) for job in env.admin.jobs()), what="5 echo jobs done")
    assert len(env.admin.jobs()) == 5
    wait_for(lambda: all(i.status == LedgerStatus.ACKNOWLEDGED for i in ledger(env)), what="5 ledger items settled")
    assert len(ledger(env)) == 5
