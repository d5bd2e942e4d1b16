"""A server that answers ``429`` with a ``Retry-After`` a day or a year away, through moto
running the real functions against the sandboxes, every protocol.

A report so answered is not waited on at all (the wait does not fit the retry budget, the
invocation or the job's lease): the executor ends ``deferred`` at once, its outcome stored,
the failure noted on the ledger item, and the reaper reports the job once the server
relents (a pull so answered: tests/aws/test_scheduler_retry_after.py).
"""

from __future__ import annotations

import time
from email.utils import formatdate
from typing import Any

import pytest
from e2e_support import HANDLERS_PATH, PROTOCOLS, backdate, done, ledger, results, wait_for

from serverless_worker.model import LedgerStatus

pytestmark = pytest.mark.aws

REPORT = {"pipelogiq": "result", "priostack": "complete", "claimqueue": "result"}
A_YEAR = 365 * 86400
HINTS = {"a day": lambda: "86400", "a year ahead": lambda: formatdate(time.time() + A_YEAR, usegmt=True)}


@pytest.mark.parametrize("hint", HINTS)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_report_told_to_wait_a_day_is_left_to_the_reaper_and_reported_when_the_server_relents(
        worker_env: Any, protocol: str, hint: str) -> None:
    # given a server that answers the first report 429 with a Retry-After a day or a year away
    env = worker_env(protocol, handlers=["e2e.echo"], handler_module=HANDLERS_PATH)
    env.seed("e2e.echo", [{"n": 1}])
    label = REPORT[protocol]
    env.admin.faults([{"kind": "rate_limit", "endpoint": label, "retry_after": HINTS[hint](), "count": 1}])

    # when a tick dispatches the job and its executor runs it
    env.tick(1.0)
    env.stack.wait_idle(30)

    # then the executor ended without waiting: one report call, the outcome stored and the
    # failure noted for the reaper (its retry time as the deadline), nothing reported yet
    (item,) = ledger(env)
    assert item.status is LedgerStatus.OUTCOME_STORED and item.settle_failures == 1, item
    assert env.admin.stats()["calls"][label] == 1
    (job,) = env.admin.jobs()
    assert results(protocol, job) == [], job

    # and when the server has relented and the reaper's time has come, the next tick reports it
    backdate(env, item.key)
    env.tick(1.0)
    env.stack.wait_idle(30)
    wait_for(lambda: done(protocol, env.admin.jobs()[0]), 10, "the job reported by the reaper")
    (item,) = ledger(env)
    assert item.status is LedgerStatus.ACKNOWLEDGED, item
    assert env.admin.stats()["calls"][label] == 2  # the refused one and the reaper's: nothing in between


def test_a_pipelogiq_report_waits_no_longer_than_the_job_s_lease_less_the_report_margin(
        worker_env: Any, caplog: pytest.LogCaptureFixture) -> None:
    # given a 3 s lease under the 10 s report margin, and a first report answered 429
    # Retry-After: 2, a wait the 30 s retry budget alone would allow
    env = worker_env("pipelogiq", handlers=["e2e.echo"], handler_module=HANDLERS_PATH, sandbox={"lease_seconds": 3})
    env.seed("e2e.echo", [{"n": 1}])
    env.admin.faults([{"kind": "rate_limit", "endpoint": "result", "retry_after": 2, "count": 1}])

    with caplog.at_level("WARNING", logger="serverless_worker.executor"):
        env.tick(1.0)
        env.stack.wait_idle(30)

    # then it was not waited: past the lease the server's recovery owns the job, and the one
    # line says which limit
    (item,) = ledger(env)
    assert item.status is LedgerStatus.OUTCOME_STORED and item.settle_failures == 1, item
    assert env.admin.stats()["calls"]["result"] == 1
    lines = [r.getMessage() for r in caplog.records if "left to the reaper" in r.getMessage()]
    assert len(lines) == 1 and "before the job's lease end less the report margin" in lines[0], lines
