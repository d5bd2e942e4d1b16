"""(g) How many deliveries one scheduler tick pulls, records and dispatches per second.

The dispatcher only enqueues (no executor runs, nothing competes with the tick), and the
capacity limit is the backlog itself, so the tick never waits for room. The rate is the
backlog divided by the time from the tick's start to its last dispatch; it bounds how
many jobs per second one worker instance can take in, whatever the executors do.

The ledger is moto's server in a process of its own (``MotoProcess``), as DynamoDB is
remote from the scheduler's Lambda: a record costs the tick a round trip, not the
emulator's CPU. The tick records and dispatches on its pool while it pulls the next batch,
and makes parallel claims where a claim takes one item (``scheduler.py``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from serverless_worker.runtime.dispatch import Dispatcher

from .harness import HandlerClock, SandboxProcess, counter_delta
from .rig import RuntimeRig

__all__ = ["EnqueueDispatcher", "measure_dispatch_rate"]


class EnqueueDispatcher(Dispatcher):
    """A dispatcher that notes each key and returns: the fan-out at zero cost."""

    def __init__(self, target: int) -> None:
        self.keys: list[str] = []
        self.last: float | None = None
        self._target = target
        self._lock = threading.Lock()
        self.done = threading.Event()

    def invoke_executor(self, ledger_key: str) -> None:
        self._note(ledger_key)

    def start_execution(self, ledger_key: str, handover_epoch: str | None = None) -> None:
        self._note(ledger_key)

    def _note(self, key: str) -> None:
        with self._lock:
            self.keys.append(key)
            self.last = time.perf_counter()
            if len(self.keys) >= self._target:
                self.done.set()


def measure_dispatch_rate(aws: Any, protocol: str, *, deliveries: int, batch_size: int,
                          timeout: float = 120.0) -> dict[str, Any]:
    sandbox = SandboxProcess(protocol)
    dispatcher = EnqueueDispatcher(deliveries)
    rig = RuntimeRig(aws, sandbox, registry=HandlerClock().registry(), concurrency=deliveries,
                     batch_size=batch_size, max_in_flight=deliveries, poll_window=120.0,
                     dispatcher=dispatcher)
    pulling, recording = _time_calls(rig.services.protocol, "pull"), _time_calls(rig.store, "record_delivery")
    try:
        sandbox.seed([{"n": index} for index in range(deliveries)])
        before = sandbox.calls()
        ops_before = dict(rig.store.ops)
        started, cpu = time.perf_counter(), time.process_time()
        rig.start()
        finished = dispatcher.done.wait(timeout)
        took = (dispatcher.last or time.perf_counter()) - started
        cpu = time.process_time() - cpu
        calls = counter_delta(sandbox.calls(), before)
        writes = rig.store.ops.get("write", 0) - ops_before.get("write", 0)
    finally:
        rig.stop(sandbox)
        rig.close()
    return {
        "deliveries": deliveries,
        "dispatched": len(dispatcher.keys),
        "complete": finished,
        "batch_size": batch_size,
        "seconds": took,
        "dispatches_per_s": len(dispatcher.keys) / took if took > 0 else None,
        "pull_calls": {k: v for k, v in calls.items() if k in ("pull", "activate", "claim")},
        "ledger_writes": writes,
        # The tick's own CPU per delivery (this process: scheduler, clients, the enqueue-only
        # dispatcher; DynamoDB and the job server run in processes of their own): what one
        # vCPU allows whatever the emulators' speed, and how a Lambda's memory (its CPU
        # share, a full vCPU at 1,769 MB) scales the rate.
        "cpu_ms_per_delivery": 1000 * cpu / max(1, len(dispatcher.keys)),
        # Where the tick's time goes, per delivery: pull calls (parallel claims add up their
        # threads' time), records on the dispatch pool (16 threads, beside the pulls): thread
        # time, not wall time.
        "pull_ms_per_delivery": 1000 * pulling[0] / max(1, len(dispatcher.keys)),
        "record_ms_each": 1000 * recording[0] / max(1, recording[1]),
    }


def _time_calls(target: Any, name: str) -> list[float]:
    """Wrap ``target.name`` to add up its wall time: [seconds, calls]."""
    spent = [0.0, 0]
    lock = threading.Lock()
    fn = getattr(target, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            with lock:
                spent[0] += time.perf_counter() - started
                spent[1] += 1

    setattr(target, name, timed)
    return spent
