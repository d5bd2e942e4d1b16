"""Executors that keep pulling, end to end: the real functions and ASL in moto against the
three sandboxes (``runtime/self_pull.py``, docs/limits.md).

Each test starts where the scheduler leaves off: one delivery pulled and recorded (the
scheduler's pull came back full), its executor invoked with ``{"ledger_key": k, "pull": true}``;
pullers are invoked with ``{"pull": {"handler": h, "by": t}}``. What happened is read from
the sandbox (its per-endpoint call counts and job histories), the ledger and the function
invocations: counted, never timed.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from e2e_support import PROTOCOLS, done, in_flight, instance, ledger, wait_for

from reliability.invariants import check, observe
from serverless_worker.model import DispatchMode, LedgerStatus
from serverless_worker.protocols.base import PullRequest
from serverless_worker.registry import load_handlers
from support.moto_lambda import FakeLambdaContext

pytestmark = pytest.mark.aws

HANDLERS_PATH = __file__.replace("test_self_pull.py", "handlers_self_pull.py")
PULL_LABEL = {"pipelogiq": "pull", "priostack": "activate", "claimqueue": "claim"}
SUCCEEDED = {"pipelogiq": "completed", "priostack": "completed", "claimqueue": "finished"}
SETTINGS = {"self_pull": True, "max_in_flight": 5}


@pytest.fixture
def runs() -> Any:
    module = load_handlers(HANDLERS_PATH)
    module.RUNS.reset()
    yield module.RUNS
    module.RUNS.reset()


def start(worker_env: Any, protocol: str, jobs: int, handler: str = "sp.quick", **settings: Any) -> Any:
    env = worker_env(protocol, handlers=[handler], handler_module=HANDLERS_PATH, settings={**SETTINGS, **settings})
    env.seed(handler, [{"n": n} for n in range(jobs)])
    return env


def recorded_by_the_scheduler(env: Any, handler: str = "sp.quick") -> str:
    """What a scheduler tick does before it invokes an executor: pull one, record it."""
    services = env.stack.services()
    (delivery,) = services.call(lambda p: p.pull(PullRequest(handler=handler, max_items=1)))
    key = services.store.record_delivery(delivery, instance=services.instance, deadline=time.time() + 60,
                                         dispatch_mode=DispatchMode.INVOKE)
    assert key is not None
    return str(key)


def pulls(env: Any) -> int:
    return int(env.admin.stats()["calls"].get(PULL_LABEL[env.protocol], 0))


def executor_invocations(env: Any) -> int:
    name = env.stack.function_names["ExecutorFunction"]
    return sum(i.function_name == name for i in env.stack.lambdas.invocations)


def settled_once(env: Any, runs: Any) -> None:
    """Every job reached its one outcome (Pipelogiq applies results asynchronously: wait for it)."""
    wait_for(lambda: all(done(env.protocol, job) for job in env.admin.jobs()), what="every job done")
    check(observe(env, runs.counts), final_states={SUCCEEDED[env.protocol]})


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_backlog_drains_with_fewer_invocations_than_jobs(worker_env: Any, runs: Any, protocol: str) -> None:
    env = start(worker_env, protocol, 20)
    key = recorded_by_the_scheduler(env)
    by = time.time() + 60
    for _ in range(2):  # two pullers the scheduler would have started beside it
        env.stack.lambda_client.invoke(FunctionName=env.stack.function_names["ExecutorFunction"],
                                       InvocationType="Event",
                                       Payload=json.dumps({"pull": {"handler": "sp.quick", "by": by}}).encode())

    result = env.stack.invoke("ExecutorFunction", {"ledger_key": key, "pull": True})
    env.stack.wait_idle()

    assert result["action"] == "reported" and result["stopped"] == "empty", result
    assert result["self_pulled"] and {p["action"] for p in result["self_pulled"]} == {"reported"}
    assert executor_invocations(env) == 3 < 20
    settled_once(env, runs)
    assert sum(runs.counts.values()) == 20 and runs.max_active <= 5
    items = ledger(env)
    assert Counter(item.status for item in items) == {LedgerStatus.ACKNOWLEDGED: 20}
    assert Counter(item.dispatch_mode for item in items) == {DispatchMode.INVOKE: 1, DispatchMode.SELF_PULLED: 19}
    assert in_flight(env) == 0


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_per_invocation_cap_holds(worker_env: Any, runs: Any, protocol: str) -> None:
    from serverless_worker.runtime.metrics import metrics

    env = start(worker_env, protocol, 6, self_pull_max_jobs=3)
    key = recorded_by_the_scheduler(env)
    before = dict(metrics.totals)

    result = env.stack.invoke("ExecutorFunction", {"ledger_key": key, "pull": True})

    added = {name: metrics.totals[name] - before.get(name, 0) for name in ("Jobs_reported", "SelfPulled")}
    assert added == {"Jobs_reported": 3, "SelfPulled": 2}  # Jobs_<action> once per delivery

    assert result["stopped"] == "cap" and [p["action"] for p in result["self_pulled"]] == ["reported"] * 2, result
    assert sum(runs.counts.values()) == 3 and pulls(env) == 3  # the scheduler's and two of its own
    assert in_flight(env) == 0


def _context(env: Any, seconds: int) -> FakeLambdaContext:
    return FakeLambdaContext(function_name=env.stack.function_names["ExecutorFunction"], invoked_function_arn="",
                             memory_limit_in_mb=256, aws_request_id=str(uuid.uuid4()), timeout_seconds=seconds)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_executor_short_of_time_stops_and_leaves_nothing_in_flight(worker_env: Any, runs: Any,
                                                                       protocol: str) -> None:
    from serverless_worker.runtime.entry import execute_delivery

    env = start(worker_env, protocol, 3)
    key = recorded_by_the_scheduler(env)

    # 5 s: the first run's 1 s fits beside the 2 s report margin; another would also need
    # the 2 s pull allowance, and less than 5 s is left once the first is done.
    result = execute_delivery({"ledger_key": key, "pull": True}, _context(env, 5))

    assert result["action"] == "reported" and result["stopped"] == "time" and result["self_pulled"] == [], result
    assert sum(runs.counts.values()) == 1 and pulls(env) == 1
    assert in_flight(env) == 0


def test_a_handler_without_a_declared_timeout_never_self_pulls(worker_env: Any, runs: Any) -> None:
    env = start(worker_env, "claimqueue", 3, handler="sp.untimed")
    key = recorded_by_the_scheduler(env, "sp.untimed")

    result = env.stack.invoke("ExecutorFunction", {"ledger_key": key, "pull": True})

    assert result["stopped"] == "no_timeout" and result["self_pulled"] == [], result
    assert pulls(env) == 1 and in_flight(env) == 0


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_with_self_pull_off_the_executor_runs_its_one_delivery(worker_env: Any, runs: Any, protocol: str) -> None:
    env = start(worker_env, protocol, 3, self_pull=False)
    key = recorded_by_the_scheduler(env)

    result = env.stack.invoke("ExecutorFunction", {"ledger_key": key, "pull": True})
    late = env.stack.invoke("ExecutorFunction", {"pull": {"handler": "sp.quick", "by": time.time() + 60}})

    assert result == {"ledger_key": key, "action": "reported", "detail": result["detail"]}
    assert late == {"handler": "sp.quick", "action": "skipped", "stopped": "off"}
    assert sum(runs.counts.values()) == 1 and pulls(env) == 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_late_puller_does_not_pull(worker_env: Any, runs: Any, protocol: str) -> None:
    env = start(worker_env, protocol, 2)

    result = env.stack.invoke("ExecutorFunction", {"pull": {"handler": "sp.quick", "by": time.time() - 1}})

    assert result == {"handler": "sp.quick", "action": "late"}
    assert pulls(env) == 0 and runs.total == 0


@pytest.mark.parametrize("protocol", ["pipelogiq", "claimqueue"])
def test_a_lost_lease_stops_the_loop(worker_env: Any, runs: Any, protocol: str) -> None:
    # The second run arms the server to grant the next lease already expired: that delivery is
    # never run, it is discarded, and the executor pulls nothing more.
    env = start(worker_env, protocol, 6)
    endpoint = "lease.acquire" if protocol == "pipelogiq" else "claim"
    runs.tap = lambda number: number == 2 and env.admin.faults(
        [{"kind": "expired_lease", "endpoint": endpoint, "count": 1}])
    key = recorded_by_the_scheduler(env)

    result = env.stack.invoke("ExecutorFunction", {"ledger_key": key, "pull": True})

    assert result["stopped"] == "refused", result
    assert [p["action"] for p in result["self_pulled"]] == ["reported", "discarded"]
    assert runs.total == 2 and pulls(env) == 3
    assert in_flight(env) == 0


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_drain_mid_loop_stops_the_pulling(worker_env: Any, runs: Any, protocol: str) -> None:
    env = start(worker_env, protocol, 8, self_pull_check_seconds=0.001)
    store = env.stack.store()
    seen: dict[str, int] = {}

    def drain_at_third_run(number: int) -> None:
        if number == 3:
            store.set_draining(protocol, instance(env), True)
            seen["pulls"] = pulls(env)

    runs.tap = drain_at_third_run
    key = recorded_by_the_scheduler(env)

    result = env.stack.invoke("ExecutorFunction", {"ledger_key": key, "pull": True})

    assert result["stopped"] == "draining", result
    assert runs.total == 3 and pulls(env) == seen["pulls"] == 3  # no pull once the flag was seen
    assert in_flight(env) == 0

    store.set_draining(protocol, instance(env), False)  # resume: a puller takes the rest
    runs.tap = None
    rest = env.stack.invoke("ExecutorFunction", {"pull": {"handler": "sp.quick", "by": time.time() + 60}})
    assert rest["stopped"] == "empty" and len(rest["self_pulled"]) == 5, rest
    settled_once(env, runs)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_through_the_scheduler_a_backlog_drains_in_fewer_invocations(worker_env: Any, runs: Any,
                                                                     protocol: str) -> None:
    # The whole path: the scheduler's full pull flags its deliveries (and may start pullers),
    # and the executors keep pulling after them.
    from e2e_support import run_until

    env = start(worker_env, protocol, 20)

    reports = run_until(env, lambda: all(done(protocol, job) for job in env.admin.jobs()), what="every job done",
                        window=2.0, ticks=4)

    settled_once(env, runs)
    assert sum(runs.counts.values()) == 20 and runs.max_active <= 5
    print(f"\n[{protocol}] {executor_invocations(env)} executor invocations for 20 jobs")
    assert executor_invocations(env) < 20, (executor_invocations(env), reports)
    modes = Counter(item.dispatch_mode for item in ledger(env))
    assert modes[DispatchMode.SELF_PULLED] > 0 and sum(modes.values()) == 20, modes
    assert in_flight(env) == 0
