"""A pull answered ``429`` with a hostile ``Retry-After``: the tick waits at most what is left
of its window (never the server's 999999999 s, never an OverflowError for ``inf``, never a
retry at once for ``nan``), through moto running the real functions against the sandboxes.

The tick runs on a clock of its own (``tick_clock``) that only its waits move, noted and not
slept: what is left of its window when the 429 comes is the tick's time, never eaten by a
loaded machine's slow bootstrap or pull, and a test reads the waits chosen."""

from __future__ import annotations

import time
from email.utils import formatdate
from typing import Any

import pytest
from e2e_support import HANDLERS_PATH, PROTOCOLS, tick_with

from support.clock import TickClock

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
        worker_env: Any, tick_clock: TickClock, protocol: str, header: str, longest: float) -> None:
    # given a server answering the first pull 429 with a hostile Retry-After
    # Pipelogiq's empty long polls after the wait are held on the server's real time, which
    # the tick's clock does not see: 1 s polls keep them short.
    settings = {"wait_seconds_long_poll": 1} if protocol == "pipelogiq" else None
    env = worker_env(protocol, handlers=["e2e.echo"], handler_module=HANDLERS_PATH, settings=settings)
    label = _PULL_LABEL[protocol]
    env.admin.faults([{"kind": "rate_limit", "endpoint": label, "retry_after": header, "count": 1}])
    waits = tick_clock.waits

    # when a tick runs (its first pull is the refused one)
    report = tick_with(env, WINDOW, sleep=tick_clock.sleep, clock=tick_clock)

    # then it waited once for the 429, at least a little and never past the window, and ended
    assert env.admin.stats()["faults_fired"] == 1
    assert waits, report
    assert 0 < waits[0] <= longest, waits
    assert all(0 <= wait <= WINDOW for wait in waits), waits
