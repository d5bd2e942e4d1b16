"""A lease granted already over gives no time to run: ``budget.lapsed_at_grant`` says so,
and only then (the executor settles such a delivery as a lost lease, never runs it)."""

from __future__ import annotations

import pytest

from serverless_worker.model import Lease
from serverless_worker.runtime.budget import MIN_RUN_SECONDS, lapsed_at_grant

NOW = 1_000_000.0


@pytest.mark.parametrize(("expires_in", "renewable", "why"), [
    (-5.0, True, "already expired (5.0s ago)"),
    (0.0, False, "already expired"),
    (0.4, True, "with 0.4s left, under the 1s a run needs"),
])
def test_a_lease_over_or_too_short_at_grant_is_named(expires_in: float, renewable: bool, why: str) -> None:
    reason = lapsed_at_grant(Lease(expires_at=NOW + expires_in, renewable=renewable), NOW)
    assert reason is not None and why in reason


@pytest.mark.parametrize("lease", [Lease(expires_at=None), Lease(expires_at=NOW + MIN_RUN_SECONDS),
                                   Lease(expires_at=NOW + 60, renewable=True)])
def test_a_lease_with_time_left_or_no_expiry_runs(lease: Lease) -> None:
    assert lapsed_at_grant(lease, NOW) is None
