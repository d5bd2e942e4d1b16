"""``runtime/settle.retry_delay`` as a table: the back-off after each failed settling call
doubles from the base and stops at the cap, so an item is final within a bounded time."""

from __future__ import annotations

import pytest

from serverless_worker.runtime.settle import SETTLE_RETRY_BASE_SECONDS, SETTLE_RETRY_MAX_SECONDS, retry_delay


@pytest.mark.parametrize(("failures", "expected"), [
    pytest.param(0, SETTLE_RETRY_BASE_SECONDS, id="none-yet-is-the-base"),
    pytest.param(1, SETTLE_RETRY_BASE_SECONDS, id="the-first-failure-waits-the-base"),
    pytest.param(2, 2 * SETTLE_RETRY_BASE_SECONDS, id="the-second-doubles"),
    pytest.param(3, 4 * SETTLE_RETRY_BASE_SECONDS, id="the-third-doubles-again"),
    pytest.param(6, 32 * SETTLE_RETRY_BASE_SECONDS, id="still-under-the-cap"),
    pytest.param(7, SETTLE_RETRY_MAX_SECONDS, id="the-cap"),
    pytest.param(50, SETTLE_RETRY_MAX_SECONDS, id="far-past-the-cap"),
    pytest.param(-3, SETTLE_RETRY_BASE_SECONDS, id="a-negative-count-is-the-base"),
])
def test_retry_delay(failures: int, expected: float) -> None:
    assert retry_delay(failures) == expected


def test_the_constants_make_the_table_above_meaningful() -> None:
    # 32 x base stays under the cap and 64 x base passes it: the "cap" rows test the cap.
    assert 32 * SETTLE_RETRY_BASE_SECONDS < SETTLE_RETRY_MAX_SECONDS < 64 * SETTLE_RETRY_BASE_SECONDS
