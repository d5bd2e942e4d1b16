"""never_fits: which declared timeouts no delivery can ever hold (a fixed limit), and the
local run's verdict on a run that took jobs and ran none."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from serverless_worker.local.summary import RunSummary
from serverless_worker.local.worker import EXIT_INCOMPLETE, LocalRunner
from serverless_worker.model import Delivery, Lease
from serverless_worker.registry import HandlerMode, HandlerSpec
from serverless_worker.runtime.budget import never_fits

NOW = 1_000_000.0


def _spec(timeout: float | None, *, mode: HandlerMode = "short") -> HandlerSpec:
    return HandlerSpec(name="resize", fn=lambda job: None, timeout=timeout, mode=mode)


def _delivery(**fields: Any) -> Delivery:
    return Delivery(protocol="claimqueue", handler="resize", job_id="j1", ledger_id="j1:1", pulled_at=NOW, **fields)


UNRENEWABLE_20S = Lease(expires_at=NOW + 20, renewable=False)


@pytest.mark.parametrize(("spec", "delivery", "lease", "lambda_limit", "says"), [
    pytest.param(_spec(30), _delivery(), UNRENEWABLE_20S, 900, ("'resize'", "timeout=30s", "20s"),
                 id="longer-than-an-unrenewable-lease"),
    pytest.param(_spec(17), _delivery(), UNRENEWABLE_20S, 900, None,
                 id="fits-the-18-usable-seconds-of-that-lease"),
    pytest.param(_spec(19), _delivery(), UNRENEWABLE_20S, 900, ("at most 18s",),
                 id="past-the-usable-part-of-that-lease"),
    pytest.param(_spec(30), _delivery(), Lease(expires_at=NOW + 20, renewable=True), 900, None,
                 id="a-renewable-lease-bounds-nothing"),
    pytest.param(_spec(895), _delivery(), None, 900, ("Lambda timeout of 900s", "890s"),
                 id="past-the-lambda-timeout-on-the-short-path"),
    pytest.param(_spec(895, mode="slices"), _delivery(), None, 900, None,
                 id="long-running-is-not-bound-by-the-lambda-timeout"),
    pytest.param(_spec(890), _delivery(), None, 900, None, id="exactly-the-lambda-time-less-the-margin"),
    pytest.param(_spec(None), _delivery(), None, 5, None, id="no-declared-timeout-always-fits"),
    pytest.param(_spec(0), _delivery(), UNRENEWABLE_20S, 5, None, id="a-zero-timeout-means-none"),
    pytest.param(_spec(30), _delivery(timeout_seconds=10), None, 900, ("job's own timeout is 10s",),
                 id="longer-than-the-jobs-own-timeout"),
    pytest.param(_spec(30), _delivery(timeout_seconds=0), None, 900, None, id="a-zero-job-timeout-means-none"),
])
def test_never_fits(spec: HandlerSpec, delivery: Delivery, lease: Lease | None, lambda_limit: float,
                    says: tuple[str, ...] | None) -> None:
    why = never_fits(spec, delivery, lease, lambda_limit=lambda_limit, report_margin=10)
    if says is None:
        assert why is None, why
    else:
        assert why is not None and all(part in why for part in says), why


@pytest.mark.parametrize(("taken", "runs", "expected"), [(3, 0, EXIT_INCOMPLETE), (3, 3, 0), (0, 0, 0)])
def test_a_local_run_that_took_jobs_and_ran_none_does_not_exit_0(taken: int, runs: int, expected: int) -> None:
    out = io.StringIO()
    runner = LocalRunner(settings=None, own_sandbox=False, console=Console(file=out), live=False)
    summary = RunSummary(protocol="claimqueue", seconds=1.0, taken=taken, handler_runs=runs, handed_back=taken - runs)
    status, said = runner._verdict(summary, forced=False)
    assert status == expected
    assert ("ran none of them" in (said or "")) == (expected != 0)


def test_the_lease_rule_is_one_of_never_fits_and_alone_in_lease_never_fits() -> None:
    from serverless_worker.runtime.budget import lease_never_fits

    # the lease rule is the same text both ways, so the pipeline can tell it from the fixed limits
    why = never_fits(_spec(30), _delivery(), UNRENEWABLE_20S, lambda_limit=900, report_margin=10)
    assert why is not None and why == lease_never_fits(_spec(30), _delivery(), UNRENEWABLE_20S)
    assert lease_never_fits(_spec(895), _delivery(), None) is None  # the Lambda limit is not the lease's
    assert never_fits(_spec(895), _delivery(), None, lambda_limit=900, report_margin=10) is not None


def test_a_short_lease_stops_pulling_only_when_two_deliveries_in_a_row_meet_it() -> None:
    # one delivery's lease may be an older one a late duplicate carries: it alone is handed
    # back; the next one meeting it too confirms the queue's lease is too short
    from serverless_worker.runtime.fit import lease_bound_confirmed, lease_fitted

    lease_fitted("resize")
    assert lease_bound_confirmed("resize") is False
    lease_fitted("resize")  # a delivery that fitted in between: the strikes start over
    assert lease_bound_confirmed("resize") is False
    assert lease_bound_confirmed("resize") is True
    assert lease_bound_confirmed("other") is False  # counted per handler
    lease_fitted("resize")
    lease_fitted("other")
