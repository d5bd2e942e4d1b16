"""(e) Latency from job creation to handler start, with the poll window active: the worker
is already ticking when jobs arrive, one at a time at a steady rate.

Each job carries its creation time (``t``, taken just before the seed call); the bench
handler notes when it starts. What lies between: the wait for the next pull (a long poll
answers at once; a Priostack or claim-queue poller polls again at once after work and backs
off from 0.2 s after empty polls, ``runtime/polling.py``), the ledger write, the dispatch,
the executor's claim and, for Pipelogiq, the lease. The tick runs in the full-window
liveness mode: a job that arrives while no tick runs (continuous or while-work between
ticks) waits for the next one instead, which no poll interval changes.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from .harness import HandlerClock, SandboxProcess, percentile
from .rig import RuntimeRig

__all__ = ["measure_latency"]

_PULL_LABELS = ("pull", "activate", "claim")


def measure_latency(aws: Any, protocol: str, *, jobs: int, rate: float, concurrency: int, batch_size: int,
                    max_in_flight: int, poll_window: float, timeout: float = 60.0) -> dict[str, Any]:
    sandbox = SandboxProcess(protocol)
    clock = HandlerClock()
    rig = RuntimeRig(aws, sandbox, registry=clock.registry(), concurrency=concurrency, batch_size=batch_size,
                     max_in_flight=max_in_flight, poll_window=poll_window, settings={"liveness": "full-window"})
    try:
        rig.start()
        polling = _wait_polling(sandbox, timeout=15.0)
        for index in range(jobs):
            due = time.perf_counter() + 1.0 / rate
            sandbox.seed([{"n": index, "t": time.time()}])
            time.sleep(max(0.0, due - time.perf_counter()))
        complete = clock.wait_for(jobs, timeout)
        latencies = clock.latencies()
        rig.wait_reported(jobs, 10.0)
        executor = list(rig.executor_seconds)
    finally:
        rig.stop(sandbox)
        rig.close()
    p50, p95 = percentile(latencies, 50), percentile(latencies, 95)
    return {
        "jobs": jobs,
        "rate_per_s": rate,
        "started": len(latencies),
        "complete": complete,
        "polling_before_first_job": polling,
        "p50_s": p50,
        "p95_s": p95,
        "max_s": max(latencies) if latencies else None,
        "executor_mean_ms": 1000 * statistics.fmean(executor) if executor else None,
    }


def _wait_polling(sandbox: SandboxProcess, timeout: float) -> bool:
    """Until the worker has made its first pull: its tick is then in its window."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(sandbox.calls().get(label, 0) for label in _PULL_LABELS):
            return True
        time.sleep(0.05)
    return False
