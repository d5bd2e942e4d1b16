"""A pull answered ``429`` with a hostile ``Retry-After``: the tick waits at most what is left
of its window (never the server's 999999999 s, never an OverflowError for ``inf``, never a
retry at once for ``nan``), through moto running the real functions against the sandboxes.

The scheduler's ``sleep`` notes each wait the tick asks for (and really waits, so that
empty pulls are paced as in production): a test reads the waits chosen."""

from __future__ import annotations

import time
from email.utils import formatdate
from typing import Any

import pytest
from e2e_support import HANDLERS_PATH, PROTOCOLS

from serverless_worker.runtime.context import LocalContext
from serverless_worker.runtime.scheduler import Scheduler

pytestmark = pytest.mark.aws

_PULL_LABEL = {"pipelogiq": "pull", "priostack": "activate", "claimqueue": "claim"}
WINDOW = 3.0


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(("header", "longest"), [
    ("999999999", WINDOW),  # honoured only up to the window's end
    ("86400", WINDOW),      # a day
    (formatdate(time.time() + 365 * 86400, usegmt=True), WINDOW),  # an HTTP date a year ahead
    ("inf", 1.0),           # not a number: the tick's own one-second back-off
    ("nan", 1.0),
])
def test_a_rate_limited_pull_waits_no_longer_than_the_window(
        worker_env: Any, protocol: str, header: str, longest: float) -> None:
    # given a server answering the first pull 429 with a hostile Retry-After
    env = worker_env(protocol, handlers=["e2e.echo"], handler_module=HANDLERS_PATH)
    label = _PULL_LABEL[protocol]
    env.admin.faults([{"kind": "rate_limit", "endpoint": label, "retry_after": header, "count": 1}])
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        time.sleep(seconds)

    scheduler = Scheduler(env.stack.services(), sleep=sleep)

    # when a tick runs (its first pull is the refused one)
    try:
        report = scheduler.tick(LocalContext("scheduler", timeout_seconds=120), window=WINDOW)
    finally:
        scheduler.close()

    # then it waited once for the 429, at least a little and never past the window, and ended
    assert env.admin.stats()["faults_fired"] == 1
    assert waits, report
    assert 0 < waits[0] <= longest, waits
    assert all(0 <= wait <= WINDOW for wait in waits), waits
