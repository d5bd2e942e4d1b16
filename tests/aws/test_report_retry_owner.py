"""One owner per retry (docs/retries.md), end to end: a report that meets a sandbox
answering 503 is sent exactly the client policy's number of times, whether the executor or
the state machine sends it; not again by Lambda's asynchronous retry, the state machine's
``Retry`` or its give-back. The reaper, at the retry time noted on the ledger item, sends it
once per reap (its client tries once: the noted retry time is its only back-off), and once
more when the server is back. Attempts are the sandbox's per-endpoint call counts."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import handlers_long
import pytest
from e2e_support import HANDLERS_PATH, backdate, done, in_flight, ledger, run_until

from serverless_worker.model import LedgerStatus
from serverless_worker.protocols.http_client import DEFAULT_RETRY
from serverless_worker.registry import default_registry
from serverless_worker.runtime.metrics import metrics

pytestmark = pytest.mark.aws

# The report's endpoint label on each sandbox (the fault answers it before anything else).
REPORT_LABEL = {"priostack": "complete", "claimqueue": "result"}
PROTOCOLS = tuple(REPORT_LABEL)


def _reports_sent(env: Any) -> int:
    return int(env.admin.stats()["calls"].get(REPORT_LABEL[env.protocol], 0))


def _reaper_reports_once_the_server_is_back(env: Any) -> None:
    """Let the noted retry time pass (backdated, not waited) with the fault still on: one
    tick's reaper sends the stored outcome once, notes the failure and moves the retry time
    out. Then clear the fault and backdate again: the next reap sends it once more, and the
    job is done."""
    (item,) = ledger(env)
    backdate(env, item.key)
    env.tick(0.5)
    env.stack.wait_idle()
    assert _reports_sent(env) == DEFAULT_RETRY.attempts + 1, "the reaper tries once per reap"
    (item,) = ledger(env)
    assert item.status is LedgerStatus.OUTCOME_STORED and item.settle_failures == 2, item
    assert item.deadline is not None and item.deadline > time.time(), "the next retry time moved out"

    env.admin.clear_faults()
    backdate(env, item.key)
    run_until(env, lambda: all(done(env.protocol, job) for job in env.admin.jobs()),
              what="the stored outcome reported by the reaper")
    assert _reports_sent(env) == DEFAULT_RETRY.attempts + 2
    assert in_flight(env) == 0


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_executor_sends_a_failing_report_the_policys_number_of_times(
        worker_env: Callable[..., Any], recorder: Any, protocol: str) -> None:
    # given a server that answers every report 503
    env = worker_env(protocol, handlers=["e2e.echo"], handler_module=HANDLERS_PATH)
    env.seed("e2e.echo", [{"n": 1}])
    env.admin.faults([{"kind": "error_5xx", "endpoint": REPORT_LABEL[protocol], "status": 503}])
    deferred = metrics.totals["Jobs_deferred"]

    # when the executor runs the job and reports it
    env.tick(1.0)
    env.stack.wait_idle()

    # then the client made the policy's attempts, and the invocation ended without an error,
    # so Lambda's asynchronous retry does not start them over
    assert _reports_sent(env) == DEFAULT_RETRY.attempts
    assert env.stack.lambdas.background_errors == []
    assert metrics.totals["Jobs_deferred"] == deferred + 1
    (item,) = ledger(env)
    assert item.status is LedgerStatus.OUTCOME_STORED and item.settle_failures == 1, item

    _reaper_reports_once_the_server_is_back(env)
    assert list(recorder.counts("e2e.echo").values()) == [1], "the handler ran once"


@pytest.fixture
def long_handlers() -> Iterator[None]:
    with default_registry.isolated():
        handlers_long.RUNS.clear()
        yield


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.usefixtures("long_handlers")
def test_the_state_machine_sends_a_failing_report_the_policys_number_of_times(
        worker_env: Callable[..., Any], protocol: str) -> None:
    # given a long-running job and a server that answers every report 503
    env = worker_env(protocol, handlers=["long-steady"], handler_module="handlers_long")
    env.seed("long-steady", [{"seconds": 1, "tag": "reported-once"}])
    env.admin.faults([{"kind": "error_5xx", "endpoint": REPORT_LABEL[protocol], "status": 503}])

    # when its execution runs and reports it
    for _ in range(4):  # under load a tick's session and heartbeat can use its whole window
        env.tick(2.0)
        if env.stack.executions():
            break
    (listed,) = env.stack.wait_for_executions(40.0)
    execution = env.stack.sfn.describe_execution(executionArn=listed["executionArn"])

    # then the Report task ran once and the client made the policy's attempts; the give-back
    # left the noted report to the reaper instead of sending it again
    assert _reports_sent(env) == DEFAULT_RETRY.attempts
    steps_name = env.stack.function_names["StepsFunction"]
    invoked = [i.event.get("step") for i in list(env.stack.lambdas.invocations)
               if i.function_name == steps_name and isinstance(i.event, dict)]
    assert invoked.count("report") == 1 and invoked.count("give_back") == 1, invoked
    assert execution["status"] == "FAILED"
    assert "deferred" in env.stack.history(listed["executionArn"])  # the give-back's answer
    (item,) = ledger(env)
    assert item.status is LedgerStatus.OUTCOME_STORED and item.settle_failures == 1, item

    _reaper_reports_once_the_server_is_back(env)
    assert len(handlers_long.runs_of("long-steady")) == 1, "the handler ran once"
