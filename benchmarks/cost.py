"""(f) The cost model: per million jobs from the measured counts, and the fixed monthly cost
at zero jobs for each way of keeping the worker live, next to the smallest always-on worker.

Pure arithmetic on the benchmark's measurements and template.yaml's defaults; the prices
are below with their sources. List prices in us-east-1, on-demand, without free tiers
(the always-free tier is shown apart: it belongs to the account, not to this stack).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = [
    "HOURS_PER_MONTH",
    "LONG_PATH_STATES",
    "PRICES",
    "PRICES_AS_OF",
    "Price",
    "always_on_alternatives",
    "fixed_monthly",
    "idle_calls_per_hour",
    "jobs_per_second_per_thousand",
    "long_path_transitions",
    "per_million_jobs",
]

PRICES_AS_OF = "2026-11-29"
HOURS_PER_MONTH = 730  # AWS's own monthly convention
# Lambda gives a function one full vCPU at 1,769 MB and a share in proportion below it
# (https://docs.aws.amazon.com/lambda/latest/dg/configuration-memory.html).
FULL_VCPU_MB = 1769


@dataclass(frozen=True)
class Price:
    usd: float
    unit: str
    source: str


PRICES: dict[str, Price] = {
    "lambda_gb_second": Price(0.0000166667, "GB-second, x86, first 6B GB-s/month",
                              "https://aws.amazon.com/lambda/pricing/"),
    "lambda_gb_second_arm": Price(0.0000133334, "GB-second, arm64, first 7.5B GB-s/month",
                                  "https://aws.amazon.com/lambda/pricing/"),
    "lambda_request": Price(0.20 / 1e6, "request", "https://aws.amazon.com/lambda/pricing/"),
    "sfn_transition": Price(0.025 / 1000, "state transition, Standard workflows",
                            "https://aws.amazon.com/step-functions/pricing/"),
    "dynamodb_wru": Price(0.625 / 1e6, "write request unit, on-demand (since 2024-11-01)",
                          "https://aws.amazon.com/dynamodb/pricing/on-demand/"),
    "dynamodb_rru": Price(0.125 / 1e6, "read request unit, on-demand (since 2024-11-01)",
                          "https://aws.amazon.com/dynamodb/pricing/on-demand/"),
    "cloudwatch_alarm": Price(0.10, "standard-resolution alarm-month",
                              "https://aws.amazon.com/cloudwatch/pricing/"),
    "cloudwatch_metric": Price(0.30, "custom metric-month (EMF metrics are custom metrics)",
                               "https://aws.amazon.com/cloudwatch/pricing/"),
    "cloudwatch_logs_gb": Price(0.50, "GB of logs ingested", "https://aws.amazon.com/cloudwatch/pricing/"),
    "xray_trace": Price(5.00 / 1e6, "trace recorded", "https://aws.amazon.com/xray/pricing/"),
    "secret_month": Price(0.40, "secret-month", "https://aws.amazon.com/secrets-manager/pricing/"),
    "eventbridge_schedule_rule": Price(0.0, "scheduled rule invocation on the default bus (no charge)",
                                       "https://aws.amazon.com/eventbridge/pricing/"),
    "ec2_t4g_nano_hour": Price(0.0042, "t4g.nano Linux on-demand instance-hour (2 vCPU burst, 0.5 GiB)",
                               "https://aws.amazon.com/ec2/pricing/on-demand/"),
    "ebs_gp3_gb_month": Price(0.08, "gp3 GB-month", "https://aws.amazon.com/ebs/pricing/"),
    "public_ipv4_hour": Price(0.005, "public IPv4 address-hour (since 2024-02-01)",
                              "https://aws.amazon.com/vpc/pricing/"),
    "fargate_vcpu_hour_arm": Price(0.03238, "Fargate Linux/ARM vCPU-hour",
                                   "https://aws.amazon.com/fargate/pricing/"),
    "fargate_gb_hour_arm": Price(0.00356, "Fargate Linux/ARM GB-hour", "https://aws.amazon.com/fargate/pricing/"),
}

# Always-free tier per account and month (shown apart, never subtracted per job).
FREE_TIER = {"lambda_gb_seconds": 400_000, "lambda_requests": 1_000_000, "cloudwatch_alarms": 10,
             "cloudwatch_metrics": 10, "xray_traces": 100_000, "sfn_transitions": 4_000}

# The happy path of functions/statemachine/worker.asl.json, state by state, for a job of
# ``slices`` run slices and ``renewals`` renew cycles: every state entered is one billed
# transition (Parallel and Succeed states included).
LONG_PATH_STATES = {
    "once": ["Acquire", "Acquired?", "Work", "Mode?", "RunEnded", "RenewEnded", "Report", "Handover?",
             "Ack", "Done"],
    "per_slice": ["RunSlice", "Continue?"],
    "per_renewal": ["WaitToRenew", "Renew", "KeepRenewing?"],
    "lambda_once": ["Acquire", "Report", "Ack"],
}

# Index writes per ledger write, when (h) did not measure them. The in-flight index holds keys
# only, so only writes that add, move or remove an index key cost an index write: record puts
# one and a final state removes it. A run that pushes its deadline out (start_run, take_over,
# renew_deadline) writes the item's own ``due`` and leaves the key where it is (state/store.py);
# mark_dispatch_failed moves it to now (a delete plus a put). Status-only changes cost none.
GSI_WRITES = {"record_delivery": 1, "mark_dispatched": 0, "mark_dispatch_failed": 2, "start_run": 0,
              "take_over": 0, "store_outcome": 0, "mark_reported": 0, "mark_acknowledged": 1,
              "mark_handed_back": 1, "mark_discarded": 1, "renew_deadline": 0}
_LEDGER_WRITES = frozenset(GSI_WRITES) | {"save_checkpoint"}


def long_path_transitions(asl: dict[str, Any], slices: int = 1, renewals: int = 1) -> dict[str, int]:
    """Billed transitions and steps-Lambda invocations of one long-running job, from the ASL.

    Raises when a state of the counted path is missing, so the model cannot drift from the file.
    """
    names: set[str] = set()

    def collect(states: dict[str, Any]) -> None:
        for name, state in states.items():
            names.add(name)
            for branch in state.get("Branches", []):
                collect(branch["States"])

    collect(asl["States"])
    counted = {n for group in LONG_PATH_STATES.values() for n in group}
    missing = sorted(counted - names)
    if missing:
        raise ValueError(f"worker.asl.json no longer has the states the cost model counts: {missing}")
    transitions = (len(LONG_PATH_STATES["once"]) + slices * len(LONG_PATH_STATES["per_slice"])
                   + renewals * len(LONG_PATH_STATES["per_renewal"]))
    lambdas = len(LONG_PATH_STATES["lambda_once"]) + slices + renewals
    return {"transitions": transitions, "lambda_invocations": lambdas, "slices": slices, "renewals": renewals}


def _billed_seconds(seconds: float) -> float:
    return math.ceil(max(seconds, 0.001) * 1000) / 1000  # 1 ms granularity


def per_million_jobs(*, protocol: str, dynamodb: dict[str, Any], executor_ms: float, executor_memory_mb: int,
                     steps_memory_mb: int, long_path: dict[str, int],
                     ledger_units: tuple[float, float] | None = None, lambda_requests_per_job: float = 1.0,
                     scheduler_gb_seconds_per_job: float = 0.0) -> dict[str, Any]:
    """Cost of a million short-path jobs (handler time excluded) and of a million long-running ones.

    ``ledger_units`` is (h)'s measure of the ledger's (table, index) write units a job; without
    it they are modelled from the throughput run's writes and :data:`GSI_WRITES`. A backlog
    run (``benchmarks/backlog.py``) gives its measured Lambda invocations a job and the
    scheduler's billed GB-seconds a job; by default one executor invocation a job, and the
    scheduler counted in the fixed monthly cost instead."""
    million = 1e6
    gb = executor_memory_mb / 1024
    lambda_requests = million * lambda_requests_per_job * PRICES["lambda_request"].usd
    lambda_compute = million * (_billed_seconds(executor_ms / 1000) * gb
                                + scheduler_gb_seconds_per_job) * PRICES["lambda_gb_second"].usd
    units = int(dynamodb.get("write_units_per_ledger_write") or 1)
    by_op = dynamodb.get("by_operation_per_job", {})
    base_wru = sum(count * (units if op in _LEDGER_WRITES else 1) for op, count in by_op.items()
                   if op in _LEDGER_WRITES or op == "add_counters")
    gsi_wru = sum(count * GSI_WRITES.get(op, 0) for op, count in by_op.items())
    if ledger_units is not None:
        table, index = ledger_units
        base_wru += table - sum(count * units for op, count in by_op.items() if op in _LEDGER_WRITES)
        gsi_wru = index
    rru = dynamodb.get("reads_per_job", 0.0)
    dynamo = million * ((base_wru + gsi_wru) * PRICES["dynamodb_wru"].usd + rru * PRICES["dynamodb_rru"].usd)
    short = lambda_requests + lambda_compute + dynamo
    # Long-running path: the same ledger, plus the execution's transitions and steps invocations
    # (each step taken to cost what an executor run costs at light load, an upper bound).
    steps_gb = steps_memory_mb / 1024
    sfn = million * long_path["transitions"] * PRICES["sfn_transition"].usd
    step_usd = (PRICES["lambda_request"].usd
                + _billed_seconds(executor_ms / 1000) * steps_gb * PRICES["lambda_gb_second"].usd)
    steps = million * long_path["lambda_invocations"] * step_usd
    return {
        "protocol": protocol,
        "short_path_usd": short,
        "short_path": {"lambda_requests_usd": lambda_requests, "lambda_gb_seconds_usd": lambda_compute,
                       "dynamodb_usd": dynamo, "wru_per_job": base_wru + gsi_wru, "gsi_wru_per_job": gsi_wru,
                       "rru_per_job": rru, "executor_ms": executor_ms,
                       "executor_memory_mb": executor_memory_mb},
        "long_path_usd": sfn + steps + dynamo,
        "long_path": {"step_functions_usd": sfn, "steps_lambda_usd": steps, "dynamodb_usd": dynamo,
                      **long_path},
    }


def jobs_per_second_per_thousand(*, executor_ms_per_job: float, scheduler_cpu_s_per_job: float,
                                  scheduler_memory_mb: int, concurrency: int = 1000) -> dict[str, Any]:
    """The model's jobs per second for ``concurrency`` concurrent executions, short jobs.

    Assumptions: each job holds an execution for ``executor_ms_per_job`` (measured: Lambda
    bills and counts concurrency for that long); the one scheduler (reserved concurrency 1)
    runs on its memory's share of a vCPU (``FULL_VCPU_MB``) and spends
    ``scheduler_cpu_s_per_job`` of a whole one per job, as measured on the bench machine,
    taken to be as fast as Lambda's; DynamoDB, the job server and Lambda's async invoke
    (burst limits) are taken not to limit. The smaller bound is the model's rate."""
    executors = concurrency / (executor_ms_per_job / 1000) if executor_ms_per_job > 0 else math.inf
    share = min(1.0, scheduler_memory_mb / FULL_VCPU_MB)
    scheduler = share / scheduler_cpu_s_per_job if scheduler_cpu_s_per_job > 0 else math.inf
    return {"jobs_per_s": min(executors, scheduler), "executor_bound": executors, "scheduler_bound": scheduler,
            "bound_by": "executors" if executors <= scheduler else "scheduler", "concurrency": concurrency,
            "scheduler_vcpu_share": share}


