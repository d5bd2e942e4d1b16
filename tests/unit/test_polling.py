"""The scheduler's idle arithmetic (runtime/polling.py): the back-off after empty pulls, when
an empty long poll counts as not held, the per-key back-off of refusals, and the window
each liveness mode keeps when no pull returns work."""

from __future__ import annotations

import pytest

from serverless_worker.model import Delivery
from serverless_worker.runtime.polling import (
    LIVENESS_MARGIN_SECONDS,
    LIVENESS_MODES,
    EmptyPollBackoff,
    KeyedBackoff,
    answered_early,
    backoff_step,
    idle_polls,
    idle_window,
)
from serverless_worker.runtime.refusals import JOB_REFUSAL_MAX_SECONDS, JobRefusals


def test_backoff_doubles_from_the_first_wait_up_to_the_cap_and_resets_on_work() -> None:
    top = EmptyPollBackoff(0.2, 5.0, rng=lambda: 1.0)   # jitter at its top: the bare steps
    assert [top.next_wait() for _ in range(7)] == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0])
    top.reset()
    assert top.next_wait() == pytest.approx(0.2)        # work came: start short again


def test_backoff_jitter_stays_in_the_upper_half_of_each_step() -> None:
    low = EmptyPollBackoff(0.2, 2.0, rng=lambda: 0.0)
    assert [low.next_wait() for _ in range(6)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])


def test_backoff_needs_a_positive_first_wait() -> None:
    with pytest.raises(ValueError, match="positive"):
        EmptyPollBackoff(0.0, 5.0)


def test_idle_window_per_liveness_mode() -> None:
    common = {"window": 50.0, "schedule_seconds": 60, "heartbeat_interval": 15.0, "offline_after": 45.0}
    assert set(LIVENESS_MODES) == {"full-window", "continuous", "while-work"}
    assert idle_window("full-window", **common) == 50.0
    assert idle_window("while-work", **common) == 0.0
    # The closing heartbeat must come late enough that the silence until the next tick's
    # first one stays under 45 s: 60 - 45 plus the margin for a late start.
    assert idle_window("continuous", **common) == 60 - 45 + LIVENESS_MARGIN_SECONDS
    # No heartbeat to keep (Priostack, claim queue): one round of pulls, as while-work.
    assert idle_window("continuous", **{**common, "heartbeat_interval": None, "offline_after": None}) == 0.0
    # Never past the poll window; nothing to wait for when the threshold outlasts the period.
    assert idle_window("continuous", **{**common, "window": 12.0}) == 12.0
    assert idle_window("continuous", **{**common, "offline_after": 120.0}) == 0.0
    with pytest.raises(ValueError, match="liveness"):
        idle_window("sometimes", **common)


def test_idle_polls_counts_one_call_per_long_poll_or_per_backoff_wait() -> None:
    assert idle_polls(0.0, first=0.2, cap=5.0) == 1.0                          # one round
    assert idle_polls(20.0, first=0.2, cap=5.0, long_poll_seconds=20.0) == 1.0
    assert idle_polls(50.0, first=0.2, cap=5.0, long_poll_seconds=15.0) == 4.0
    # Waits at their mean (3/4 of each step): 0.15, 0.3, 0.6, 1.2, 2.4, then 3.75 s each.
    assert idle_polls(10.0, first=0.2, cap=5.0) == 7.0
    assert idle_polls(50.0, first=0.2, cap=2.0) > idle_polls(50.0, first=0.2, cap=5.0)


def test_backoff_step_doubles_from_the_first_failure_up_to_the_cap() -> None:
    assert [backoff_step(0.5, 10.0, n) for n in range(7)] == [0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 10.0]
    assert backoff_step(0.5, 10.0, 10_000) == 10.0  # no overflow however long it goes on


def test_an_empty_long_poll_is_early_when_it_took_under_half_the_wait_asked() -> None:
    assert answered_early(20.0, 0.005)        # asked 20 s, a 204 in 5 ms: no long poll there
    assert answered_early(5.0, 2.4)
    assert not answered_early(5.0, 2.5)       # held for half the wait or more: a long poll
    assert not answered_early(20.0, 20.3)     # held to its deadline
    assert not answered_early(0.0, 0.001)     # no wait asked (a peek): nothing was promised


def test_keyed_backoff_grows_per_key_resets_on_clear_and_forgets_with_time() -> None:
    # given a clock the test moves and jitter at its top (the bare steps)
    now = [100.0]
    backoff = KeyedBackoff(0.5, 4.0, forget_after=60.0, rng=lambda: 1.0, clock=lambda: now[0])

    # when one key is refused over and over, another once
    assert [backoff.note("job-1") for _ in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert backoff.note("job-2") == 0.5

    # then each key waits its own step, counted from its last refusal
    assert backoff.pause("job-1") == 4.0 and backoff.pause("job-2") == 0.5
    now[0] += 1.0
    assert backoff.pause("job-1") == 3.0 and backoff.pause("job-2") == 0.0
    assert backoff.pause("never-refused") == 0.0
    # a key that went through starts again from the first step
    backoff.clear("job-1")
    assert backoff.pause("job-1") == 0.0 and backoff.note("job-1") == 0.5
    # and a key refused long ago is forgotten: its next refusal is a first one again
    now[0] += 61.0
    assert backoff.refusals("job-2") == 1 and backoff.pause("job-2") == 0.0
    assert backoff.note("job-2") == 0.5


def test_keyed_backoff_jitter_is_the_upper_half_and_memory_is_bounded() -> None:
    low = KeyedBackoff(0.5, 4.0, rng=lambda: 0.0, clock=lambda: 0.0, max_keys=3)
    assert [low.note("a") for _ in range(3)] == [0.25, 0.5, 1.0]
    for key in ("b", "c", "d"):
        low.note(key)
    assert low.refusals("a") == 0 and low.refusals("d") == 1  # the oldest key went first
    with pytest.raises(ValueError, match="positive"):
        KeyedBackoff(0.0, 4.0)


def _delivery(lease_expires_at: float | None = None) -> Delivery:
    return Delivery(protocol="pipelogiq", handler="echo", job_id="1001", ledger_id="1001:e1",
                    lease_expires_at=lease_expires_at)


def test_a_refused_job_waits_its_step_bounded_by_its_lease_and_the_time_left() -> None:
    # given a job whose lease was refused three times in a row (jitter at its top)
    now = [0.0]
    refusals = JobRefusals(first=0.5, rng=lambda: 1.0, clock=lambda: now[0])
    for _ in range(3):
        refusals.refused(_delivery(), "lease refused: lease_held")

    # then its next delivery waits the third step, 2 s
    assert refusals.pause(_delivery(), remaining=600.0, now=0.0) == 2.0
    # never more than half the time to the delivery's own lease end, nor the time left
    assert refusals.pause(_delivery(lease_expires_at=3.0), remaining=600.0, now=0.0) == 1.5
    assert refusals.pause(_delivery(), remaining=0.4, now=0.0) == 0.4
    assert refusals.pause(_delivery(), remaining=-5.0, now=0.0) == 0.0
    # and however long it goes on, a wait is bounded
    for _ in range(50):
        refusals.refused(_delivery(), "lease not acquired")
    assert refusals.pause(_delivery(), remaining=600.0, now=0.0) == JOB_REFUSAL_MAX_SECONDS
    # once its handler runs, the job is no longer paced
    refusals.went_through(_delivery())
    assert refusals.pause(_delivery(), remaining=600.0, now=0.0) == 0.0
