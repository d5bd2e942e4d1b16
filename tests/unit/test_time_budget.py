"""The time budget as a table: how long a handler may run (``runtime/budget.time_budget``),
whether the executor starts it at all (``runtime/budget.budget_fits``) and the cap the
handler runner applies (``handler_runner.handler_budget``). Pure functions, no clock."""

from __future__ import annotations

import math

import pytest

from serverless_worker.handler_runner import handler_budget
from serverless_worker.model import Lease
from serverless_worker.registry import HandlerSpec
from serverless_worker.runtime.budget import budget_fits, time_budget

NOW = 1_000_000.0


@pytest.mark.parametrize(("remaining", "margin", "handler_timeout", "job_timeout", "lease", "expected"), [
    pytest.param(900, 10, None, None, None, 890, id="lambda-time-less-the-report-margin"),
    pytest.param(900, 10, 60, None, None, 60, id="the-handler-timeout-is-tighter"),
    pytest.param(900, 10, 60, 30, None, 30, id="the-job-timeout-is-tighter-still"),
    pytest.param(900, 10, 0, -5, None, 890, id="zero-or-negative-timeouts-mean-none"),
    pytest.param(900, 10, 60, None, Lease(expires_at=NOW + 20, renewable=False), 18,
                 id="an-unrenewable-lease-less-its-margin"),
    pytest.param(900, 10, 60, None, Lease(expires_at=NOW + 20, renewable=True), 60,
                 id="a-renewable-lease-bounds-nothing"),
    pytest.param(900, 10, 60, None, Lease(expires_at=None, renewable=False), 60,
                 id="a-lease-without-expiry-bounds-nothing"),
    pytest.param(900, 10, None, None, Lease(expires_at=NOW - 5, renewable=False), 0,
                 id="a-lapsed-lease-leaves-nothing-never-negative"),
    pytest.param(5, 10, None, None, None, 0, id="less-lambda-time-than-the-margin-is-zero"),
])
def test_time_budget_is_the_tightest_limit(remaining: float, margin: float, handler_timeout: float | None,
                                           job_timeout: float | None, lease: Lease | None, expected: float) -> None:
    budget = time_budget(remaining_lambda=remaining, report_margin=margin, handler_timeout=handler_timeout,
                         job_timeout=job_timeout, lease=lease, now=NOW)
    assert budget == pytest.approx(expected)


@pytest.mark.parametrize(("budget", "handler_timeout", "fits"), [
    pytest.param(30, None, True, id="no-declared-timeout-any-second-fits"),
    pytest.param(1.0, None, True, id="exactly-one-second-fits"),
    pytest.param(0.99, None, False, id="under-a-second-never-starts"),
    pytest.param(0, None, False, id="nothing-left"),
    pytest.param(30, 30, True, id="the-declared-timeout-exactly"),
    pytest.param(29.9, 30, False, id="shorter-than-the-declared-timeout-is-handed-back"),
    pytest.param(0.5, 0.2, False, id="a-tiny-declared-timeout-still-needs-a-second"),
])
def test_budget_fits(budget: float, handler_timeout: float | None, fits: bool) -> None:
    assert budget_fits(budget, handler_timeout) is fits


@pytest.mark.parametrize(("budget", "handler_timeout", "expected"), [
    pytest.param(30.0, None, 30.0, id="no-declared-timeout"),
    pytest.param(30.0, 5.0, 5.0, id="the-declared-timeout-caps-it"),
    pytest.param(3.0, 5.0, 3.0, id="the-budget-is-tighter"),
    pytest.param(0.0, 5.0, 0.0, id="nothing-left-stays-nothing"),
])
def test_handler_budget_caps_by_the_declared_timeout(budget: float, handler_timeout: float | None,
                                                     expected: float) -> None:
    assert handler_budget(_spec(handler_timeout), budget) == expected


def test_a_nan_budget_is_not_above_zero_so_the_handler_is_not_started() -> None:
    assert not handler_budget(_spec(None), math.nan) > 0


def _spec(timeout: float | None) -> HandlerSpec:
    return HandlerSpec(name="resize", fn=lambda job: None, timeout=timeout)


@pytest.mark.parametrize(("remaining", "next_budget", "margin", "fits"), [
    pytest.param(42, 30, 10, True, id="budget-margin-and-pull-allowance-exactly"),
    pytest.param(41.9, 30, 10, False, id="short-of-the-pull-allowance"),
    pytest.param(900, 30, 10, True, id="plenty-left"),
    pytest.param(12, 0, 10, True, id="a-zero-budget-still-needs-margin-and-allowance"),
    pytest.param(11.9, 0, 10, False, id="under-margin-and-allowance"),
])
def test_self_pull_fits_the_next_budget_the_margin_and_the_pull(remaining: float, next_budget: float,
                                                                margin: float, fits: bool) -> None:
    from serverless_worker.runtime.budget import PULL_ALLOWANCE_SECONDS, self_pull_fits

    assert PULL_ALLOWANCE_SECONDS == 2.0
    assert self_pull_fits(remaining_lambda=remaining, next_budget=next_budget, report_margin=margin) is fits
