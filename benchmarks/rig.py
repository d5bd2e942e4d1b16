"""The runtime under test, wired as ``serverless-worker local`` wires it (``LocalRunner._build``):
the real scheduler ticking back to back, the real executor in a bounded thread pool with
Lambda-like contexts (``LocalDispatcher``), a full tick waking as soon as an executor
finishes, and the state table in moto's DynamoDB (``EmbeddedAws``, standing in for the
stack's table), or, with ``store``, the local runner's own SQLite state file.

The runner itself is not driven: its drain and summary follow the last job, which would
add DynamoDB requests and time that are the console's, not the runtime's.

The DynamoDB given (``aws.dynamodb``) is the embedded moto of ``EmbeddedAws`` or moto's
server in its own process (``harness.MotoProcess``): the rig only needs its client.

Nothing here changes what the runtime does; it only counts (state-store operations,
executor durations, reported jobs) and can end a running tick early (``BenchClock``), so
a benchmark does not wait out a 50-second poll window after its last job.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from typing import Any

from .harness import HANDLER, CallCounter, SandboxProcess

__all__ = ["STORE_OPERATIONS", "BenchClock", "RuntimeRig", "dynamodb_ceiling", "template_defaults"]

# StateStore methods counted per benchmark (each is one or a few DynamoDB requests).
STORE_OPERATIONS = (
    "record_delivery", "record_new", "mark_dispatched", "mark_dispatch_failed", "start_run", "take_over",
    "store_outcome", "mark_reported", "mark_acknowledged", "mark_handed_back", "mark_discarded", "add_counters",
    "read_counters", "get_control", "count_in_flight", "stranded", "in_flight", "get", "load_session",
    "save_session", "acquire_lock", "release_lock", "renew_deadline", "save_checkpoint",
)


def template_defaults() -> dict[str, Any]:
    """The stack's configured defaults the benchmarks use (template.yaml's parameters)."""
    from serverless_worker.local.template import load_template, param_default

    template = load_template()
    params = {name: spec.get("Default") for name, spec in template.get("Parameters", {}).items()}
    resources = template["Resources"]
    globals_ = template.get("Globals", {}).get("Function", {})

    def prop(logical: str, name: str) -> Any:
        props = resources[logical]["Properties"]
        return param_default(template, props.get(name, globals_.get(name)))

    return {
        "batch_size": int(params["BatchSize"]),
        "max_in_flight": int(params["MaxInFlight"]),
        "poll_window_seconds": float(params["PollWindowSeconds"]),
        "schedule": str(params["ScheduleRate"]),
        "reserved_concurrency": int(params["ExecutorReservedConcurrency"]),
        "lease_renew_seconds": float(params["LeaseRenewSeconds"]),
        "scheduler_timeout": float(prop("SchedulerFunction", "Timeout")),
        "executor_timeout": float(prop("ExecutorFunction", "Timeout")),
        "memory_mb": {logical: int(prop(logical, "MemorySize"))
                      for logical in ("SchedulerFunction", "ExecutorFunction", "StepsFunction")},
    }


class BenchClock:
    """``time.time`` until :meth:`end` moves it past any poll window: a running tick then
    ends at its next check. 10,000 s stays well inside the session's refresh margin, so
    nothing re-bootstraps because of it."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset

    def end(self) -> None:
        self.offset = 10_000.0


