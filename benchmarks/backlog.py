"""(i) A backlog drained through the Lambda entry points: per protocol and per delivery path,
what each job costs the stack while there is more work than executors.

A sandbox holds ``jobs`` jobs before the first tick. The stack is emulated as the AWS test
tier emulates it (``tests/support/aws.py``): moto with the template's table and state
machine, and the scheduler, executor and steps functions each running its own
``functions/<fn>/app.py`` in this process, configured through the environment as the
template configures them; an executor's async invoke runs on a thread of its own, as
Lambda runs it in an execution environment of its own (``local/moto_lambda.py``). The
scheduler is invoked as its schedule would invoke it: at the start, then every schedule
period, never two at once (reserved concurrency 1), a missed tick not replayed. DynamoDB
is moto's server in a process of its own when one is given (``harness.MotoProcess``, as it
is remote from Lambda), else the embedded one.

Measured, nothing in the runtime changed:

- jobs/s: from the first tick to the last settle, both on the sandbox's clock;
- Lambda invocations per job: every function's, counted where moto hands them to the code;
- write units per job, priced as ``write_units`` prices them, for every write the runtime's
  own DynamoDB clients send (botocore's events): the ledger's, and the rest (sessions,
  counters, the lock);
- the scheduler's CPU per job: its invocations' thread time plus its pools' threads
  (``dispatch_*``, ``pull_*``) over the same invocations; DynamoDB and the job server run
  elsewhere, so none of theirs is in it;
- pickup latency while busy: for every pickup after the first ``capacity`` (the scheduler's
  limit, ``min(MaxInFlight, ExecutorReservedConcurrency)``), the time from the moment the
  job could be taken (it existed and a slot was free: the settle that freed one) to the
  call that took it (Pipelogiq's lease, Priostack's activate, the claim queue's claim), all
  on the sandbox's clock. A job's wait behind the backlog is not pickup latency: with the
  executors full it waits whatever the path;
- $ per million short jobs: ``cost.per_million_jobs`` with these counts, and the model's
  jobs per second per 1,000 concurrent executions (``cost.jobs_per_second_per_thousand``).

``path`` names how deliveries reach executors. ``"scheduler"`` is the scheduler's own: it
pulls, records and invokes one executor per delivery (``self_pull`` pinned off, whatever the
template's default). ``"self-pull"``: an executor that finished a job pulls the next for its
handler itself while pulls come back full, and a full pull makes the scheduler start more
executors (docs/limits.md). Each path is :data:`PATH_SETTINGS`' settings (``SW_*``) over the
template's defaults; the run, the counts and the report (one column per path) are the same.

Besides, per job: DynamoDB reads (the in-flight counts and control reads executors add), and
the most jobs the server saw held at once (taken and not yet settled), which capacity bounds
on either path. The model's jobs per second on the self-pull path is bounded by executor
seconds per job (the scheduler's CPU per job is near zero there); its assumptions are in
:data:`MODEL_ASSUMPTIONS`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from unittest import mock

from .harness import HANDLER, MotoProcess, SandboxProcess, percentile

__all__ = ["MODEL_ASSUMPTIONS", "PATHS", "PATH_SETTINGS", "SETTLE_CALL", "held_at_once", "job_times",
           "measure_backlog", "pickup_while_busy"]

ROOT = Path(__file__).resolve().parent.parent
# The settings each delivery path runs with, beside the template's defaults.
PATH_SETTINGS: dict[str, dict[str, Any]] = {"scheduler": {"self_pull": False}, "self-pull": {"self_pull": True}}
PATHS = tuple(PATH_SETTINGS)
# The call that settles a job, per protocol (its count on the sandbox says when the backlog is done).
SETTLE_CALL = {"pipelogiq": "result", "priostack": "complete", "claimqueue": "result"}
_FUNCTIONS = {"SchedulerFunction": "scheduler", "ExecutorFunction": "executor", "StepsFunction": "steps"}
_SCHEDULER_POOLS = ("dispatch_", "pull_")  # the scheduler's thread pools (runtime/scheduler.py)
# What the model's jobs per second per 1,000 concurrent executions leaves out (printed with it).
MODEL_ASSUMPTIONS = (
    "each job holds an execution for its executor ms (pull, record, run, report and final write); the "
    "scheduler gets its memory's vCPU share and, per job, the CPU measured here (self-pull: its CPU per "
    "executor started over self_pull_max_jobs, the jobs one executor runs under a long backlog); not "
    "limiting, though real: "
    "the job server's own rate limits (Pipelogiq answers 429 past its in-flight limit), Lambda's burst "
    "limits, and DynamoDB: the in-flight index has one partition key (scope) per InstanceId, written twice "
    "a job (record and final), so at ~1,000 WCU/s a partition caps one InstanceId near 500 jobs/s")
_SCHEDULED_EVENT = {"source": "aws.events", "detail-type": "Scheduled Event",
                    "resources": ["arn:aws:events:us-east-1:123456789012:rule/bench-tick"], "detail": {}}


# -- what the sandbox saw -------------------------------------------------------------

def job_times(protocol: str, job: dict[str, Any]) -> tuple[float | None, float | None, list[float]]:
    """(available, taken, settles) of one record of the sandbox's ``/_admin/jobs``, on its clock:
    when the job could first be taken, the call that first took it, and each accepted settle."""
    if protocol == "pipelogiq":
        history = job.get("history", [])
        created = [e["at"] for e in history if e["event"] == "execution_created"]
        leased = [e["at"] for e in history if e["event"] == "lease_acquired"]
        settles = [e["at"] for e in history if e["event"] == "result_applied"]
        return (created[0] if created else None), (leased[0] if leased else None), settles
    if protocol == "priostack":
        activated = [a["at"] for a in job.get("activations", []) if not a.get("duplicate")]
        settles = [c["at"] for c in job.get("calls", []) if c.get("action") == "complete" and c.get("applied")]
        return job.get("created_at"), (activated[0] if activated else None), settles
    history = job.get("history", [])
    claimed = [e["at"] for e in history if e["event"] == "claim"]
    settles = [e["at"] for e in history if e["event"] == "result" and e.get("accepted")]
    return job.get("created_at"), (claimed[0] if claimed else None), settles


def pickup_while_busy(times: list[tuple[float | None, float | None, list[float]]], capacity: int) -> list[float]:
    """Seconds from "could be taken" to taken, for each pickup after the first ``capacity``.

    With ``capacity`` slots, the (k+1)-th pickup needs k+1-capacity settles before it: the
    slot it takes frees at the (k+1-capacity)-th settle. It could be taken from then, or from
    its creation if later."""
    taken = sorted((t, t if available is None else available) for available, t, _ in times if t is not None)
    settles = sorted(s for _, _, done in times for s in done)
    waits = []
    for k, (at, available) in enumerate(taken):
        if k < capacity or k - capacity >= len(settles):
            continue
        waits.append(max(0.0, at - max(available, settles[k - capacity])))
    return waits


def held_at_once(times: list[tuple[float | None, float | None, list[float]]]) -> int:
    """The most jobs taken and not yet settled at one moment, on the sandbox's clock (at a
    tie the settle counts first: the slot it frees is the one the take uses)."""
    edges: list[tuple[float, int]] = []
    for _, taken, settles in times:
        if taken is None:
            continue
        edges.append((taken, 1))
        after = [s for s in settles if s >= taken]
        if after:
            edges.append((min(after), -1))
    peak = current = 0
    for _, delta in sorted(edges):
        current += delta
        peak = max(peak, current)
    return peak


# -- the emulated stack ---------------------------------------------------------------

def _load_entry(fn: str) -> Callable[[Any, Any], Any]:
    """``functions/<fn>/app.py``'s ``lambda_handler``, imported by file as Lambda imports it."""
    spec = importlib.util.spec_from_file_location(f"sw_bench_{fn}_app", ROOT / "functions" / fn / "app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    entry: Callable[[Any, Any], Any] = module.lambda_handler
    return entry


def _threads_cpu(prefixes: tuple[str, ...]) -> dict[int, float]:
    """CPU seconds so far of each live thread whose name starts with one of ``prefixes``."""
    cpu = {}
    for thread in threading.enumerate():
        if thread.ident is None or not thread.name.startswith(prefixes):
            continue
        try:
            cpu[thread.ident] = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (OSError, ProcessLookupError):  # it ended meanwhile
            continue
    return cpu


class InvocationMeter:
    """Wraps each function's entry point: invocations per function, their wall time, and the
    scheduler's CPU (its invocation's thread and its pools' threads, over the invocation)."""

    def __init__(self) -> None:
        self.invocations: Counter[str] = Counter()
        self.wall_s: dict[str, float] = dict.fromkeys(_FUNCTIONS, 0.0)
        self.scheduler_cpu_s = 0.0
        self.ticks: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def wrap(self, logical: str, entry: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        scheduler = logical == "SchedulerFunction"

        def counted(event: Any, context: Any) -> Any:
            with self._lock:
                self.invocations[logical] += 1
            pools = _threads_cpu(_SCHEDULER_POOLS) if scheduler else {}
            cpu, started = time.thread_time(), time.perf_counter()
            try:
                result = entry(event, context)
            finally:
                took = time.perf_counter() - started
                spent = time.thread_time() - cpu
                if scheduler:
                    after = _threads_cpu(_SCHEDULER_POOLS)
                    spent += sum(value - pools.get(ident, 0.0) for ident, value in after.items())
                with self._lock:
                    self.wall_s[logical] += took
                    if scheduler:
                        self.scheduler_cpu_s += spent
            if scheduler and isinstance(result, dict):
                with self._lock:
                    self.ticks.append(result)
            return result

        return counted


class EntryStack:
    """The stack's functions on their own entry points in moto, against ``sandbox``."""

    def __init__(self, sandbox: SandboxProcess, *, dynamodb: MotoProcess | None, settings: dict[str, Any]) -> None:
        import boto3
        from botocore.config import Config

        from serverless_worker import awsclients
        from serverless_worker.local.aws import REGION, EmbeddedAws
        from serverless_worker.local.moto_lambda import dummy_zip
        from serverless_worker.local.table import create_state_table
        from serverless_worker.local.template import load_template, param_default, template_path
        from serverless_worker.runtime.entry import reset_services

        from .write_units import SessionWriteMeter

        self._exit = ExitStack()
        self.meter = InvocationMeter()
        try:
            self.aws = EmbeddedAws.start(pool_size=64, state_table=dynamodb is None)
            self._exit.callback(self.aws.close)
            if dynamodb is None:
                reader, self.table, dynamodb_url = self.aws.dynamodb, self.aws.table_name, self.aws.endpoint
            else:
                reader, dynamodb_url = dynamodb.dynamodb, dynamodb.endpoint
                self.table = create_state_table(reader, template=template_path()).name
                self._exit.callback(reader.delete_table, TableName=self.table)
            template = load_template()
            globals_ = template.get("Globals", {}).get("Function", {})

            def prop(logical: str, name: str, default: Any) -> Any:
                props = template["Resources"][logical]["Properties"]
                return param_default(template, props.get(name, globals_.get(name, default)))

            self.scheduler_timeout = float(prop("SchedulerFunction", "Timeout", 3))
            self.memory_mb = {logical: int(prop(logical, "MemorySize", 128)) for logical in _FUNCTIONS}
            session = boto3.session.Session(aws_access_key_id="local", aws_secret_access_key="local",
                                            region_name=REGION)
            config = Config(read_timeout=self.scheduler_timeout + 30, retries={"max_attempts": 0})
            self.lambda_client = session.client("lambda", endpoint_url=self.aws.endpoint, config=config)
            role = session.client("iam", endpoint_url=self.aws.endpoint).create_role(
                RoleName=f"sw-bench-{uuid.uuid4().hex[:6]}", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
            params = {name: spec.get("Default") for name, spec in template.get("Parameters", {}).items()}
            env = {
                "AWS_DEFAULT_REGION": REGION, "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local",
                "AWS_ENDPOINT_URL": self.aws.endpoint, "AWS_ENDPOINT_URL_DYNAMODB": dynamodb_url,
                "SW_PROTOCOL": sandbox.protocol, "SW_BASE_URL": sandbox.url, "SW_API_KEY": sandbox.credential,
                "SW_HANDLERS": HANDLER, "SW_HANDLER_MODULE": str(Path(__file__).with_name("bench_handler.py")),
                "SW_INSTANCE_ID": f"bench-{uuid.uuid4().hex[:8]}", "SW_TABLE_NAME": self.table,
                "SW_BATCH_SIZE": str(params["BatchSize"]), "SW_MAX_IN_FLIGHT": str(params["MaxInFlight"]),
                "SW_POLL_WINDOW_SECONDS": str(params["PollWindowSeconds"]),
                "SW_LEASE_RENEW_SECONDS": str(params["LeaseRenewSeconds"]),
                "SW_EXECUTOR_RESERVED_CONCURRENCY": str(params["ExecutorReservedConcurrency"]),
                "SW_DISPATCH_TIMEOUT_SECONDS": "420", "SW_LIVENESS": str(params["Liveness"]),
                "SW_SELF_PULL": str(params["SelfPull"]),
                "SW_LOG_LEVEL": "ERROR", "POWERTOOLS_LOG_LEVEL": "ERROR",
                "POWERTOOLS_SERVICE_NAME": "serverless-worker-bench",
                "POWERTOOLS_METRICS_NAMESPACE": "ServerlessWorker",
            }
            env.update({f"SW_{key.upper()}": json.dumps(value) if isinstance(value, dict | list) else str(value)
                        for key, value in settings.items()})
            self._exit.enter_context(mock.patch.dict(os.environ, env))
            for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_LAMBDA_FUNCTION_NAME"):
                os.environ.pop(name, None)  # restored with the rest when the stack closes
            self.env = env
            # Every runtime client is built anew, on a session that prices its DynamoDB writes.
            awsclients.renew_clients()
            reset_services()
            self._exit.callback(reset_services)
            self._exit.callback(awsclients.renew_clients)
            self.writes = SessionWriteMeter(reader, self.table)
            self.writes.attach(awsclients.shared_session().events)
            self._exit.callback(self.writes.detach)

            entries = {logical: self.meter.wrap(logical, _load_entry(fn)) for logical, fn in _FUNCTIONS.items()}
            self.aws.install_state_machine({"StepsFunction": entries["StepsFunction"]})
            self.names: dict[str, str] = {}
            for logical in ("SchedulerFunction", "ExecutorFunction"):
                name = f"{logical}-{uuid.uuid4().hex[:6]}"
                self.aws.lambdas.register(name, entries[logical])
                self.lambda_client.create_function(
                    FunctionName=name, Runtime="python3.13", Role=role,
                    Handler=template["Resources"][logical]["Properties"]["Handler"], Code={"ZipFile": dummy_zip()},
                    Timeout=int(prop(logical, "Timeout", 3)), MemorySize=self.memory_mb[logical])
                self.names[logical] = name
            os.environ["SW_EXECUTOR_FUNCTION_NAME"] = self.names["ExecutorFunction"]
            os.environ["SW_STATE_MACHINE_ARN"] = self.aws.state_machine_arn or ""
            from serverless_worker.settings import load_settings

            loaded = load_settings()
            self.schedule_seconds = float(loaded.schedule_seconds)
            self.capacity = min(loaded.max_in_flight, loaded.executor_reserved_concurrency or loaded.max_in_flight)
            self.self_pull_max_jobs = loaded.self_pull_max_jobs
        except BaseException:
            self._exit.close()
            raise
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self.errors: list[str] = []

    # -- the schedule ------------------------------------------------------------------
    def start_schedule(self) -> None:
        """Invoke the scheduler now and every schedule period after, one at a time."""
        def loop() -> None:
            due = time.monotonic()
            while not self._stop.is_set():
                self._tick()
                due += self.schedule_seconds
                while due < time.monotonic():  # a tick that ran past its period: the missed one is dropped
                    due += self.schedule_seconds
                if self._stop.wait(due - time.monotonic()):
                    return

        self._ticker = threading.Thread(target=loop, name="bench-schedule", daemon=True)
        self._ticker.start()

    def _tick(self) -> None:
        try:
            answer = self.lambda_client.invoke(FunctionName=self.names["SchedulerFunction"],
                                               Payload=json.dumps(_SCHEDULED_EVENT).encode())
            payload = json.loads(answer["Payload"].read() or b"null")
            if answer.get("FunctionError"):
                self.errors.append(f"tick: {payload.get('errorType')}: {payload.get('errorMessage')}"[:300])
        except Exception as err:
            self.errors.append(f"tick: {type(err).__name__}: {err}"[:300])
            self._stop.wait(1.0)

    def stop_schedule(self, timeout: float) -> bool:
        """No more ticks; wait for the running one to end. Whether it did."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout)
            return not self._ticker.is_alive()
        return True

    def close(self) -> None:
        try:
            self.aws.lambdas.drain(30.0)
        except AssertionError as err:
            self.errors.append(str(err)[:300])
        self.errors += [f"executor: {type(e).__name__}: {e}"[:300] for e in self.aws.lambdas.background_errors[:5]]
        self._exit.close()


# -- one run -----------------------------------------------------------------------------

def _wait_settled(sandbox: SandboxProcess, label: str, count: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sandbox.calls().get(label, 0) >= count:
            return True
        time.sleep(0.1)
    return False


def measure_backlog(protocol: str, *, jobs: int, path: str = "scheduler", dynamodb: MotoProcess | None = None,
                    settings: dict[str, Any] | None = None, timeout: float | None = None,
                    executor_ms_alone: float | None = None) -> dict[str, Any]:
    """Drain a backlog of ``jobs`` on ``protocol``'s sandbox through ``path``; the figures in
    the module's docstring. ``settings`` (``SW_*`` without the prefix) override the template's
    defaults (a test's short poll window). ``timeout`` bounds the wait for the last settle
    (by default 2 minutes plus half a second a job: a loaded 2-core machine drains a few a
    second). ``executor_ms_alone``, a lone executor run's mean
    (``idle.measure_executor_alone``), prices executor time as Lambda would bill it rather
    than as it stretched on this machine's shared cores."""
    if path not in PATH_SETTINGS:
        raise ValueError(f"unknown delivery path {path!r}; known: {', '.join(PATHS)}")
    sandbox = SandboxProcess(protocol)
    try:
        sandbox.seed([{"n": index} for index in range(jobs)])
        stack = EntryStack(sandbox, dynamodb=dynamodb, settings={**PATH_SETTINGS[path], **(settings or {})})
        try:
            started = time.time()
            stack.start_schedule()
            drained = _wait_settled(sandbox, SETTLE_CALL[protocol], jobs,
                                    timeout if timeout is not None else 120.0 + 0.5 * jobs)
        finally:
            ended = stack.stop_schedule(stack.scheduler_timeout + 30)
            stack.close()
        records = sandbox.admin.jobs()
        calls = sandbox.calls()
    finally:
        sandbox.stop()
    return _figures(protocol, path, jobs, stack, records, calls, started=started, drained=drained,
                    ticks_ended=ended, executor_ms_alone=executor_ms_alone)


def _figures(protocol: str, path: str, jobs: int, stack: EntryStack, records: list[dict[str, Any]],
             calls: dict[str, int], *, started: float, drained: bool, ticks_ended: bool,
             executor_ms_alone: float | None) -> dict[str, Any]:
    from . import cost

    times = [job_times(protocol, job) for job in records]
    settles = [len(done) for _, _, done in times]
    last_settle = max((s for _, _, done in times for s in done), default=None)
    seconds = (last_settle - started) if last_settle is not None else None
    meter, writes = stack.meter, stack.writes
    invocations = dict(meter.invocations)
    executor_runs = invocations.get("ExecutorFunction", 0)
    pickup = pickup_while_busy(times, stack.capacity)
    ledger_table = writes.units["table:delivery"] / jobs
    ledger_index = writes.units["index:delivery"] / jobs
    other = sum(v for k, v in writes.units.items() if not k.endswith(":delivery")) / jobs
    scheduler_wall = meter.wall_s["SchedulerFunction"]
    # A lone run's mean prices one invocation of one job; an executor that keeps pulling runs
    # several jobs an invocation, each costing it about a lone run (its pull replaces the
    # scheduler's), so that path is priced per job.
    self_pull = bool(PATH_SETTINGS[path].get("self_pull"))
    if executor_ms_alone is None:
        executor_ms = 1000 * meter.wall_s["ExecutorFunction"] / jobs
    elif self_pull:
        executor_ms = executor_ms_alone
    else:
        executor_ms = executor_ms_alone * executor_runs / jobs
    memory = stack.memory_mb
    scheduler_gb_s = scheduler_wall * memory["SchedulerFunction"] / 1024 / jobs
    scheduler_cpu = meter.scheduler_cpu_s / jobs
    priced = cost.per_million_jobs(
        protocol=protocol, dynamodb={"by_operation_per_job": {}, "reads_per_job": writes.reads / jobs},
        executor_ms=executor_ms, executor_memory_mb=memory["ExecutorFunction"],
        steps_memory_mb=memory["StepsFunction"], long_path={"transitions": 0, "lambda_invocations": 0},
        ledger_units=(ledger_table + other, ledger_index),
        lambda_requests_per_job=sum(invocations.values()) / jobs, scheduler_gb_seconds_per_job=scheduler_gb_s)
    # The model's scheduler work per job. The scheduler path: what it spent per job here. The
    # self-pull path: the scheduler starts executors, not jobs; under a long backlog each one
    # runs up to self_pull_max_jobs jobs, so its work per job is its work per executor started
    # (this run's, tick overheads included) over that. A short backlog (jobs / capacity per
    # executor here) says less about that steady state than the cap does.
    per_start = meter.scheduler_cpu_s / max(1, executor_runs)
    model_scheduler_cpu = per_start / stack.self_pull_max_jobs if self_pull else scheduler_cpu
    model = cost.jobs_per_second_per_thousand(
        executor_ms_per_job=executor_ms, scheduler_cpu_s_per_job=model_scheduler_cpu,
        scheduler_memory_mb=memory["SchedulerFunction"])
    p50, p95 = percentile(pickup, 50), percentile(pickup, 95)
    errors = list(stack.errors) + [e for tick in meter.ticks for e in tick.get("errors", [])]
    return {
        "protocol": protocol, "path": path, "jobs": jobs, "capacity": stack.capacity,
        "drained": drained, "ticks_ended": ticks_ended,
        "settled_once": sum(1 for n in settles if n == 1),
        "settled_twice_or_more": sum(1 for n in settles if n > 1),
        "unsettled": sum(1 for n in settles if n == 0) + max(0, jobs - len(records)),
        "seconds": seconds,
        "jobs_per_s": jobs / seconds if seconds else None,
        "invocations": invocations,
        "invocations_per_job": sum(invocations.values()) / jobs,
        "ledger_writes_per_job": writes.requests["delivery"] / jobs,
        "ledger_units_per_job": ledger_table + ledger_index,
        "ledger_table_units_per_job": ledger_table, "ledger_index_units_per_job": ledger_index,
        "other_units_per_job": other,
        "reads_per_job": writes.reads / jobs,
        "most_held_at_once": held_at_once(times),
        "scheduler_cpu_s_per_job": scheduler_cpu,
        "scheduler_billed_s": scheduler_wall,
        "executor_ms_per_job": executor_ms,
        "executor_ms_from": ("this run" if executor_ms_alone is None
                             else "alone, per job" if self_pull else "alone, per invocation"),
        "pickup_busy_s": {"p50": p50, "p95": p95, "count": len(pickup),
                          "mean": statistics.fmean(pickup) if pickup else None},
        "usd_per_million_short_jobs": priced["short_path_usd"],
        "usd_breakdown": priced["short_path"],
        "per_1000_concurrent": {**model, "assumptions": MODEL_ASSUMPTIONS,
                                "scheduler_cpu_s_per_executor": per_start,
                                "scheduler_cpu_s_per_job": model_scheduler_cpu,
                                "jobs_per_executor": stack.self_pull_max_jobs if self_pull else 1},
        "ticks": len(meter.ticks),
        "pulls": sum(int(t.get("pulls", 0)) for t in meter.ticks),
        "calls_per_job": {name: count / jobs for name, count in sorted(calls.items())},
        "errors": errors[:5],
    }
