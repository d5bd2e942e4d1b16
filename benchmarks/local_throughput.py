"""(a') the local worker against the minimal hand-rolled worker, jobs/s, per protocol.

``serverless-worker local`` is the runtime on a SQLite state file (``SqliteStateStore``),
with no AWS emulation on the short path; the throughput benchmark (``throughput.py``)
measures the runtime against moto's DynamoDB, which stands in for the stack's table. This
one wires the runtime as the local command does (``rig.RuntimeRig`` with the SQLite store,
the local retention) and runs it on the same backlog, concurrency and batch size as the
minimal worker, each on a fresh sandbox of the same kind. The clock runs from the first
call to the last job settled; CPU time per job is this process's (the SQLite writes
included: locally, they are the worker's own cost).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .harness import HandlerClock, SandboxProcess, counter_delta
from .rig import RuntimeRig
from .throughput import _inputs, per_job, run_minimal

__all__ = ["measure_local_throughput", "run_local"]


def run_local(protocol: str, jobs: int, concurrency: int, batch_size: int, max_in_flight: int,
              poll_window: float, timeout: float) -> dict[str, Any]:
    """The local worker's jobs/s, calls and state-file operations per job, CPU ms per job."""
    from serverless_worker.local.defaults import LOCAL_LEDGER_RETENTION_SECONDS
    from serverless_worker.state import SqliteStateStore

    with tempfile.TemporaryDirectory(prefix="bench-local-") as tmp:
        store = SqliteStateStore(Path(tmp) / "state.sqlite3", final_retention_seconds=LOCAL_LEDGER_RETENTION_SECONDS)
        sandbox = SandboxProcess(protocol)
        clock = HandlerClock()
        rig = RuntimeRig(None, sandbox, registry=clock.registry(), concurrency=concurrency, batch_size=batch_size,
                         max_in_flight=max_in_flight, poll_window=poll_window, store=store)
        try:
            sandbox.seed(_inputs(jobs))
            before = sandbox.calls()
            cpu = time.process_time()
            started = time.perf_counter()
            rig.start()
            finished = rig.wait_reported(jobs, timeout)
            cpu = time.process_time() - cpu
            took = (finished - started) if finished is not None else None
            calls = counter_delta(sandbox.calls(), before)
            ops = dict(store.ops)
            # Before the stop: stopping the sandbox cuts the running tick's pull, which is ours.
            errors = (rig.errors + [e for t in rig.ticks for e in t.errors])[:5]
            rig.stop(sandbox)
            return {"jobs_per_s": jobs / took if took else None, "done": rig.reported,
                    "calls": per_job(calls, jobs), "state_ops_per_job": per_job(ops, jobs),
                    "cpu_ms_per_job": 1000 * cpu / jobs, "errors": errors}
        finally:
            rig.stop(sandbox)
            rig.close()
            store.close()


def measure_local_throughput(protocol: str, *, jobs: int, concurrency: int, batch_size: int, max_in_flight: int,
                             poll_window: float, timeout: float, rounds: int = 3) -> dict[str, Any]:
    """The minimal worker, then the local worker, on the same backlog, ``rounds`` times in
    turn; the median of the rounds' ratios, and each round's.

    Both workers are bound by their own CPU here, and a shared machine's speed drifts by
    a tenth or more within a minute: one pair is a sample, not a figure, while pairs in
    turn see the same drift (medians are taken of each figure apart).
    """
    pairs = []
    for _ in range(max(1, rounds)):
        rate, _, minimal_done, minimal_errors, minimal_cpu = run_minimal(protocol, jobs, concurrency, batch_size,
                                                                         timeout)
        local = run_local(protocol, jobs, concurrency, batch_size, max_in_flight, poll_window, timeout)
        ratio = local["jobs_per_s"] / rate if local["jobs_per_s"] and rate else None
        pairs.append({"rate": rate, "minimal_done": minimal_done, "minimal_errors": minimal_errors,
                      "minimal_cpu": minimal_cpu, "local": local, "ratio": ratio})
    last = pairs[-1]["local"]
    return {"local_jobs_per_s": _median(p["local"]["jobs_per_s"] for p in pairs),
            "minimal_jobs_per_s": _median(p["rate"] for p in pairs),
            "ratio": _median(p["ratio"] for p in pairs), "ratios": [p["ratio"] for p in pairs],
            "local_done": min(p["local"]["done"] for p in pairs),
            "minimal_done": min(p["minimal_done"] for p in pairs), "calls": last["calls"],
            "state_ops_per_job": last["state_ops_per_job"],
            "cpu_ms_per_job": {"local": _median(p["local"]["cpu_ms_per_job"] for p in pairs),
                               "minimal": _median(p["minimal_cpu"] for p in pairs)},
            "errors": [f"minimal {e}" for p in pairs for e in p["minimal_errors"]]
                      + [f"local {e}" for p in pairs for e in p["local"]["errors"]]}


def _median(values: Iterable[float | None]) -> float | None:
    """The median of what was measured; ``None`` when a round measured nothing (it timed out)."""
    measured = list(values)
    if not measured or any(v is None for v in measured):
        return None
    return float(statistics.median(v for v in measured if v is not None))