class RuntimeRig:
    """One worker instance of the runtime against ``sandbox``, with a fresh state table."""

    def __init__(self, aws: Any, sandbox: SandboxProcess, *, registry: Any, concurrency: int,
                 batch_size: int, max_in_flight: int, poll_window: float, dispatcher: Any = None,
                 settings: dict[str, Any] | None = None, store: Any = None) -> None:
        from serverless_worker.local.dispatcher import LocalDispatcher
        from serverless_worker.local.observe import RunObserver
        from serverless_worker.local.table import create_state_table
        from serverless_worker.local.template import template_path
        from serverless_worker.runtime.scheduler import Scheduler
        from serverless_worker.runtime.services import Services
        from serverless_worker.settings import Settings
        from serverless_worker.state import DynamoStateStore

        defaults = template_defaults()
        self._aws = aws
        # ``store`` given (the local runner's SQLite file): no table; ``aws`` may be None then.
        self.table = create_state_table(aws.dynamodb, template=template_path()).name if store is None else ""
        self.settings = Settings(
            protocol=sandbox.protocol, base_url=sandbox.url, api_key=sandbox.credential, handlers=[HANDLER],
            instance_id=f"bench-{uuid.uuid4().hex[:8]}", batch_size=batch_size, max_in_flight=max_in_flight,
            executor_reserved_concurrency=concurrency, poll_window_seconds=poll_window, table_name=self.table or None,
            **(settings or {}))
        self.store = store if store is not None else DynamoStateStore(self.table, client=aws.dynamodb)
        self.store_calls = CallCounter(self.store, [n for n in STORE_OPERATIONS if hasattr(self.store, n)])
        self.observer = RunObserver()
        self.dispatcher = dispatcher if dispatcher is not None else LocalDispatcher(
            concurrency=concurrency, executor_timeout=defaults["executor_timeout"], observer=self.observer)
        self._stop = threading.Event()
        self.clock = BenchClock()
        self.services = Services(settings=self.settings, store=self.store, registry=registry,
                                 dispatcher=self.dispatcher, clock=self.clock)
        if dispatcher is None:
            self.dispatcher.attach(self._execute)
        self.scheduler = Scheduler(self.services, sleep=self._sleep, dispatch_workers=min(16, concurrency),
                                   wait_for_capacity=self._wait_for_capacity)
        self.scheduler_timeout = defaults["scheduler_timeout"]
        self.executor_seconds: list[float] = []
        self.actions: dict[str, int] = {}
        self.ticks: list[Any] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._reported = 0
        self._waiters: list[tuple[int, threading.Event, list[float]]] = []
        self._thread: threading.Thread | None = None

    def _sleep(self, seconds: float) -> None:
        self._stop.wait(seconds)

    def _wait_for_capacity(self, seconds: float) -> None:
        """As the local runner: a full tick goes on as soon as an executor finishes."""
        self.observer.capacity.wait(seconds)
        self.observer.capacity.clear()

    # -- the executor entry, counted ------------------------------------------------
    def _execute(self, key: str, context: Any) -> dict[str, Any]:
        from serverless_worker.runtime.executor import execute

        started = time.perf_counter()
        result = execute(self.services, key, context)
        took = time.perf_counter() - started
        action = str(result.get("action"))
        with self._lock:
            self.executor_seconds.append(took)
            self.actions[action] = self.actions.get(action, 0) + 1
            if action == "reported":
                self._reported += 1
                for target, event, stamp in self._waiters:
                    if self._reported >= target and not event.is_set():
                        stamp.append(time.perf_counter())
                        event.set()
        return result

    def wait_reported(self, count: int, timeout: float) -> float | None:
        """Block until ``count`` jobs were reported and acknowledged; the perf_counter then."""
        event, stamp = threading.Event(), list[float]()
        with self._lock:
            if self._reported >= count:
                return time.perf_counter()
            self._waiters.append((count, event, stamp))
        return stamp[0] if event.wait(timeout) else None

    @property
    def reported(self) -> int:
        with self._lock:
            return self._reported

    # -- ticks ---------------------------------------------------------------------------
    def start(self) -> None:
        """Tick back to back in a thread, as the local runner does (and as the schedule would with
        a window close to its period); a tick that raises is noted and followed by the next."""
        from serverless_worker.runtime.context import LocalContext

        def loop() -> None:
            while not self._stop.is_set():
                context = LocalContext("scheduler", timeout_seconds=self.scheduler_timeout)
                try:
                    self.ticks.append(self.scheduler.tick(context))
                except Exception as err:
                    self.errors.append(f"tick: {type(err).__name__}: {err}"[:300])
                    self._stop.wait(0.5)

        self._thread = threading.Thread(target=loop, name="bench-ticks", daemon=True)
        self._thread.start()

    def stop(self, sandbox: SandboxProcess | None = None, timeout: float = 30.0) -> None:
        """End the running tick: move the clock past its window and, since a long poll only
        returns when it is answered, stop the sandbox so it returns at once."""
        self._stop.set()
        self.clock.end()
        if sandbox is not None:
            sandbox.stop()
        if self._thread is not None:
            self._thread.join(timeout)

    def close(self) -> None:
        close = getattr(self.dispatcher, "close", None)
        if close is not None:
            close(wait=True)
        self.scheduler.close()
        self.services.close()
        with contextlib.suppress(Exception):  # best effort: the server goes away with the run anyway
            self._aws.dynamodb.delete_table(TableName=self.table)


def dynamodb_ceiling(aws: Any, *, threads: int, writes: int = 600) -> float:
    """Conditional ledger-sized updates per second the emulated DynamoDB sustains from
    ``threads`` threads of this process: what bounds a runtime that needs N writes per job."""
    from concurrent.futures import ThreadPoolExecutor

    from serverless_worker.local.table import create_state_table
    from serverless_worker.local.template import template_path

    table = create_state_table(aws.dynamodb, template=template_path()).name
    client = aws.dynamodb
    payload = "x" * 900

    def write(index: int) -> None:
        key = {"pk": {"S": f"delivery#bench#{index % 50}"}, "sk": {"S": "delivery"}}
        client.update_item(TableName=table, Key=key, UpdateExpression="SET #d = :d, #s = :s, #u = :u",
                           ConditionExpression="attribute_not_exists(#s) OR #s <> :never",
                           ExpressionAttributeNames={"#d": "delivery", "#s": "status", "#u": "updated_at"},
                           ExpressionAttributeValues={":d": {"S": payload}, ":s": {"S": "RUNNING"},
                                                      ":u": {"N": str(time.time())}, ":never": {"S": "-"}})

    try:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            started = time.perf_counter()
            list(pool.map(write, range(writes)))
            return writes / (time.perf_counter() - started)
    finally:
        client.delete_table(TableName=table)
