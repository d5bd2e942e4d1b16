"""A retried call is logged once, saying what is retried, where and why: not once per
attempt (stamina's own hook printed ``stamina.retry_scheduled`` every backoff step), and
never with a credential from the URL."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from serverless_worker.errors import BadRequestError, ServerUnavailableError
from serverless_worker.protocols._http import RetryPolicy, display_url, retry_call


def test_a_call_retried_several_times_logs_one_line(caplog: pytest.LogCaptureFixture) -> None:
    # given a call that fails three times with a transient error, then succeeds
    attempts: list[int] = []

    def call(number: int) -> str:
        attempts.append(number)
        if number <= 3:
            raise ServerUnavailableError("transport failure (ConnectionError)", endpoint="result")
        return "ok"

    # when it runs under the retry policy
    with caplog.at_level(logging.DEBUG):
        assert retry_call(call, RetryPolicy(attempts=6), where="https://jobs.example.com") == "ok"

    # then it took four attempts and one line says what, where and why
    assert attempts == [1, 2, 3, 4]
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert lines == ["retrying result at https://jobs.example.com (up to 6 attempts within 30 s): "
                     "result: transport failure (ConnectionError)"]


def test_an_error_that_is_not_retried_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    def call(number: int) -> str:
        raise BadRequestError("bad body", endpoint="result", status=400)

    with caplog.at_level(logging.DEBUG), pytest.raises(BadRequestError):
        retry_call(call, RetryPolicy(attempts=6))

    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize(("url", "shown"), [
    ("https://user:pa55@jobs.example.com:8443/api/?api_key=s3cret", "https://jobs.example.com:8443/api"),
    ("http://127.0.0.1:8081", "http://127.0.0.1:8081"),
    ("http://[::1]:9/x", "http://[::1]:9/x"),
])
def test_display_url_drops_user_info_and_query(url: str, shown: str) -> None:
    assert display_url(url) == shown


def test_a_call_that_succeeds_at_once_never_enters_stamina(monkeypatch: pytest.MonkeyPatch) -> None:
    import stamina

    def refuse(**_: object) -> None:
        raise AssertionError("stamina entered for a call that needed no retry")

    monkeypatch.setattr(stamina, "retry_context", refuse)
    assert retry_call(lambda number: number, RetryPolicy(attempts=6)) == 1


@pytest.fixture
def real_backoff() -> Iterator[None]:
    """stamina as in production (the suite's testing mode fixes every policy at 6 attempts)."""
    import stamina

    stamina.set_testing(False)
    yield
    stamina.set_testing(True, attempts=6)


@pytest.mark.usefixtures("real_backoff")
def test_a_call_that_keeps_failing_gets_exactly_the_policy_s_attempts() -> None:
    attempts: list[int] = []

    def call(number: int) -> str:
        attempts.append(number)
        raise ServerUnavailableError(f"down {number}", endpoint="result")

    with pytest.raises(ServerUnavailableError, match="down 3"):
        retry_call(call, RetryPolicy(attempts=3, wait_initial=0.001, wait_max=0.001, wait_jitter=0.0))
    assert attempts == [1, 2, 3]


@pytest.mark.usefixtures("real_backoff")
def test_a_first_attempt_that_used_the_whole_time_budget_is_not_retried() -> None:
    import time

    attempts: list[int] = []

    def call(number: int) -> str:
        attempts.append(number)
        time.sleep(0.05)  # longer than the policy's whole budget
        raise ServerUnavailableError("slow and down", endpoint="result")

    with pytest.raises(ServerUnavailableError):
        retry_call(call, RetryPolicy(attempts=6, timeout=0.01, wait_initial=0.001, wait_jitter=0.0))
    assert attempts == [1]