def idle_calls_per_hour(protocol: str, *, liveness: str, window_s: float, schedule_minutes: float,
                        heartbeat_interval_s: float = 15.0, offline_after_s: float = 45.0,
                        long_poll_s: float = 20.0, backoff_first_s: float = 0.2,
                        backoff_cap_s: float | None = None, long_poll_held: bool = True) -> dict[str, float]:
    """Job-server calls per hour at zero jobs (pulls and heartbeats), from the scheduler's own
    arithmetic (serverless_worker.runtime.polling): what a liveness mode costs the server.

    ``long_poll_held=False`` prices a Pipelogiq server that answers an empty pull at once
    (its waitSeconds ignored): the scheduler then backs off as for a protocol without a
    long poll, up to the protocol's ``empty_poll_backoff``."""
    from serverless_worker.protocols import protocol_class
    from serverless_worker.runtime.polling import idle_polls, idle_window

    heartbeats = protocol == "pipelogiq"  # the only one whose worker heartbeats by default
    window = idle_window(liveness, window=window_s, schedule_seconds=schedule_minutes * 60,
                         heartbeat_interval=heartbeat_interval_s if heartbeats else None,
                         offline_after=offline_after_s if heartbeats else None)
    cap = backoff_cap_s or protocol_class(protocol).empty_poll_backoff
    beats = 1 + math.floor(window / heartbeat_interval_s) + (liveness == "continuous") if heartbeats else 0
    if protocol_class(protocol).long_poll and long_poll_held:
        # one long poll at a time, each cut at the next heartbeat
        pulls = idle_polls(window, first=backoff_first_s, cap=cap,
                           long_poll_seconds=min(long_poll_s, heartbeat_interval_s))
    else:
        pulls = idle_polls(window, first=backoff_first_s, cap=cap)
    ticks_per_hour = 60 / schedule_minutes
    return {"window_s": window, "pulls": pulls * ticks_per_hour, "heartbeats": beats * ticks_per_hour}


