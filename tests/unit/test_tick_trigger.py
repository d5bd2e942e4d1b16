"""The scheduler's first log line says what started the tick: the deployed tier proves
from it that ticks came from the stack's EventBridge schedule."""

from __future__ import annotations

import json
from pathlib import Path

from serverless_worker.runtime.entry import tick_trigger

EVENTS = Path(__file__).resolve().parents[2] / "events"


def test_a_scheduled_event_is_a_schedule_tick_with_its_rule() -> None:
    event = json.loads((EVENTS / "scheduler.json").read_text())
    assert tick_trigger(event) == {"trigger": "schedule", "rule": "local-SchedulerFunctionTick"}


def test_anything_else_is_direct_and_nothing_of_the_event_is_kept() -> None:
    assert tick_trigger({"poll_window_seconds": 2}) == {"trigger": "direct"}
    assert tick_trigger(None) == {"trigger": "direct"}
    assert tick_trigger({"source": "aws.events", "detail-type": "Object Created"}) == {"trigger": "direct"}
    assert tick_trigger({"source": "aws.events", "detail-type": "Scheduled Event", "resources": "x"}) == {
        "trigger": "schedule", "rule": ""}
