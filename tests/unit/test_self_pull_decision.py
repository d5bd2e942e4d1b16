"""Whether an executor that has finished a delivery pulls one more (``runtime/self_pull.stop_reason``),
as a table: one row per rule, each the base case with one fact changed. Pure, no clock."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from serverless_worker.runtime.self_pull import STOP_REASONS, Facts, stop_reason

BASE = Facts(last_full=True, remaining=300.0, next_budget=30.0, report_margin=10.0, done=1, max_jobs=100,
             control={}, handler="h", in_flight=5, limit=5)


@pytest.mark.parametrize(("changes", "expected"), [
    pytest.param({}, None, id="full-pull-time-and-own-slot-to-hand-over"),
    pytest.param({"last_full": False}, "empty", id="the-last-pull-came-back-empty"),
    pytest.param({"remaining": 41.9}, "time", id="remaining-short-of-budget-margin-and-pull"),
    pytest.param({"remaining": 42.0}, None, id="remaining-exactly-budget-margin-and-pull"),
    pytest.param({"next_budget": None}, "no_timeout", id="a-handler-without-a-declared-timeout"),
    pytest.param({"done": 100}, "cap", id="the-per-invocation-cap"),
    pytest.param({"done": 99}, None, id="one-under-the-cap"),
    pytest.param({"control": {"draining": True}}, "draining", id="the-instance-is-draining"),
    pytest.param({"control": {"stopped": "lease refused: app"}}, "stopped", id="the-instance-is-stopped"),
    pytest.param({"control": {"unfit": {"h": "never fits"}}}, "unfit", id="this-handler-is-unfit"),
    pytest.param({"control": {"unfit": {"other": "never fits"}}}, None, id="another-handler-is-unfit"),
    pytest.param({"in_flight": 6}, "capacity", id="over-the-limit-even-with-our-own-slot"),
    pytest.param({"new_slot": True}, "capacity", id="a-pullers-first-pull-needs-a-free-slot"),
    pytest.param({"new_slot": True, "in_flight": 4}, None, id="a-pullers-first-pull-with-a-free-slot"),
    pytest.param({"refused": True}, "refused", id="the-last-delivery-was-refused-or-handed-back"),
    pytest.param({"session_ok": False}, "session", id="no-fresh-stored-session-or-it-was-replaced"),
    pytest.param({"pull_error": "rate_limited"}, "rate_limited", id="the-last-pull-was-rate-limited"),
    pytest.param({"pull_error": "pull_error"}, "pull_error", id="the-last-pull-failed"),
])
def test_stop_reason(changes: dict[str, Any], expected: str | None) -> None:
    assert stop_reason(replace(BASE, **changes)) == expected


def test_the_control_item_wins_over_every_other_reason() -> None:
    # A drain must be obeyed whatever else holds, so the reason logged says what the operator did.
    everything = replace(BASE, last_full=False, remaining=0.0, done=100, in_flight=99, refused=True,
                         session_ok=False, pull_error="pull_error", control={"draining": True})
    assert stop_reason(everything) == "draining"


def test_every_reason_is_named() -> None:
    assert set(STOP_REASONS) == {"empty", "time", "no_timeout", "cap", "draining", "stopped", "unfit", "capacity",
                                 "refused", "session", "rate_limited", "pull_error"}
