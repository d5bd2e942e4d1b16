"""(a) jobs per second, (b) HTTP calls per job by endpoint and (c) DynamoDB requests per job:
the runtime and the minimal worker, each on a fresh sandbox of the same kind, with the same
jobs, concurrency and batch size.

The clock runs from the first call (the first tick; the minimal worker's bootstrap) to the
moment the last job is settled (acknowledged / completed / result accepted). The jobs are
all seeded before it starts, so both drain the same backlog.

Beside the wall clock, CPU time per job: the runtime's (this process's, less what the
embedded moto spent in it, since DynamoDB is remote from Lambda), DynamoDB's (the
embedded moto's share, or the server process's with ``harness.MotoProcess``) and the
minimal worker's (the sandbox runs in its own process). The CPU figures say what bounds
the throughput on the machine at hand, busy or not.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from .harness import EmbeddedDynamoCpu, HandlerClock, SandboxProcess, counter_delta, minimum_calls, percentile
from .minimal_worker import MinimalWorker
from .rig import RuntimeRig

__all__ = ["ThroughputResult", "ledger_item_bytes", "measure_throughput", "per_job"]

# Settling calls only; everything else the runtime sends is liveness or recovery.
_HEARTBEATS = ("heartbeat", "workers.heartbeat")
_PER_TICK = ("load_session", "save_session", "acquire_lock", "release_lock", "stranded", "get_control",
             "read_counters")


@dataclass
class ThroughputResult:
    protocol: str
    jobs: int
    concurrency: int
    batch_size: int
    runtime_jobs_per_s: float | None = None
    minimal_jobs_per_s: float | None = None
    runtime_calls: dict[str, float] = field(default_factory=dict)
    minimal_calls: dict[str, float] = field(default_factory=dict)
    minimum_calls: dict[str, float] = field(default_factory=dict)
    dynamodb: dict[str, Any] = field(default_factory=dict)
    executor_ms: dict[str, float | None] = field(default_factory=dict)
    scheduler: dict[str, Any] = field(default_factory=dict)
    cpu_ms_per_job: dict[str, float | None] = field(default_factory=dict)  # runtime, dynamodb, minimal
    runtime_done: int = 0
    minimal_done: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        if not self.runtime_jobs_per_s or not self.minimal_jobs_per_s:
            return None
        return self.runtime_jobs_per_s / self.minimal_jobs_per_s

    @property
    def heartbeats_per_job(self) -> float:
        return sum(self.runtime_calls.get(name, 0.0) for name in _HEARTBEATS)

    @property
    def calls_above_minimum(self) -> dict[str, float]:
        """Per endpoint, what the runtime sent beyond the protocol's minimum (heartbeats apart).

        Includes the empty polls that end a backlog, which any poller makes."""
        return _over(self.runtime_calls, self.minimum_calls)

    @property
    def calls_above_minimal_worker(self) -> dict[str, float]:
        """Beyond both the minimum and what the minimal worker itself needed (its empty polls)."""
        floor = {name: max(self.minimum_calls.get(name, 0.0), self.minimal_calls.get(name, 0.0))
                 for name in set(self.minimum_calls) | set(self.minimal_calls)}
        return _over(self.runtime_calls, floor)

    def as_dict(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data.update(ratio=self.ratio, heartbeats_per_job=self.heartbeats_per_job,
                    calls_above_minimum=self.calls_above_minimum,
                    calls_above_minimal_worker=self.calls_above_minimal_worker)
        return data


def _over(calls: dict[str, float], floor: dict[str, float]) -> dict[str, float]:
    extra = {}
    for name, value in calls.items():
        if name in _HEARTBEATS:
            continue
        over = value - floor.get(name, 0.0)
        if over > 1e-9:
            extra[name] = over
    return extra


def per_job(counts: dict[str, int], jobs: int) -> dict[str, float]:
    return {name: value / jobs for name, value in sorted(counts.items())}


def _inputs(count: int) -> list[dict[str, Any]]:
    return [{"n": index} for index in range(count)]


def run_minimal(protocol: str, jobs: int, concurrency: int, batch_size: int,
                timeout: float) -> tuple[float | None, dict[str, float], int, list[str], float]:
    """Jobs/s, calls per job, jobs done, errors and CPU ms per job of the minimal worker."""
    with SandboxProcess(protocol) as sandbox:
        sandbox.seed(_inputs(jobs))
        clock = HandlerClock()
        before = sandbox.calls()
        worker = MinimalWorker(protocol, sandbox.url, sandbox.credential, concurrency=concurrency,
                               batch_size=batch_size, note=clock.note)
        try:
            cpu = time.process_time()
            took = worker.run(jobs, timeout)
            cpu = time.process_time() - cpu
            calls = counter_delta(sandbox.calls(), before)
        finally:
            worker.close()
        return ((jobs / took if took else None), per_job(calls, jobs), worker.done, worker.errors[:5],
                1000 * cpu / jobs)


def run_runtime(aws: Any, protocol: str, jobs: int, concurrency: int, batch_size: int, max_in_flight: int,
                poll_window: float, timeout: float) -> dict[str, Any]:
    sandbox = SandboxProcess(protocol)
    clock = HandlerClock()
    rig = RuntimeRig(aws, sandbox, registry=clock.registry(), concurrency=concurrency, batch_size=batch_size,
                     max_in_flight=max_in_flight, poll_window=poll_window)
    # DynamoDB's CPU: the server process's (MotoProcess), or the embedded moto's share of ours.
    embedded = None if callable(getattr(aws, "cpu_seconds", None)) else EmbeddedDynamoCpu()
    dynamodb = embedded or aws
    try:
        sandbox.seed(_inputs(jobs))
        before = sandbox.calls()
        with embedded or contextlib.nullcontext():
            server_cpu = dynamodb.cpu_seconds()
            cpu = time.process_time()
            started = time.perf_counter()
            rig.start()
            finished = rig.wait_reported(jobs, timeout)
            cpu = time.process_time() - cpu
            server_cpu = dynamodb.cpu_seconds() - server_cpu if server_cpu is not None else None
        if server_cpu is not None and embedded is not None:
            cpu -= server_cpu  # in AWS the runtime's process does not run DynamoDB
        took = (finished - started) if finished is not None else None
        calls = counter_delta(sandbox.calls(), before)
        ops = dict(rig.store.ops)
        operations = rig.store_calls.snapshot()
        item_bytes = ledger_item_bytes(aws.dynamodb, rig.table)
        rig.stop(sandbox)
        ticks = list(rig.ticks)
        durations = sorted(rig.executor_seconds)
        return {
            "jobs_per_s": jobs / took if took else None,
            "done": rig.reported,
            "calls": per_job(calls, jobs),
            "ops": ops,
            "operations": operations,
            "item_bytes": item_bytes,
            "executor_ms": _ms(durations),
            "actions": dict(rig.actions),
            "cpu_ms_per_job": {"runtime": 1000 * cpu / jobs,
                               "dynamodb": 1000 * server_cpu / jobs if server_cpu is not None else None},
            "scheduler": {"ticks": len(ticks), "pulls": sum(t.pulls for t in ticks),
                          "full_waits": sum(t.full_waits for t in ticks),
                          "errors": (rig.errors + [e for t in ticks for e in t.errors])[:5]},
        }
    finally:
        rig.stop(sandbox)
        rig.close()


def _ms(durations: list[float]) -> dict[str, float | None]:
    if not durations:
        return {"mean": None, "p50": None, "p95": None}
    p50, p95 = percentile(durations, 50), percentile(durations, 95)
    return {"mean": 1000 * statistics.fmean(durations), "p50": 1000 * p50 if p50 is not None else None,
            "p95": 1000 * p95 if p95 is not None else None}


def ledger_item_bytes(client: Any, table: str, sample: int = 100) -> float | None:
    """Mean size of settled ledger items (DynamoDB's own measure), for write units."""
    from serverless_worker.state.items import item_size

    page = client.scan(TableName=table, Limit=sample * 2)
    sizes = [item_size(item) for item in page.get("Items", []) if item["pk"]["S"].startswith("delivery#")]
    return statistics.fmean(sizes[:sample]) if sizes else None


def dynamodb_per_job(ops: dict[str, int], operations: dict[str, int], jobs: int,
                     item_bytes: float | None) -> dict[str, Any]:
    """Requests per job, the per-job (short path) ones apart from the per-tick ones."""
    per_tick = {k: v for k, v in operations.items() if k in _PER_TICK}
    short = {k: v for k, v in operations.items() if k not in _PER_TICK}
    units = max(1, math.ceil((item_bytes or 0) / 1024))
    return {
        "reads_per_job": ops.get("read", 0) / jobs,
        "writes_per_job": ops.get("write", 0) / jobs,
        "by_operation_per_job": per_job(short, jobs),
        "per_tick_operations": per_tick,
        "ledger_item_bytes": item_bytes,
        "write_units_per_ledger_write": units,
    }


def measure_throughput(aws: Any, protocol: str, *, jobs: int, concurrency: int, batch_size: int,
                       max_in_flight: int, poll_window: float, timeout: float) -> ThroughputResult:
    result = ThroughputResult(protocol=protocol, jobs=jobs, concurrency=concurrency, batch_size=batch_size,
                              minimum_calls=minimum_calls(protocol, batch_size, jobs))
    rate, calls, done, errors, minimal_cpu = run_minimal(protocol, jobs, concurrency, batch_size, timeout)
    result.minimal_jobs_per_s, result.minimal_calls, result.minimal_done = rate, calls, done
    result.errors += [f"minimal {e}" for e in errors]
    runtime = run_runtime(aws, protocol, jobs, concurrency, batch_size, max_in_flight, poll_window, timeout)
    result.runtime_jobs_per_s, result.runtime_calls = runtime["jobs_per_s"], runtime["calls"]
    result.runtime_done = runtime["done"]
    result.dynamodb = dynamodb_per_job(runtime["ops"], runtime["operations"], jobs, runtime["item_bytes"])
    result.executor_ms = runtime["executor_ms"]
    result.cpu_ms_per_job = {**runtime["cpu_ms_per_job"], "minimal": minimal_cpu}
    result.scheduler = {**runtime["scheduler"], "executor_actions": runtime["actions"]}
    result.errors += [f"runtime {e}" for e in runtime["scheduler"]["errors"]]
    return result
