"""The worker's counters end to end: settling a job costs no counters write (the short
path is four ledger writes per job), the next heartbeat still reports the counts, and a
drain writes them.

The functions share one warm "container" here (the cached runtime of ``support.aws``), as
consecutive invocations of a warm Lambda container share theirs.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from e2e_support import HANDLERS_PATH, PROTOCOLS, ledger

from serverless_worker.model import LedgerStatus

pytestmark = pytest.mark.aws


def _worker_counters(env: Any) -> dict[str, Any]:
    """What the Pipelogiq sandbox holds from this worker's last heartbeat."""
    workers = env.admin.overview()["workers"]
    assert len(workers) == 1, workers
    return dict(workers[0]["counters"])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_job_costs_four_writes_and_no_counters_write(worker_env: Any, recorder: Any, protocol: str) -> None:
    env = worker_env(protocol, handlers=["e2e.echo"], handler_module=HANDLERS_PATH,
                     settings={"batch_size": 10, "counters_flush_seconds": 600})
    env.tick(1.0)  # session, heartbeat, nothing to pull: what every tick costs, out of the way
    store = env.stack.store()
    writes_before = store.ops["write"]
    env.seed("e2e.echo", [{"n": n} for n in range(10)])

    report = env.tick(2.5)
    env.stack.wait_idle()

    assert report["dispatched"] == 10, report
    assert Counter(item.status for item in ledger(env)) == {LedgerStatus.ACKNOWLEDGED: 10}
    # record, claim, outcome stored, report+ack: 4 writes per job, and nothing else.
    assert store.ops["write"] - writes_before == 4 * 10
    assert store.read_counters(protocol, env.stack.services().instance) == {}
    assert env.stack.services().counters.totals() == {"processed": 10}


def test_heartbeat_reports_batched_counts_and_drain_writes_them(worker_env: Any, recorder: Any) -> None:
    env = worker_env("pipelogiq", handlers=["e2e.echo", "e2e.reject"], handler_module=HANDLERS_PATH,
                     settings={"counters_flush_seconds": 600})
    env.seed("e2e.echo", [{"n": n} for n in range(3)])
    env.seed("e2e.reject", [{"sku": "a"}, {"sku": "b"}])
    first = env.tick(3.0)
    env.stack.wait_idle()
    assert first["dispatched"] == 5, first
    store, instance = env.stack.store(), env.stack.services().instance
    assert store.read_counters("pipelogiq", instance) == {}  # batched: nothing written yet

    env.tick(1.0)  # its first heartbeat reads the stored counts plus this container's pending ones

    counters = _worker_counters(env)
    assert (counters["jobsProcessed"], counters["jobsFailed"]) == (5, 2), counters

    env.stack.invoke("DrainFunction", {"grace_seconds": 5})

    assert store.read_counters("pipelogiq", instance) == {"processed": 5, "failed": 2}
    assert env.stack.services().counters.pending() == {}


def test_zero_interval_writes_each_count(worker_env: Any, recorder: Any) -> None:
    env = worker_env("claimqueue", handlers=["e2e.echo"], handler_module=HANDLERS_PATH,
                     settings={"counters_flush_seconds": 0})
    env.seed("e2e.echo", [{"n": n} for n in range(3)])

    env.tick(2.5)
    env.stack.wait_idle()

    assert env.stack.store().read_counters("claimqueue", env.stack.services().instance) == {"processed": 3}
