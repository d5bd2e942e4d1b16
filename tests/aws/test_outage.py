"""The job server unavailable, then back: the scheduler gives up a tick after a few failed
pulls instead of burning the poll window (one pull per tick while it stays down), the
silent-poller alarm's metric (SuccessfulPolls) shows the outage, and work resumes on its
own once the server answers again, nothing lost."""

from __future__ import annotations

from typing import Any

import pytest
from e2e_support import HANDLERS_PATH, done, in_flight, wait_for
from e2e_support import ledger as ledger_items

from serverless_worker.runtime.metrics import metrics
from serverless_worker.runtime.scheduler import UNAVAILABLE_PULLS_MAX

pytestmark = pytest.mark.aws


@pytest.mark.parametrize("protocol", ["priostack", "claimqueue"])
def test_an_outage_ends_ticks_early_and_work_resumes_after_it(worker_env: Any, recorder: Any,
                                                              protocol: str) -> None:
    env = worker_env(protocol, handlers=["e2e.echo"], handler_module=HANDLERS_PATH,
                     settings={"liveness": "full-window"})
    env.seed("e2e.echo", [{"n": n} for n in range(3)])
    env.admin.faults([{"kind": "error_5xx", "endpoint": "*", "status": 503}])
    polls = metrics.totals["SuccessfulPolls"]

    first = env.tick(30.0)
    second = env.tick(30.0)

    # A 30 s window full of failures would pull every 2 s; the tick stops after a few.
    assert first["stopped"] == "server unavailable" and first["pulls"] == UNAVAILABLE_PULLS_MAX, first
    assert second["stopped"] == "server unavailable" and second["pulls"] == 1, second  # still down
    assert metrics.totals["SuccessfulPolls"] == polls  # the silent-poller alarm's metric sees nothing

    env.admin.clear_faults()
    _resumes(env, recorder, protocol, polls)


@pytest.mark.parametrize("protocol", ["pipelogiq", "priostack", "claimqueue"])
def test_an_unreachable_server_ends_ticks_early_and_work_resumes_when_it_is_back(
        worker_env: Any, recorder: Any, protocol: str) -> None:
    """The server process gone (every connection refused), then started again on its port
    with its state, as after an outage of the host: no tick spends its window retrying, and
    the jobs waiting on the server are done once each when it is back."""
    from serverless_worker.sandbox._server import SandboxServer

    env = worker_env(protocol, handlers=["e2e.echo"], handler_module=HANDLERS_PATH,
                     settings={"liveness": "full-window"})
    env.seed("e2e.echo", [{"n": n} for n in range(3)])
    polls = metrics.totals["SuccessfulPolls"]
    port = env.server.port
    env.server.stop()

    down = [env.tick(30.0) for _ in range(2)]

    for report in down:
        assert report["pulled"] == 0 and report["pulls"] <= UNAVAILABLE_PULLS_MAX, report
        assert report["stopped"], f"a tick against an unreachable server ends early: {report}"
    assert metrics.totals["SuccessfulPolls"] == polls

    env.server = SandboxServer(env.server.sandbox, port=port).start()
    _resumes(env, recorder, protocol, polls)


@pytest.mark.parametrize("protocol", ["priostack", "claimqueue"])
def test_a_report_that_meets_the_outage_is_sent_again_when_the_server_is_back(
        worker_env: Any, recorder: Any, protocol: str) -> None:
    """The handler finishes while the server is unreachable: its outcome is stored, the
    report fails after the client's retries, and the reaper (the one owner from then on,
    docs/retries.md) sends the stored outcome again once the server is back, without
    running the handler again. (Pipelogiq is left out: there a run cannot outlive its last
    confirmed lease, so an outage longer than the lease ends the run instead.)"""
    from serverless_worker.model import LedgerStatus
    from serverless_worker.sandbox._server import SandboxServer

    env = worker_env(protocol, handlers=["e2e.gate"], handler_module=HANDLERS_PATH)
    env.seed("e2e.gate", [{"n": 1}])
    env.tick(1.0)
    assert recorder.wait_active(1), "the handler started"
    port = env.server.port
    env.server.stop()
    deferred = metrics.totals["Jobs_deferred"]

    recorder.release.set()  # the handler returns; its report meets a refused connection
    env.stack.wait_idle()
    # The executor leaves the report it gave up on to the reaper and ends without an error,
    # so Lambda's asynchronous retry does not send the same report again.
    assert env.stack.lambdas.background_errors == []
    assert metrics.totals["Jobs_deferred"] == deferred + 1
    (item,) = ledger_items(env)
    assert item.status == LedgerStatus.OUTCOME_STORED and item.settle_failures >= 1, item

    env.server = SandboxServer(env.server.sandbox, port=port).start()

    def reported() -> bool:
        env.tick(1.0)
        env.stack.wait_idle()
        return all(done(protocol, job) for job in env.admin.jobs())

    wait_for(reported, 60, "the stored outcome reported after the outage", interval=1.0)
    assert list(recorder.counts("e2e.gate").values()) == [1], "the handler ran once"
    assert in_flight(env) == 0


def _resumes(env: Any, recorder: Any, protocol: str, polls: float) -> None:
    """The server is back: the next tick pulls the 3 waiting jobs, each runs once, nothing is left."""
    report = env.tick(2.0)
    assert report["stopped"] is None and report["pulled"] == 3, report
    env.stack.wait_idle()
    wait_for(lambda: all(done(protocol, job) for job in env.admin.jobs()), what="all 3 jobs done")
    assert metrics.totals["SuccessfulPolls"] > polls
    assert set(recorder.counts().values()) == {1} and len(recorder.counts()) == 3
    assert in_flight(env) == 0
