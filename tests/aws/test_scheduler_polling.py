"""How a tick polls: the back-off after empty pulls (Priostack, claim queue), the liveness
modes (how long a tick without work stays), and the pipelined record-and-dispatch with
parallel claims, through moto running the real functions against the sandboxes.

The scheduler is built on the stack's own services with a ``sleep`` that notes each wait
it asks for, so a test reads the waits the tick chose. Where the test counts what fits in
the window, the tick runs on a clock of its own (``tick_clock``) that only those waits
move: the window is then the tick's time, whatever the claims and records cost on a loaded
machine. Where executors must make progress while the tick waits (capacity, room for a
batch), the waits are real and the window only bounds the tick.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from e2e_support import HANDLERS_PATH, PROTOCOLS, done, in_flight, ledger, tick_with, unsettled_peak, wait_for

from serverless_worker.model import LedgerStatus
from serverless_worker.protocols.pipelogiq import PipelogiqClient
from serverless_worker.runtime.scheduler import TickReport
from support.clock import TickClock

pytestmark = pytest.mark.aws

_PULL_LABEL = {"pipelogiq": "pull", "priostack": "activate", "claimqueue": "claim"}
_NO_LONG_POLL = ("priostack", "claimqueue")


class Sleeps:
    """The scheduler's ``sleep``: notes (wall time, seconds). On the tick's own clock it moves
    that clock instead of waiting; without one it really waits (executors run meanwhile)."""

    def __init__(self, clock: TickClock | None = None) -> None:
        self.calls: list[tuple[float, float]] = []
        self.clock = clock

    def __call__(self, seconds: float) -> None:
        self.calls.append((time.time(), seconds))
        if self.clock is not None:
            self.clock.sleep(seconds)
        else:
            time.sleep(seconds)

    @property
    def waits(self) -> list[float]:
        return [seconds for _, seconds in self.calls]


def _tick(env: Any, window: float, sleeps: Sleeps | None = None) -> TickReport:
    """One tick; on ``sleeps.clock`` when it has one."""
    sleeps = sleeps or Sleeps()
    return tick_with(env, window, sleep=sleeps, clock=sleeps.clock)


def _pull_calls(env: Any) -> int:
    return int(env.admin.stats()["calls"].get(_PULL_LABEL[env.protocol], 0))


def _taken_at(protocol: str, job: dict[str, Any]) -> float:
    """When the sandbox handed the job out."""
    if protocol == "priostack":
        return float(job["activations"][0]["at"])
    return float(next(h["at"] for h in job["history"] if h["event"] == "claim"))


# -- back-off after empty pulls -------------------------------------------------------------------
def test_priostack_waits_for_a_batch_of_room_instead_of_activating_a_few_jobs_per_call(
        worker_env: Any, recorder: Any) -> None:
    """At capacity, executors free one slot at a time: activating as soon as one slot is free
    would spend an activate call per job or two. One call hands out a whole batch, so the
    tick waits (briefly) for a batch's worth of room."""
    jobs, batch = 24, 4
    env = worker_env("priostack", handlers=["e2e.slow"], handler_module=HANDLERS_PATH,
                     settings={"batch_size": batch, "max_in_flight": batch, "liveness": "while-work"})
    # Runs of 0.3 to 1.5 s: a one-second wait at capacity frees only part of the room.
    env.seed("e2e.slow", [{"sleep": 0.3 + 0.4 * (i % batch), "n": i} for i in range(jobs)])
    # The waits are real (the executors free the room meanwhile), so the bound on them is
    # lifted here: on a loaded machine a batch's last slot may free later than the 2 s a
    # tick waits for it (the bound has a test of its own, below). The window only bounds
    # the tick: a while-work tick ends once the queue stays empty.
    report = tick_with(env, 60.0, sleep=Sleeps(), room_wait_max=60.0)

    assert report.pulled == report.dispatched == jobs and not report.errors, report
    env.stack.wait_idle()
    wait_for(lambda: all(done("priostack", job) for job in env.admin.jobs()), what=f"all {jobs} jobs done")
    # Every activate that handed out jobs handed out a whole batch (the jobs one call hands
    # out share its time); the others are the empty polls that end the tick.
    calls = Counter(_taken_at("priostack", job) for job in env.admin.jobs())
    assert sorted(calls.values()) == [batch] * (jobs // batch), calls
    assert unsettled_peak("priostack", env.admin.jobs()) <= batch
    assert set(recorder.counts().values()) == {1} and in_flight(env) == 0


def test_the_wait_for_a_batch_of_room_is_bounded_then_takes_what_fits(worker_env: Any, recorder: Any) -> None:
    """Two long jobs hold half the capacity: waiting for a whole batch of room would take
    nothing until both end. After ``room_wait_max`` the tick takes what fits, so the short
    jobs are all done while the long ones still run."""
    env = worker_env("priostack", handlers=["e2e.slow"], handler_module=HANDLERS_PATH,
                     settings={"batch_size": 4, "max_in_flight": 4, "liveness": "while-work"})
    long_keys = env.seed("e2e.slow", [{"sleep": 4.0, "n": f"long-{i}"} for i in range(2)])
    env.seed("e2e.slow", [{"sleep": 0.05, "n": i} for i in range(10)])
    # The window only bounds the tick: a while-work tick ends once the queue stays empty.
    report = tick_with(env, 60.0, sleep=Sleeps(), room_wait_max=0.5)

    assert report.pulled == report.dispatched == 12 and not report.errors, report
    env.stack.wait_idle()
    wait_for(lambda: all(done("priostack", job) for job in env.admin.jobs()), what="all 12 jobs done")
    jobs = {job["key"]: job for job in env.admin.jobs()}
    long_done = min(call["at"] for key in long_keys for call in jobs[key]["calls"])
    short_taken = [job["activations"][0]["at"] for key, job in jobs.items() if key not in long_keys]
    # The first activation took both long jobs and two short ones; waiting for a whole batch
    # of room would take no other short job before both long ones reported.
    assert len(short_taken) == 10 and sum(at < long_done for at in short_taken) >= 4, (short_taken, long_done)
    assert unsettled_peak("priostack", env.admin.jobs()) <= 4
    assert set(recorder.counts().values()) == {1} and in_flight(env) == 0


@pytest.mark.parametrize("protocol", _NO_LONG_POLL)
def test_empty_pulls_back_off_from_a_short_wait_to_the_maximum(worker_env: Any, tick_clock: TickClock,
                                                               protocol: str) -> None:
    env = worker_env(protocol, handlers=["e2e.echo"], handler_module=HANDLERS_PATH,
                     settings={"poll_backoff_seconds": 0.1, "poll_backoff_max_seconds": 0.4})
    sleeps = Sleeps(tick_clock)  # the 3 s window and the waits on one clock: the pulls take none of it

    report = _tick(env, 3.0, sleeps)

    waits = sleeps.waits
    assert report.pulled == 0 and not report.errors, report
    assert report.pulls == len(waits) == _pull_calls(env)  # one wait after each empty pull
    # Each wait in the upper half of its step: 0.1, 0.2, 0.4, then 0.4 (the last one is cut
    # short by the window's end).
    steps = [0.1, 0.2, 0.4] + [0.4] * (len(waits) - 3)
    assert len(waits) >= 5, waits
    for wait, step in zip(waits[:-1], steps, strict=False):
        assert step / 2 <= wait <= step, waits


def test_empty_long_polls_answered_at_once_are_backed_off_not_repeated(worker_env: Any) -> None:
    """A Pipelogiq server that ignores waitSeconds (204 at once, as its older release does):
    the tick paces its empty pulls by what the server did, as for a protocol without a long
    poll, instead of pulling again at once for the whole window."""
    env = worker_env("pipelogiq", handlers=["e2e.echo"], handler_module=HANDLERS_PATH,
                     settings={"wait_seconds_long_poll": 3, "liveness": "full-window"})
    env.admin.faults([{"kind": "ignore_wait", "endpoint": "pull"}])
    sleeps = Sleeps()

    report = _tick(env, 5.0, sleeps)

    # Waits of 0.1-0.2, 0.2-0.4, 0.4-0.8, 0.8-1.6 then 1.6-3.2 s: a handful of pulls, where
    # pulling again at once made hundreds a second.
    assert report.pulled == 0 and not report.errors, report
    assert report.pulls == _pull_calls(env) <= 10, (report.pulls, sleeps.waits)
    assert all(p["status"] == 204 for p in env.admin.overview()["pulls"])
    backoffs = [wait for wait in sleeps.waits if wait > 0]
    assert len(backoffs) >= report.pulls - 2 and max(backoffs) <= PipelogiqClient.empty_poll_backoff, sleeps.waits


@pytest.mark.parametrize("protocol", _NO_LONG_POLL)
def test_pulls_again_at_once_while_pulls_return_work(worker_env: Any, recorder: Any, tick_clock: TickClock,
                                                    protocol: str) -> None:
    env = worker_env(protocol, handlers=["e2e.echo"], handler_module=HANDLERS_PATH,
                     settings={"batch_size": 4, "liveness": "while-work"})
    env.seed("e2e.echo", [{"n": i} for i in range(12)])
    sleeps = Sleeps(tick_clock)  # three batches fit the 3 s window however long each pull takes

    report = _tick(env, 3.0, sleeps)

    assert report.pulled == report.dispatched == 12 and not report.errors, report
    env.stack.wait_idle()
    wait_for(lambda: all(done(protocol, job) for job in env.admin.jobs()), what="all 12 jobs done")
    last_taken = max(_taken_at(protocol, job) for job in env.admin.jobs())
    # Three batches (and more claims) one after another: no wait before the last job was taken.
    assert sleeps.calls and all(at >= last_taken for at, _ in sleeps.calls), (sleeps.calls, last_taken)
    assert sleeps.waits[0] <= env.stack.services().settings.poll_backoff_seconds
    runs = recorder.counts()
    assert len(runs) == 12 and set(runs.values()) == {1}  # each job ran once
    assert len(ledger(env)) == 12 and in_flight(env) == 0


@pytest.mark.parametrize("protocol", _NO_LONG_POLL)
def test_a_pull_that_comes_back_short_is_followed_by_a_wait(worker_env: Any, tick_clock: TickClock,
                                                           protocol: str) -> None:
    env = worker_env(protocol, handlers=["e2e.echo"], handler_module=HANDLERS_PATH,
                     settings={"batch_size": 4, "poll_backoff_seconds": 0.2, "poll_backoff_max_seconds": 0.4})
    env.seed("e2e.echo", [{"n": i} for i in range(3)])  # fewer than a batch: the queue is then empty
    # On the tick's clock: a second pull fits the window however slow the first, with its
    # records and dispatches, is on a loaded machine (the tick stops pulling near its end).
    sleeps = Sleeps(tick_clock)

    report = _tick(env, 5.0, sleeps)

    assert report.pulled == report.dispatched == 3 and not report.errors, report
    # Every pull, the one that got the three jobs included, is followed by a wait: no pull
    # goes out at once to an empty queue.
    assert report.pulls == len(sleeps.calls) >= 2, (report, sleeps.waits)
    assert 0.1 <= sleeps.waits[0] <= 0.2, sleeps.waits  # the first step after work
    env.stack.wait_idle()


def test_a_busy_queue_is_pulled_at_full_speed_beside_empty_long_poll_queues(worker_env: Any,
                                                                          recorder: Any) -> None:
    """Pipelogiq, 1 busy + 3 empty handlers: while the busy queue has work the empty ones are
    asked with waitSeconds 0, so its jobs come in one batch per round, not one per 3 s of
    empty long polls; once everything is empty, the rounds long-poll again (no busy loop)."""
    jobs, batch = 16, 4
    env = worker_env("pipelogiq", handlers=["e2e.echo", "e2e.reject", "e2e.boom", "e2e.validated"],
                     handler_module=HANDLERS_PATH,
                     settings={"batch_size": batch, "max_in_flight": jobs, "liveness": "while-work"})
    env.seed("e2e.echo", [{"n": i} for i in range(jobs)])

    # The long polls are held on the server's real time, so the tick keeps the real clock;
    # its window only bounds it (a while-work tick ends 10 s after the last work): the 16
    # jobs and the long polls after them fit however slowly a loaded machine pulls.
    report = _tick(env, 30.0)

    assert report.pulled == report.dispatched == jobs and not report.errors, report
    pulls = env.admin._call("GET", "pipelogiq")["pulls"]
    busy = {p["queue"] for p in pulls if p["status"] == 200}
    assert len(busy) == 1 and sum(p["status"] == 200 for p in pulls) == jobs, pulls
    last = max(i for i, p in enumerate(pulls) if p["status"] == 200)
    before, after = pulls[:last], pulls[last + 1:]
    # Long polls before the last job was taken: at most the first round's, before any work.
    long_polls = [p for p in before if p["waitSeconds"] > 0]
    assert len(long_polls) <= 3, before
    # Every round took a batch: each busy-queue request other than the first began with a
    # peek (waitSeconds 0) or found work, so the jobs came in about jobs/batch requests.
    empty_peeks = [p for p in before if p["status"] == 204 and p["waitSeconds"] == 0 and p["queue"] not in busy]
    assert len(empty_peeks) >= 3 * (jobs // batch - 1), before
    # Once all queues came back empty, at most one round of peeks, then long polls only.
    zero_after = [p for p in after if p["waitSeconds"] == 0]
    assert len(zero_after) <= 4, after
    assert any(p["waitSeconds"] >= 1 for p in after), after
    assert after and all(p["status"] == 204 for p in after), after
    env.stack.wait_idle()
    wait_for(lambda: all(done("pipelogiq", job) for job in env.admin.jobs()), what="all jobs done")
    assert set(recorder.counts().values()) == {1} and len(recorder.counts()) == jobs


# -- liveness modes -----------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_while_work_tick_without_work_polls_once(worker_env: Any, protocol: str) -> None:
    env = worker_env(protocol, handlers=["e2e.echo"], handler_module=HANDLERS_PATH,
                     settings={"liveness": "while-work"})

    report = _tick(env, 20.0)

    assert (report.pulls, report.heartbeats, report.pulled) == (1, 1, 0), report
    assert _pull_calls(env) == 1
    if protocol == "pipelogiq":  # the one heartbeat, then the one (long) poll ends the tick
        labels = [r["label"] for r in env.admin._call("GET", "pipelogiq")["requests"]]
        assert labels[-2:] == ["heartbeat", "pull"], labels


def test_continuous_liveness_heartbeats_until_the_gap_is_safe_then_closes_with_one(worker_env: Any) -> None:
    # Heartbeats every second, offline after 3 s of silence, a tick every 2 s: the idle window
    # is 2 - 3 + 4 s margin = 3 s, of a 20 s poll window.
    env = worker_env("pipelogiq", handlers=["e2e.echo"], handler_module=HANDLERS_PATH,
                     sandbox={"heartbeat_interval": 1, "offline_after": 3},
                     settings={"liveness": "continuous", "schedule_seconds": 2})

    report = _tick(env, 20.0)

    overview = env.admin._call("GET", "pipelogiq")
    labels = [r["label"] for r in overview["requests"]]
    beats = labels.count("heartbeat")
    assert beats == report.heartbeats and report.pulled == 0 and not report.errors, report
    assert labels[-1] == "heartbeat", labels           # the window ends with a heartbeat
    assert 3 <= beats < 10, labels                      # kept up for the idle window, not the 20 s
    assert not overview["workers"][0]["offline"]


def test_continuous_liveness_without_a_heartbeat_polls_once(worker_env: Any) -> None:
    env = worker_env("claimqueue", handlers=["e2e.echo"], handler_module=HANDLERS_PATH,
                     settings={"liveness": "continuous"})

    report = _tick(env, 20.0)

    assert (report.pulls, report.pulled) == (1, 0) and _pull_calls(env) == 1, report


# -- pipelined dispatch and parallel claims ----------------------------------------------------------
def test_parallel_claims_take_a_backlog_within_capacity_each_item_once(worker_env: Any, recorder: Any) -> None:
    limit, count = 6, 18
    env = worker_env("claimqueue", handlers=["e2e.slow"], handler_module=HANDLERS_PATH,
                     settings={"max_in_flight": limit, "batch_size": 6})
    env.seed("e2e.slow", [{"sleep": 0.2, "n": i} for i in range(count)])

    reports = []
    for _ in range(4):
        reports.append(_tick(env, 3.0))
        env.stack.wait_idle()
        if all(done("claimqueue", job) for job in env.admin.jobs()):
            break

    jobs = env.admin.jobs()
    assert all(done("claimqueue", job) for job in jobs), reports
    assert sum(r.pulled for r in reports) == sum(r.dispatched for r in reports) == count, reports
    assert sum(r.full_waits for r in reports) >= 1, reports             # the limit was reached
    assert unsettled_peak("claimqueue", jobs) <= limit                   # and never passed
    assert all(job["attempts"] == 1 for job in jobs)                     # no item claimed twice
    assert recorder.counts() == Counter({str(job["id"]): 1 for job in jobs})
    items = ledger(env)
    assert len(items) == count and {item.status for item in items} == {LedgerStatus.ACKNOWLEDGED}
