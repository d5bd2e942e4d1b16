"""``python -m benchmarks.run [--quick]``: every benchmark in one run, then the table on
stdout and everything as JSON in ``bench-results/bench.json`` (the table beside it).

Order: the emulated DynamoDB's own write rate; per protocol the throughput pair (minimal
worker, then runtime), the local pair (minimal worker, then the runtime on the local
runner's SQLite state file, as ``serverless-worker local`` runs it), latency, dispatch
rate, an idle tick and lone executor runs, all against moto (a fresh table each) but the
local pair: throughput and dispatch rate against moto's server in a process of its own,
as DynamoDB is remote from Lambda (``--dynamodb embedded`` puts the throughput runtime's
in-process), the others against the embedded one; then the DynamoDB write units; then
per protocol and delivery path a backlog drained through the Lambda entry points; then,
with nothing else running, ``serverless-worker local``'s time to its first pull and the
cold starts (fresh processes); then the cost model, which only does arithmetic.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .harness import PROTOCOLS

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
STEPS = ("throughput", "local", "latency", "dispatch", "idle", "first_pull", "coldstart", "write_units", "backlog")


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small counts: every piece, in two minutes")
    parser.add_argument("--jobs", type=int, help="jobs per protocol for throughput (default 2000; quick 100)")
    parser.add_argument("--concurrency", type=int, help="executors, and minimal-worker runners "
                                                        "(default: the template's reserved concurrency)")
    parser.add_argument("--protocols", nargs="+", choices=PROTOCOLS, default=list(PROTOCOLS))
    parser.add_argument("--dynamodb", choices=("process", "embedded"), default="process",
                        help="the throughput runtime's DynamoDB: moto's server in a process of its own "
                             "(default), or moto embedded in this process, as the local runner has it; "
                             "its CPU per job is measured apart either way")
    parser.add_argument("--backlog-jobs", type=int, help="jobs in the backlog of (i) (default 2000; quick 200)")
    parser.add_argument("--local-rounds", type=int, default=3,
                        help="pairs (minimal worker, then local worker) per protocol for (a'); the median ratio "
                             "is reported (default 3; quick 1)")
    parser.add_argument("--skip", nargs="*", default=[], choices=STEPS, help="leave these measurements out")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "bench.json")
    return parser.parse_args(argv)


def _say(text: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _git() -> str | None:
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=5,
                              check=False)
        return done.stdout.strip()

    try:
        head, dirty = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain")
    except OSError:
        return None
    return f"{head}{'+dirty' if dirty else ''}" if head else None


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    from .rig import template_defaults

    defaults = template_defaults()
    jobs = args.jobs or (100 if args.quick else 2000)
    concurrency = args.concurrency or defaults["reserved_concurrency"]
    started = time.perf_counter()
    meta = {"started": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "quick": args.quick, "jobs": jobs,
            "concurrency": concurrency, "batch_size": defaults["batch_size"],
            "max_in_flight": defaults["max_in_flight"],
            "poll_window_seconds": defaults["poll_window_seconds"],
            "protocols": args.protocols, "dynamodb": args.dynamodb, "cpus": os.cpu_count(), "load_before": _load(),
            "python": platform.python_version(), "commit": _git(), "template": defaults}
    results: dict[str, Any] = {"meta": meta, "throughput": {}, "local": {}, "latency": {}, "dispatch": {},
                               "idle_tick": {},
                               "executor_alone": {}, "errors": []}
    _measure_with_aws(args, results, defaults, jobs=jobs, concurrency=concurrency)
    if "write_units" not in args.skip:
        results["write_units"] = _write_units(args.protocols, jobs=30 if args.quick else 100)
    if "backlog" not in args.skip:
        results["backlog"] = _backlog(args.protocols, results,
                                      jobs=args.backlog_jobs or (200 if args.quick else 2000))
        results["errors"] += [f"backlog {protocol} {path}: {e}" for protocol, by_path in results["backlog"].items()
                              for path, row in by_path.items() for e in row["errors"]]
    if "first_pull" not in args.skip:
        results["first_pull"] = _first_pull(args.protocols, repeat=1 if args.quick else 3)
    if "coldstart" not in args.skip:
        from .coldstart import FUNCTIONS, measure_coldstart

        cases = [(fn, "pipelogiq") for fn in FUNCTIONS]  # the template's default protocol
        if args.quick:
            cases = [("executor", "pipelogiq"), ("scheduler", "pipelogiq")]
        rounds = 2 if args.quick else 5
        _say(f"cold start: {len(cases)} entry points and boto3, {rounds} rounds")
        results["coldstart"] = measure_coldstart(rounds, cases)
    results["cost"] = _cost(results, defaults)
    meta["load_after"] = _load()
    meta["seconds"] = time.perf_counter() - started

    from .report import render, verdicts

    results["verdicts"] = verdicts(results)
    table = render(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")
    args.out.with_suffix(".txt").write_text(table + "\n", encoding="utf-8")
    print(table)
    _say(f"wrote {args.out} in {meta['seconds']:.0f} s")
    return 0


def _measure_with_aws(args: argparse.Namespace, results: dict[str, Any], defaults: dict[str, Any], *,
                      jobs: int, concurrency: int) -> None:
    from serverless_worker.local.aws import EmbeddedAws

    from .dispatch_rate import measure_dispatch_rate
    from .harness import MotoProcess
    from .idle import measure_executor_alone, measure_idle_tick
    from .latency import measure_latency
    from .rig import dynamodb_ceiling
    from .throughput import measure_throughput

    quick, skip = args.quick, set(args.skip)
    shape = {"batch_size": defaults["batch_size"], "max_in_flight": defaults["max_in_flight"],
             "concurrency": concurrency}
    aws = EmbeddedAws.start(pool_size=concurrency + 32)
    dynamodb = MotoProcess(pool_size=concurrency + 32)  # remote, as DynamoDB is from Lambda
    throughput_dynamodb = dynamodb if args.dynamodb == "process" else aws
    try:
        _say("emulated DynamoDB: write rate")
        results["dynamodb_ceiling_writes_per_s"] = dynamodb_ceiling(throughput_dynamodb, threads=concurrency,
                                                                   writes=200 if quick else 400)
        for protocol in args.protocols:
            if "throughput" not in skip:
                _say(f"{protocol}: throughput, {jobs} jobs, minimal worker then runtime")
                result = measure_throughput(throughput_dynamodb, protocol, jobs=jobs, timeout=120.0 if quick else 420.0,
                                            poll_window=defaults["poll_window_seconds"], **shape)
                results["throughput"][protocol] = result.as_dict()
                results["errors"] += result.errors
                _say(f"{protocol}: runtime {result.runtime_jobs_per_s or 0:.1f} jobs/s, "
                     f"minimal {result.minimal_jobs_per_s or 0:.1f} jobs/s")
            if "local" not in skip:
                from .local_throughput import measure_local_throughput

                _say(f"{protocol}: local worker (SQLite state), {jobs} jobs, minimal worker then local, "
                     f"{1 if quick else args.local_rounds} rounds")
                local = measure_local_throughput(protocol, jobs=jobs, timeout=120.0 if quick else 420.0,
                                                 poll_window=defaults["poll_window_seconds"],
                                                 rounds=1 if quick else args.local_rounds, **shape)
                results["local"][protocol] = local
                results["errors"] += local["errors"]
                _say(f"{protocol}: local {local['local_jobs_per_s'] or 0:.1f} jobs/s, "
                     f"minimal {local['minimal_jobs_per_s'] or 0:.1f} jobs/s")
            if "latency" not in skip:
                _say(f"{protocol}: latency")
                results["latency"][protocol] = measure_latency(
                    aws, protocol, jobs=20 if quick else 40, rate=10.0,
                    poll_window=defaults["poll_window_seconds"], **shape)
            if "dispatch" not in skip:
                _say(f"{protocol}: dispatch rate")
                results["dispatch"][protocol] = measure_dispatch_rate(
                    dynamodb, protocol, deliveries=100 if quick else 200, batch_size=defaults["batch_size"])
            if "idle" not in skip:
                _say(f"{protocol}: idle tick, executor alone")
                results["idle_tick"][protocol] = measure_idle_tick(
                    aws, protocol, window=defaults["poll_window_seconds"], **shape)
                if protocol == "pipelogiq":  # the one whose worker heartbeats: a continuous window
                    results["idle_tick_continuous"] = measure_idle_tick(
                        aws, protocol, window=defaults["poll_window_seconds"], liveness="continuous", **shape)
                results["executor_alone"][protocol] = measure_executor_alone(aws, protocol,
                                                                             jobs=5 if quick else 10)
    finally:
        dynamodb.close()
        aws.close()


def _write_units(protocols: list[str], *, jobs: int) -> dict[str, Any]:
    """(h) Write units per short-path job, each protocol on a fresh table, priced on demand."""
    from .cost import PRICES
    from .write_units import measure

    per_unit = PRICES["dynamodb_wru"].usd
    measured = {}
    for protocol in protocols:
        _say(f"{protocol}: DynamoDB write units, {jobs} jobs")
        row = measure(protocol, jobs=jobs)
        row["usd_per_million_units"] = per_unit * 1e6
        row["usd_per_million_jobs"] = row["ledger_units_per_job"] * per_unit * 1e6
        measured[protocol] = row
    return measured


def _backlog(protocols: list[str], results: dict[str, Any], *, jobs: int) -> dict[str, Any]:
    """(i) Per protocol and delivery path, a backlog drained through the Lambda entry points,
    DynamoDB in a process of its own; executor time priced from the lone runs where measured."""
    from .backlog import PATHS, measure_backlog
    from .harness import MotoProcess

    measured: dict[str, Any] = {}
    with MotoProcess(pool_size=96) as dynamodb:
        for protocol in protocols:
            alone = results.get("executor_alone", {}).get(protocol, {}).get("mean_ms")
            for path in PATHS:
                _say(f"{protocol}: backlog of {jobs} jobs, {path} path, through the Lambda entry points")
                row = measure_backlog(protocol, jobs=jobs, path=path, dynamodb=dynamodb, executor_ms_alone=alone)
                measured.setdefault(protocol, {})[path] = row
                _say(f"{protocol} {path}: {row['jobs_per_s'] or 0:.1f} jobs/s, "
                     f"{row['invocations_per_job']:.2f} invocations / job")
    return measured


def _first_pull(protocols: list[str], *, repeat: int) -> dict[str, Any]:
    """(a'') Seconds from starting ``serverless-worker local`` to its first request, per path."""
    from .first_pull import HANDLERS, measure_first_pull

    _say(f"first pull of serverless-worker local, {repeat} starts per protocol and path")
    return measure_first_pull(protocols, HANDLERS, repeat=repeat, say=lambda protocol, path, row: _say(
        f"{protocol}: {path} path, first pull after {row['median_s']:.2f} s"))


def _cost(results: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    from . import cost

    asl = json.loads((ROOT / "functions" / "statemachine" / "worker.asl.json").read_text(encoding="utf-8"))
    long_path = cost.long_path_transitions(asl)
    memory = defaults["memory_mb"]
    per_million = {}
    for protocol, tp in results["throughput"].items():
        alone = results["executor_alone"].get(protocol, {}).get("mean_ms")
        executor_ms = alone if alone is not None else tp["executor_ms"]["mean"]
        measured = results.get("write_units", {}).get(protocol)
        units = (measured["ledger_table_units_per_job"], measured["ledger_index_units_per_job"]) if measured else None
        per_million[protocol] = cost.per_million_jobs(
            protocol=protocol, dynamodb=tp["dynamodb"], executor_ms=executor_ms or 0.0,
            executor_memory_mb=memory["ExecutorFunction"], steps_memory_mb=memory["StepsFunction"],
            long_path=long_path, ledger_units=units)
    idle_ticks = list(results["idle_tick"].values())
    idle = max(idle_ticks, key=lambda t: t["duration_s"]) if idle_ticks else {}
    schedule = defaults["schedule"]
    minutes = float(schedule.split("(")[1].split()[0]) if schedule.startswith("rate(") else 1.0
    alarms = _count_alarms()
    scheduler = _scheduler_defaults()
    fixed = {"idle": idle, "idle_continuous": results.get("idle_tick_continuous"),
             "schedule_minutes": minutes, "window_s": defaults["poll_window_seconds"],
             "alarms": alarms, "scheduler_memory_mb": memory["SchedulerFunction"], "arm64": scheduler["arm64"]}
    calls = {protocol: {mode: cost.idle_calls_per_hour(protocol, liveness=mode, window_s=fixed["window_s"],
                                                       schedule_minutes=minutes)
                        for mode in ("full-window", "continuous", "while-work")}
             for protocol in results["meta"]["protocols"]}
    return {
        "prices_as_of": cost.PRICES_AS_OF,
        "prices": {name: {"usd": p.usd, "unit": p.unit, "source": p.source}
                   for name, p in cost.PRICES.items()},
        "per_million_jobs": per_million,
        "liveness_default": scheduler["liveness"],
        # As the template deploys by default: the key in Secrets Manager, X-Ray per SchedulerTracing.
        "fixed_monthly": cost.fixed_monthly(tracing=scheduler["tracing"], secret=True, **fixed),
        # The cheapest the template allows: ApiKeyParameterName (SSM) and SchedulerTracing=PassThrough.
        "fixed_monthly_cheapest": cost.fixed_monthly(tracing=False, secret=False, **fixed),
        "idle_calls_per_hour": calls,
        "always_on": cost.always_on_alternatives(),
        "alarms_in_template": alarms,
    }


def _scheduler_defaults() -> dict[str, Any]:
    """The scheduler's template defaults the cost model needs: liveness, tracing, architecture."""
    from serverless_worker.local.template import load_template

    template = load_template()
    params = {name: spec.get("Default") for name, spec in template.get("Parameters", {}).items()}
    props = template["Resources"]["SchedulerFunction"]["Properties"]
    globals_ = template.get("Globals", {}).get("Function", {})
    architectures = props.get("Architectures", globals_.get("Architectures", ["x86_64"]))
    return {"liveness": params.get("Liveness", "full-window"),
            "tracing": params.get("SchedulerTracing", "Active") == "Active",
            "arm64": architectures == ["arm64"]}


def _count_alarms() -> int:
    from serverless_worker.local.template import load_template

    resources = load_template().get("Resources", {})
    return sum(1 for r in resources.values() if r.get("Type") == "AWS::CloudWatch::Alarm")


if __name__ == "__main__":
    raise SystemExit(main())
