"""A server none of whose deliveries can be addressed (an older Pipelogiq release, the
sandbox's ``legacy`` mode): each scheduler tick stops pulling after the pull that shows it,
says why once, hands the deliveries back, and publishes no SuccessfulPolls, so the
stalled-poller alarm (SilentPollerAlarm, which watches that metric) fires. Nothing is
acknowledged away (docs/protocols.md, "Older Pipelogiq servers")."""

from __future__ import annotations

from typing import Any

import pytest
from e2e_support import HANDLERS_PATH

from serverless_worker.runtime.metrics import metrics
from support.template import load_template

pytestmark = pytest.mark.aws

LEGACY_LINE = ("deliveries carry no executionId: this server speaks a Pipelogiq worker protocol older "
               "than the lease API")


def test_an_older_pipelogiq_server_stops_each_tick_and_starves_the_stalled_poller_metric(
        worker_env: Any, caplog: pytest.LogCaptureFixture) -> None:
    # given the stalled-poller alarm watches SuccessfulPolls and treats silence as breaching
    alarm = load_template()["Resources"]["SilentPollerAlarm"]["Properties"]
    assert (alarm["MetricName"], alarm["ComparisonOperator"], alarm["TreatMissingData"]) == (
        "SuccessfulPolls", "LessThanThreshold", "breaching")
    # and an older Pipelogiq release with three jobs waiting
    env = worker_env("pipelogiq", handlers=["e2e.echo"], handler_module=HANDLERS_PATH, sandbox={"legacy": True},
                     settings={"liveness": "full-window"})
    env.seed("e2e.echo", [{"n": n} for n in range(3)])
    polls = metrics.totals["SuccessfulPolls"]

    # when two scheduler ticks run, each with a window long enough for hundreds of pulls
    reports = [env.tick(20.0) for _ in range(2)]

    # then each stops after its one pull, naming what the server lacks, and dispatches nothing
    for report in reports:
        assert report["stopped"] == "configuration: UnsupportedServerError", report
        assert report["pulls"] == 1 and report["pulled"] == 0 and report["dispatched"] == 0, report
        assert [error for error in report["errors"] if LEGACY_LINE in error] == report["errors"][-1:], report
    assert caplog.text.count(LEGACY_LINE) == 2  # logged once per tick
    # and the alarm's metric sees no successful poll
    assert metrics.totals["SuccessfulPolls"] == polls
    # and the jobs are on the server's queue, handed back each time, never acknowledged away
    for job in env.admin.jobs():
        events = [h["event"] for h in job["history"]]
        assert events.count("requeue") == 2 and "ack" not in events, events
    assert env.admin.overview()["inFlight"] == 0
    assert env.server.sandbox.calls["lease.acquire"] == 0  # type: ignore[attr-defined]
