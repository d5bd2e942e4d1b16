"""The two unit costs the cost model scales: one scheduler tick when there is no work
(its duration, DynamoDB requests and HTTP calls), and one executor run with nothing else
running (the Lambda time of a job whose handler returns at once).

The idle tick runs in a liveness mode with the stack's poll window: while-work (its setup
and one round of pulls, which every mode bills) and, where the protocol heartbeats,
continuous (the heartbeat window and its closing heartbeat); the cost model adds the
window for what is not measured. The first tick (bootstrap, cold clients) is a warm-up; the second one
is measured, as a warm Lambda container would run it every minute. Executors run one at a time, as each
runs in a Lambda of its own: in the throughput run fifty share one process and queue
for the emulated DynamoDB, which real executors do not.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from .harness import HandlerClock, SandboxProcess, counter_delta, percentile
from .rig import RuntimeRig

__all__ = ["measure_executor_alone", "measure_idle_tick"]


def measure_idle_tick(aws: Any, protocol: str, *, window: float, batch_size: int, max_in_flight: int,
                      concurrency: int, liveness: str = "while-work") -> dict[str, Any]:
    from serverless_worker.runtime.context import LocalContext

    sandbox = SandboxProcess(protocol)
    rig = RuntimeRig(aws, sandbox, registry=HandlerClock().registry(), concurrency=concurrency,
                     batch_size=batch_size, max_in_flight=max_in_flight, poll_window=window,
                     settings={"liveness": liveness})
    try:
        timeout = rig.scheduler_timeout
        rig.scheduler.tick(LocalContext("scheduler", timeout_seconds=timeout), window=window)
        calls_before, ops_before = sandbox.calls(), dict(rig.store.ops)
        operations_before = rig.store_calls.snapshot()
        started, cpu = time.perf_counter(), time.process_time()
        report = rig.scheduler.tick(LocalContext("scheduler", timeout_seconds=timeout), window=window)
        took, cpu = time.perf_counter() - started, time.process_time() - cpu
        calls = counter_delta(sandbox.calls(), calls_before)
        ops = counter_delta(dict(rig.store.ops), ops_before)
        operations = counter_delta(rig.store_calls.snapshot(), operations_before)
    finally:
        rig.stop(sandbox)
        rig.close()
    return {
        "window_s": window,
        "liveness": liveness,
        "duration_s": took,
        # CPU of this process during the tick (the embedded DynamoDB's included: an upper bound):
        # at 128 MB a Lambda gets 128/1769 of a vCPU, so this part of the tick runs ~14x longer.
        "cpu_s": cpu,
        "reads": ops.get("read", 0),
        "writes": ops.get("write", 0),
        "operations": operations,
        "calls": calls,
        "heartbeats": report.heartbeats,
        "pulls": report.pulls,
    }


def measure_executor_alone(aws: Any, protocol: str, *, jobs: int) -> dict[str, Any]:
    """Executor wall time per job with one executor at a time (the first run, which imports, apart)."""
    sandbox = SandboxProcess(protocol)
    clock = HandlerClock()
    rig = RuntimeRig(aws, sandbox, registry=clock.registry(), concurrency=1, batch_size=1, max_in_flight=1,
                     poll_window=50.0)
    try:
        sandbox.seed([{"n": index} for index in range(jobs + 1)])
        rig.start()
        complete = rig.wait_reported(jobs + 1, 120.0) is not None
        durations = sorted(rig.executor_seconds[1:])
    finally:
        rig.stop(sandbox)
        rig.close()
    p50 = percentile(durations, 50)
    return {"jobs": len(durations), "complete": complete,
            "mean_ms": 1000 * statistics.fmean(durations) if durations else None,
            "p50_ms": 1000 * p50 if p50 is not None else None}
