"""A report answered ``429`` with a hostile ``Retry-After`` by a real sandbox on loopback:
the retries wait at most what is left of the retry budget, whatever the header says, and
a header that is not a usable number is treated as absent (docs/protocols.md). The waits
are planned on a fake clock and counted; the attempts are the sandbox's call counts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from email.utils import formatdate

import pytest

from serverless_worker.errors import RateLimitedError
from serverless_worker.protocols._http import HttpResponse, HttpTransport, RetryPolicy, retry_call
from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin
from serverless_worker.testing import FakeClock

# Each protocol's report: the sandbox's fault label and a path it serves under that label
# (the fault answers before the endpoint reads anything).
REPORTS = {
    "pipelogiq": ("result", "/stages/1/result"),
    "priostack": ("complete", "/api/v1/jobs/1/complete"),
    "claimqueue": ("result", "/jobs/items/1/result"),
}
POLICY = RetryPolicy(attempts=6, timeout=30.0, wait_initial=0.001, wait_max=0.001, wait_jitter=0.0)


@pytest.fixture
def real_backoff() -> Iterator[None]:
    """stamina as in production; the planned waits go to a fake clock, so nothing sleeps."""
    import stamina

    stamina.set_testing(False)
    yield
    stamina.set_testing(True, attempts=6)


def _report_until_given_up(server: SandboxServer, path: str, label: str) -> tuple[list[float], RateLimitedError]:
    """Send the report through retry_call until it gives up; the waits it planned, and its error."""
    clock, waits = FakeClock(), []
    transport = HttpTransport(server.url)

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        clock.advance(seconds)

    def call(number: int) -> HttpResponse:
        response = transport.request("POST", path, endpoint=label, json_body={"attempt": number})
        if response.status == 429:  # as each client maps it (its raise_for_answer)
            raise RateLimitedError("rate limited", endpoint=label, retry_after=response.retry_after)
        return response

    try:
        with pytest.raises(RateLimitedError) as caught:
            retry_call(call, POLICY, clock=clock.monotonic, sleep=sleep)
    finally:
        transport.close()
    return waits, caught.value


@pytest.mark.usefixtures("real_backoff")
@pytest.mark.parametrize("protocol", REPORTS)
@pytest.mark.parametrize("header", ["999999999", formatdate(4_102_444_800, usegmt=True)])  # 2100
def test_a_huge_retry_after_is_not_waited_at_all(
        protocol: str, header: str, serve: Callable[..., SandboxServer],
        admin_for: Callable[[SandboxServer], SandboxAdmin]) -> None:
    # given a sandbox answering every report 429 with a Retry-After decades away
    server = serve(protocol)
    admin = admin_for(server)
    label, path = REPORTS[protocol]
    admin.faults([{"kind": "rate_limit", "endpoint": label, "retry_after": header}])

    # when the report is sent under the retry policy
    waits, error = _report_until_given_up(server, path, label)

    # then no wait at all (waiting out the 30 s budget and asking again would only be refused
    # again): one call, and the error says why for the one log line of the give-up
    assert error.retry_after is not None and error.retry_after > 1e6
    assert waits == []
    assert admin.stats()["calls"][label] == 1
    assert error.not_waited is not None and "before the retry budget (30 s)" in error.not_waited


@pytest.mark.usefixtures("real_backoff")
@pytest.mark.parametrize("protocol", REPORTS)
@pytest.mark.parametrize("header", ["inf", "nan", "-5", "soon"])
def test_an_unusable_retry_after_is_ignored_not_obeyed(
        protocol: str, header: str, serve: Callable[..., SandboxServer],
        admin_for: Callable[[SandboxServer], SandboxAdmin]) -> None:
    # given a sandbox answering every report 429 with a Retry-After that is not a usable number
    server = serve(protocol)
    admin = admin_for(server)
    label, path = REPORTS[protocol]
    admin.faults([{"kind": "rate_limit", "endpoint": label, "retry_after": header}])

    # when the report is sent under the retry policy
    waits, error = _report_until_given_up(server, path, label)

    # then no OverflowError and no wait the server chose: the policy's own backoff, its six attempts
    assert error.retry_after is None
    assert waits == []
    assert admin.stats()["calls"][label] == POLICY.attempts
