"""``Settler.before_final``: the hook an executor that keeps pulling uses to take its next
delivery runs after the protocol's ack and before the final ledger write, and a hook that
raises never keeps that write from happening (``runtime/settle.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from serverless_worker.model import Delivery, Outcome, OutcomeKind, ReportReceipt
from serverless_worker.runtime.events import EventBuffer
from serverless_worker.runtime.settle import Settler, settle


class _Protocol:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def report(self, delivery: Delivery, outcome: Outcome) -> ReportReceipt:
        self.calls.append("report")
        return ReportReceipt(accepted=True, status="ok")

    def acknowledge(self, delivery: Delivery) -> None:
        self.calls.append("ack")


class _Client:
    def __init__(self, calls: list[str]) -> None:
        self.protocol: Any = _Protocol(calls)

    def call(self, fn: Callable[[Any], Any]) -> Any:
        return fn(self.protocol)


class _Store:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def mark_acknowledged(self, key: str, receipt: ReportReceipt | None = None, *, wait: bool = True) -> bool:
        self.calls.append("final")
        return True


class _Counters:
    def add(self, **deltas: int) -> None:
        pass


def _settler(calls: list[str], hook: Callable[[], None] | None) -> Settler:
    return Settler(store=_Store(calls), client=_Client(calls), events=EventBuffer(),  # type: ignore[arg-type]
                   counters=_Counters, clock=lambda: 0.0, before_final=hook)


DELIVERY = Delivery(protocol="claimqueue", handler="h", job_id="j-1", ledger_id="j-1", input={})
SUCCESS = Outcome(kind=OutcomeKind.SUCCESS, value={"ok": True})


def test_the_hook_runs_after_the_ack_and_before_the_final_write() -> None:
    calls: list[str] = []
    settlement = settle(_settler(calls, lambda: calls.append("hook")), "k", DELIVERY, SUCCESS)
    assert settlement.action == "reported"
    assert calls == ["report", "ack", "hook", "final"]


def test_a_raising_hook_is_logged_and_the_final_write_still_happens(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []

    def hook() -> None:
        calls.append("hook")
        raise RuntimeError("the next pull broke")

    settlement = settle(_settler(calls, hook), "k", DELIVERY, SUCCESS)
    assert settlement.action == "reported"
    assert calls == ["report", "ack", "hook", "final"]
    assert any("before-final hook failed" in record.getMessage() for record in caplog.records)


def test_without_a_hook_nothing_changes() -> None:
    calls: list[str] = []
    settle(_settler(calls, None), "k", DELIVERY, SUCCESS)
    assert calls == ["report", "ack", "final"]
