"""never_fits: which declared timeouts no delivery can ever hold (a fixed limit), and the
local run's verdict on a run that took jobs and ran none."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from serverless_worker.local.summary import RunSummary
from serverless_worker.local.worker import EXIT_INCOMPLETE, LocalRunner
from serverless_worker.protocols.base import Delivery, Lease
from serverless_worker.registry import HandlerMode, HandlerSpec
from serverless_worker.runtime.fit import never_fits

NOW = 1_000_000.0


def _spec(timeout: float | None, *, mode: HandlerMode = "short") -> HandlerSpec:
    return HandlerSpec(name="resize", fn=lambda job: None, timeout=timeout, mode=mode)


def _delivery(**fields: Any) -> Delivery:
    return Delivery(protocol="claimqueue", handler="resize", job_id="j1", ledger_id="j1:1", pulled_at=NOW, **fields)


def test_a_timeout_longer_than_an_unrenewable_lease_never_fits() -> None:
    lease = Lease(expires_at=NOW + 20, renewable=False)
    why = never_fits(_spec(30), _delivery(), lease, lambda_limit=900, report_margin=10)
    assert why is not None and "'resize'" in why and "timeout=30s" in why and "20s" in why, why
    # 17 s fits the 18 usable seconds of the same lease; a renewable lease bounds nothing.
    assert never_fits(_spec(17), _delivery(), lease, lambda_limit=900, report_margin=10) is None
    assert never_fits(_spec(30), _delivery(), Lease(expires_at=NOW + 20, renewable=True), lambda_limit=900,
                      report_margin=10) is None


def test_a_timeout_past_the_lambda_timeout_never_fits_on_the_short_path_only() -> None:
    why = never_fits(_spec(895), _delivery(), None, lambda_limit=900, report_margin=10)
    assert why is not None and "Lambda timeout of 900s" in why and "890s" in why, why
    assert never_fits(_spec(895, mode="slices"), _delivery(), None, lambda_limit=900, report_margin=10) is None
    assert never_fits(_spec(None), _delivery(), None, lambda_limit=5, report_margin=10) is None


def test_a_timeout_longer_than_the_jobs_own_never_fits() -> None:
    why = never_fits(_spec(30), _delivery(timeout_seconds=10), None, lambda_limit=900, report_margin=10)
    assert why is not None and "job's own timeout is 10s" in why, why


@pytest.mark.parametrize(("taken", "runs", "expected"), [(3, 0, EXIT_INCOMPLETE), (3, 3, 0), (0, 0, 0)])
def test_a_local_run_that_took_jobs_and_ran_none_does_not_exit_0(taken: int, runs: int, expected: int) -> None:
    out = io.StringIO()
    runner = LocalRunner(settings=None, own_sandbox=False, console=Console(file=out), live=False)
    summary = RunSummary(protocol="claimqueue", seconds=1.0, taken=taken, handler_runs=runs, handed_back=taken - runs)
    assert runner._exit_status(summary, forced=False) == expected
    assert ("ran none of them" in out.getvalue()) == (expected != 0)
