"""A server's Retry-After is read as the standard says (delta-seconds or an HTTP date) and
refused when it is not a usable number (docs/protocols.md); a wait it asks for
is cut to the time left: the retry budget, a caller's time limit, and nothing once the
waits are abandoned. Waits are planned on a fake clock: no test sleeps."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from email.utils import formatdate

import pytest

from serverless_worker.errors import RateLimitedError, ServerUnavailableError
from serverless_worker.protocols._http import HttpResponse, RetryPolicy, retry_call
from serverless_worker.testing import FakeClock
from serverless_worker.waits import (
    abandon_waits,
    allow_waits,
    parse_retry_after,
    pause,
    time_left,
    time_limit,
    waits_abandoned,
)

NOW = 1_700_000_000.0


# -- parsing ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("header", "seconds"), [
    ("120", 120.0),
    ("0", 0.0),
    (" 7 ", 7.0),
    ("0.5", 0.5),                      # a fraction: the sandboxes and some servers send one
    ("999999999", 999_999_999.0),      # huge but a number: kept, the clamp cuts it
    (formatdate(NOW + 90, usegmt=True), 90.0),             # an HTTP date: seconds until then
    (formatdate(NOW - 3600, usegmt=True), 0.0),            # a date already past: no wait
    ("Sun, 06 Nov 1994 08:49:37 GMT", 0.0),                # RFC 9110's example, long past
    ("Sun, 06 Nov 1994 08:49:37 -0000", 0.0),              # no zone: read as UTC
])
def test_delta_seconds_and_http_dates_are_read_as_seconds(header: str, seconds: float) -> None:
    assert parse_retry_after(header, now=NOW) == pytest.approx(seconds)


@pytest.mark.parametrize("header", [
    "inf", "Infinity", "-inf", "nan", "NaN",   # not finite: never "forever", never "at once"
    "-5", "-0.5",                              # negative
    "1e3", "0x10", "5s", "soon", "", "  ",     # neither delta-seconds nor a date
    "9" * 400,                                 # digits beyond a float: not a finite number
    "\u0661\u0662",                            # digits, but not ASCII ones
    "Mon, 99 Foo 2020 99:99:99 GMT",           # a date that is not one
])
def test_an_unusable_retry_after_is_treated_as_absent(header: str) -> None:
    assert parse_retry_after(header, now=NOW) is None


def test_a_response_s_retry_after_is_the_parsed_header() -> None:
    def response(value: str | None) -> HttpResponse:
        return HttpResponse(429, {} if value is None else {"Retry-After": value}, b"", "result")

    assert response("12").retry_after == 12.0
    assert response(formatdate(NOW - 60, usegmt=True)).retry_after == 0.0
    assert response("nan").retry_after is None
    assert response(None).retry_after is None


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, -1.0])
def test_a_rate_limited_error_refuses_a_wait_that_is_not_finite_and_positive(value: float) -> None:
    # Whatever a client passes, the error never carries a wait that would overflow a sleep or
    # turn into a retry at once.
    assert RateLimitedError("rate limited", endpoint="result", retry_after=value).retry_after is None
    assert RateLimitedError("rate limited", endpoint="result", retry_after=3.0).retry_after == 3.0


# -- limits ---------------------------------------------------------------------------------------

def test_nested_time_limits_leave_the_least_time() -> None:
    assert time_left() == math.inf
    with time_limit(lambda: 30.0):
        with time_limit(lambda: 4.0):
            assert time_left() == 4.0
        assert time_left() == 30.0
        with time_limit(lambda: math.nan):  # a limit that cannot be read leaves no time
            assert time_left() == 0.0
    assert time_left() == math.inf


def test_abandoned_waits_leave_no_time_and_a_pause_ends_at_once() -> None:
    abandon_waits()
    assert waits_abandoned() and time_left() == 0.0
    assert pause(3600.0) is False  # a test that hung here would fail on the suite's timeout
    allow_waits()
    assert not waits_abandoned() and time_left() == math.inf


def test_a_pause_with_no_time_left_ends_at_once() -> None:
    with time_limit(lambda: 0.0):
        assert pause(3600.0) is False


# -- retry_call ------------------------------------------------------------------------------------

@pytest.fixture
def real_backoff() -> Iterator[None]:
    """stamina as in production (the suite's testing mode skips every wait); the waits
    retry_call plans go to a fake clock's ``advance``, so nothing sleeps."""
    import stamina

    stamina.set_testing(False)
    yield
    stamina.set_testing(True, attempts=6)


POLICY = RetryPolicy(attempts=6, timeout=30.0, wait_initial=0.001, wait_max=0.001, wait_jitter=0.0)


class Planned:
    """A fake clock and a ``sleep`` that notes each wait and moves the clock: the waits
    retry_call plans, without sleeping."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.waits: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.clock.advance(seconds)


def _rate_limited(retry_after: float | None, attempts: list[int]) -> Callable[[int], str]:
    def call(number: int) -> str:
        attempts.append(number)
        raise RateLimitedError("rate limited", endpoint="result", retry_after=retry_after)

    return call


@pytest.mark.usefixtures("real_backoff")
def test_a_huge_retry_after_is_not_waited_and_says_which_limit() -> None:
    # given a server answering every report 429 Retry-After: 999999999
    planned, attempts = Planned(), list[int]()

    # when the report is retried under a 30 s budget
    with pytest.raises(RateLimitedError) as raised:
        retry_call(_rate_limited(999_999_999.0, attempts), POLICY, clock=planned.clock.monotonic, sleep=planned.sleep)

    # then it did not wait at all (the server said not before then: waiting the budget out
    # and asking again would only be refused), tried once, and the error says why
    assert planned.waits == []
    assert attempts == [1]
    assert raised.value.not_waited == ("the server asked to wait 999999999 s (Retry-After); 30.0 s were left "
                                       "before the retry budget (30 s), so it was not waited")


@pytest.mark.usefixtures("real_backoff")
def test_a_retry_after_beyond_the_time_limit_of_the_caller_is_not_waited() -> None:
    # given 4 s left of the invocation (a Lambda's remaining time)
    planned, attempts = Planned(), list[int]()
    end = planned.clock.monotonic() + 4.0

    with time_limit(lambda: end - planned.clock.monotonic(), what="the invocation's deadline"), \
            pytest.raises(RateLimitedError) as raised:
        retry_call(_rate_limited(60.0, attempts), POLICY, clock=planned.clock.monotonic, sleep=planned.sleep)

    assert planned.waits == []
    assert attempts == [1]
    assert raised.value.not_waited is not None and "4.0 s were left before the invocation's deadline" in \
        raised.value.not_waited


@pytest.mark.usefixtures("real_backoff")
def test_a_retry_after_that_stops_fitting_later_ends_the_retries_there() -> None:
    # given 5 s left, and a server asking for 2 s each time: two waits fit, the third does not
    planned, attempts = Planned(), list[int]()
    end = planned.clock.monotonic() + 5.0

    with time_limit(lambda: end - planned.clock.monotonic()), pytest.raises(RateLimitedError) as raised:
        retry_call(_rate_limited(2.0, attempts), POLICY, clock=planned.clock.monotonic, sleep=planned.sleep)

    assert planned.waits == [2.0, 2.0]
    assert attempts == [1, 2, 3]
    assert raised.value.not_waited is not None and "1.0 s were left" in raised.value.not_waited


@pytest.mark.usefixtures("real_backoff")
def test_a_retry_after_within_the_budget_is_honoured_and_not_waited_after_the_last_attempt() -> None:
    planned, attempts = Planned(), list[int]()
    policy = RetryPolicy(attempts=3, timeout=30.0)

    with pytest.raises(RateLimitedError):
        retry_call(_rate_limited(2.5, attempts), policy, clock=planned.clock.monotonic, sleep=planned.sleep)

    assert attempts == [1, 2, 3]
    assert planned.waits == [2.5, 2.5]  # none after the third: nothing would follow it


@pytest.mark.usefixtures("real_backoff")
@pytest.mark.parametrize("header", ["nan", "inf", "-5", "garbage"])
def test_an_unusable_retry_after_falls_back_to_the_policy_s_own_backoff(header: str) -> None:
    # given a 429 whose Retry-After is not a usable number
    planned, attempts = Planned(), list[int]()
    retry_after = HttpResponse(429, {"Retry-After": header}, b"", "result").retry_after

    with pytest.raises(RateLimitedError):
        retry_call(_rate_limited(retry_after, attempts), POLICY, clock=planned.clock.monotonic, sleep=planned.sleep)

    # then no server-directed wait (neither forever nor none): stamina's exponential backoff,
    # within the policy's attempts
    assert planned.waits == []
    assert attempts == [1, 2, 3, 4, 5, 6]


def test_abandoned_waits_end_the_retries_after_the_attempt_in_flight() -> None:
    # given a call that is abandoned while it is being retried (the local worker's drain
    # gave up); the suite's testing mode skips the backoff
    attempts: list[int] = []

    def call(number: int) -> str:
        attempts.append(number)
        if number == 2:
            abandon_waits()
        raise ServerUnavailableError("down", endpoint="result")

    with pytest.raises(ServerUnavailableError):
        retry_call(call, POLICY)

    # then no attempt follows the one during which it was abandoned
    assert attempts == [1, 2]


def test_no_retry_once_the_waits_are_abandoned() -> None:
    abandon_waits()
    attempts: list[int] = []
    with pytest.raises(RateLimitedError):
        retry_call(_rate_limited(1.0, attempts), POLICY)
    assert attempts == [1]


def test_a_lambda_invocation_limits_every_retry_wait_to_its_remaining_time() -> None:
    from serverless_worker.runtime import entry

    class Context:
        aws_request_id, function_name = "req-1", "executor"

        def get_remaining_time_in_millis(self) -> int:
            return 10_000

    seen: list[float] = []

    def handler(event: dict[str, object], context: object) -> dict[str, object]:
        seen.append(time_left())
        return {}

    invoke = entry._clear_errors(handler)

    invoke({}, Context())

    assert seen == [10.0 - entry.WAIT_MARGIN_SECONDS]
    assert time_left() == math.inf  # only within the invocation
