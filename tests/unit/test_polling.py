"""The scheduler's idle arithmetic (runtime/polling.py): the back-off after empty pulls and
the window each liveness mode keeps when no pull returns work."""

from __future__ import annotations

import pytest

from serverless_worker.runtime.polling import (
    LIVENESS_MARGIN_SECONDS,
    LIVENESS_MODES,
    EmptyPollBackoff,
    idle_polls,
    idle_window,
)


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