def fixed_monthly(*, idle: dict[str, Any], schedule_minutes: float, window_s: float, scheduler_memory_mb: int,
                  alarms: int, heartbeat_interval_s: float = 15.0, offline_after_s: float = 45.0,
                  metrics_at_idle: int = 1, log_kb_per_tick: float = 1.0, arm64: bool = False,
                  secret: bool = True, tracing: bool = True,
                  idle_continuous: dict[str, Any] | None = None) -> dict[str, Any]:
    """Monthly cost at zero jobs for each liveness mode (``SW_LIVENESS``), from one measured
    idle tick of the while-work mode (its setup, one round of pulls; its CPU time stretched
    to the scheduler's share of a vCPU).

    Each mode bills that tick plus the window it stays without work, as the scheduler
    computes it (``runtime/polling.py``): none for while-work, the heartbeat window for
    continuous (it closes with a heartbeat), the poll window for full-window. ``secret``
    (the key in Secrets Manager, or else in an SSM SecureString: no charge) and ``tracing``
    (X-Ray on the scheduler) are the template's ``ApiKeySecretArn`` / ``ApiKeyParameterName``
    and ``SchedulerTracing``. ``idle_continuous``, a measured idle tick of the continuous mode,
    replaces that mode's estimate. ``metrics_at_idle``: the custom metrics an idle tick publishes
    (``SuccessfulPolls``: ticks are counted by Lambda's own free Invocations metric); each is a
    metric-month once published.
    """
    from serverless_worker.runtime.polling import LIVENESS_MODES, idle_window

    ticks = HOURS_PER_MONTH * 60 / schedule_minutes
    reads_per_tick = float(idle.get("reads", 0))
    writes_per_tick = float(idle.get("writes", 0))
    # The measured tick ran on a whole CPU; at a smaller share its CPU time stretches.
    share = min(1.0, scheduler_memory_mb / FULL_VCPU_MB)

    def stretched(tick: dict[str, Any]) -> float:
        return float(tick.get("duration_s", 1.0)) + float(tick.get("cpu_s", 0.0)) * (1 / share - 1)

    tick_s = stretched(idle)
    what = {
        "full-window": f"every {schedule_minutes:g} min a {window_s:g} s window: pulls and heartbeats "
                       "all the time; a job waits at most the gap plus one back-off",
        "continuous": "heartbeats until the silence to the next tick stays under {offline:g} s, then one "
                      "more: online all the time; pulls at full speed only while there is work",
        "while-work": "one round of pulls, then the tick ends: online only while there is work; a job "
                      f"waits up to {schedule_minutes:g} min",
    }
    common = {
        "alarms_usd": alarms * PRICES["cloudwatch_alarm"].usd,
        "custom_metrics_usd": metrics_at_idle * PRICES["cloudwatch_metric"].usd,
        "logs_usd": ticks * log_kb_per_tick / 1024 / 1024 * PRICES["cloudwatch_logs_gb"].usd,
        "xray_usd": ticks * PRICES["xray_trace"].usd if tracing else 0.0,
        "secret_usd": PRICES["secret_month"].usd if secret else 0.0,
        "schedule_usd": ticks * PRICES["eventbridge_schedule_rule"].usd,
        "lambda_requests_usd": ticks * PRICES["lambda_request"].usd,
        "dynamodb_usd": ticks * (reads_per_tick * PRICES["dynamodb_rru"].usd
                                 + writes_per_tick * PRICES["dynamodb_wru"].usd),
    }
    common_total = sum(common.values())
    free_xray = max(0.0, ticks - FREE_TIER["xray_traces"]) * PRICES["xray_trace"].usd if tracing else 0.0
    free_common = (common["secret_usd"] + common["logs_usd"] + common["dynamodb_usd"] + free_xray
                   + max(0, alarms - FREE_TIER["cloudwatch_alarms"]) * PRICES["cloudwatch_alarm"].usd)
    gb = scheduler_memory_mb / 1024
    gb_second = PRICES["lambda_gb_second_arm" if arm64 else "lambda_gb_second"].usd
    scheduler = {"memory_mb": scheduler_memory_mb, "arm64": arm64, "secret": secret, "tracing": tracing,
                 "custom_metrics": metrics_at_idle}
    result: dict[str, Any] = {"ticks_per_month": ticks, "common": common, "modes": {}, "scheduler": scheduler}
    for mode in LIVENESS_MODES:
        window = idle_window(mode, window=window_s, schedule_seconds=schedule_minutes * 60,
                             heartbeat_interval=heartbeat_interval_s, offline_after=offline_after_s)
        billed = window_s if mode == "full-window" else tick_s + window
        if mode == "continuous" and idle_continuous:
            billed = stretched(idle_continuous)
        seconds = ticks * _billed_seconds(billed)
        compute = seconds * gb * gb_second
        free_compute = max(0.0, seconds * gb - FREE_TIER["lambda_gb_seconds"]) * gb_second
        result["modes"][mode] = {
            "what": what[mode].format(offline=offline_after_s), "window_s": window,
            "billed_s_per_tick": _billed_seconds(billed), "lambda_gb_seconds": seconds * gb,
            "lambda_compute_usd": compute, "total_usd": compute + common_total,
            "total_with_free_tier_usd": free_compute + free_common,
        }
    return result


def always_on_alternatives() -> dict[str, Any]:
    """The smallest always-on worker a user would run instead, per month (compute and address only)."""
    hours = HOURS_PER_MONTH
    ipv4 = hours * PRICES["public_ipv4_hour"].usd
    ec2 = hours * PRICES["ec2_t4g_nano_hour"].usd + 8 * PRICES["ebs_gp3_gb_month"].usd + ipv4
    task_hour = 0.25 * PRICES["fargate_vcpu_hour_arm"].usd + 0.5 * PRICES["fargate_gb_hour_arm"].usd
    fargate = hours * task_hour + ipv4
    return {
        "ec2_t4g_nano": {"usd": ec2, "what": "t4g.nano on-demand + 8 GB gp3 root volume + public IPv4 "
                                             "(to reach the job server without a NAT gateway)"},
        "fargate_arm_0.25vcpu_0.5gb": {"usd": fargate, "what": "ECS Fargate task, Linux/ARM, 0.25 vCPU, "
                                                                 "0.5 GB, public IPv4"},
    }
