"""The table ``make bench`` prints: every figure next to its target, and whether it is met.

Input is the results dictionary ``run.py`` also writes as JSON; nothing here measures.
Sections a benchmark run skipped (``--skip``) are left out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["TARGETS", "render", "verdicts"]

# Per figure: the test on the measured value and the target it is held to, in words.
TARGETS: dict[str, tuple[Callable[[float], bool], str]] = {
    "a_ratio": (lambda v: v >= 0.85, ">= 0.85"),
    "a_first_pull": (lambda v: v <= 1.5, "first pull <= 1.5 s after start"),
    "b_above_minimum": (lambda v: v <= 3, "no call beyond the minimal worker's (slack: 3 end-of-run polls)"),
    "b_heartbeats": (lambda v: v <= 0.05, "<= 0.05 / job"),
    "c_writes": (lambda v: v <= 3, "<= 3 / job"),
    "c_reads": (lambda v: v <= 1, "<= 1 / job"),
    "d_ratio": (lambda v: v <= 1.5, "<= 1.5"),
    "e_p50": (lambda v: v <= 0.5, "<= 0.5 s"),
    "f_while_work": (lambda v: v <= 1.0, "<= $1 / month"),
    "f_continuous": (lambda v: v <= 3.0, "<= $3 / month"),
    "g_rate": (lambda v: v >= 200, ">= 200 / s"),
    "h_write_units": (lambda v: v <= 6, "<= 6 write units / job"),
    # (i), a backlog: the targets of executors that pull their own work, judged per delivery path.
    "i_invocations": (lambda v: v <= 0.2, "<= 0.2 Lambda invocations / job"),
    "i_write_units": (lambda v: v <= 4, "<= 4 ledger write units / job"),
    "i_pickup_p50": (lambda v: v <= 1.0, "pickup p50 <= 1 s while busy"),
    "i_usd": (lambda v: v <= 2.5, "<= $2.50 per million short jobs"),
}

# (i)'s figures judged against a target, and where each is in a backlog row.
_BACKLOG_TARGETS = {"i_invocations": lambda r: r["invocations_per_job"],
                    "i_write_units": lambda r: r["ledger_units_per_job"],
                    "i_pickup_p50": lambda r: r["pickup_busy_s"]["p50"],
                    "i_usd": lambda r: r["usd_per_million_short_jobs"]}


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != 0 and abs(value) < 0.01:
            return f"{value:.4f}"
        return f"{value:.{digits}f}"
    return str(value)


def _verdict(key: str, values: Iterable[float | None]) -> str:
    test, text = TARGETS[key]
    measured = [v for v in values if v is not None]
    if not measured:
        return f"{text}: not measured"
    return f"{text}: {'met' if all(test(v) for v in measured) else 'NOT met'}"


def verdicts(results: dict[str, Any]) -> dict[str, str]:
    """Target -> "met" / "NOT met", judged on the worst protocol (or the mode the target names)."""
    tp = results.get("throughput", {}).values()
    cold = results.get("coldstart", {}).get("functions", {}).values()
    fixed = {}
    for label, key in (("", "fixed_monthly"), ("_cheapest", "fixed_monthly_cheapest")):
        modes = results.get("cost", {}).get(key, {}).get("modes", {})
        fixed[f"f_while_work{label}"] = _verdict("f_while_work", [modes.get("while-work", {}).get("total_usd")])
        fixed[f"f_continuous{label}"] = _verdict("f_continuous", [modes.get("continuous", {}).get("total_usd")])
    return {
        **fixed,
        "a_ratio": _verdict("a_ratio", (r.get("ratio") for r in tp)),
        "a_local_ratio": _verdict("a_ratio", (r.get("ratio") for r in results.get("local", {}).values())),
        "a_first_pull": _verdict("a_first_pull", (path["median_s"] for paths in results.get("first_pull", {}).values()
                                                  for path in paths.values())),
        "b_above_minimum": _verdict("b_above_minimum", (  # in calls over the run, per endpoint
            round(r["jobs"] * max(r.get("calls_above_minimal_worker", {}).values(), default=0.0))
            for r in tp)),
        "b_heartbeats": _verdict("b_heartbeats", (r.get("heartbeats_per_job") for r in tp)),
        "c_writes": _verdict("c_writes", (r["dynamodb"].get("writes_per_job") for r in tp)),
        "c_reads": _verdict("c_reads", (r["dynamodb"].get("reads_per_job") for r in tp)),
        "d_ratio": _verdict("d_ratio", (f.get("ratio_to_boto3") for f in cold)),
        "e_p50": _verdict("e_p50", (r.get("p50_s") for r in results.get("latency", {}).values())),
        "g_rate": _verdict("g_rate", (r.get("dispatches_per_s")
                                      for r in results.get("dispatch", {}).values())),
        "h_write_units": _verdict("h_write_units", (r.get("ledger_units_per_job")
                                                    for r in results.get("write_units", {}).values())),
        **_backlog_verdicts(results.get("backlog", {})),
    }


def _backlog_verdicts(backlog: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Each (i) target judged per delivery path, on its worst protocol: "scheduler NOT met"."""
    paths = sorted({path for by_path in backlog.values() for path in by_path})
    marks = {}
    for key, figure in _BACKLOG_TARGETS.items():
        text = TARGETS[key][1]
        judged = []
        for path in paths:
            mark = _verdict(key, (figure(by_path[path]) for by_path in backlog.values() if path in by_path))
            judged.append(f"{path} {mark.rsplit(': ', 1)[1]}")
        marks[key] = f"{text}: {', '.join(judged) or 'not measured'}"
    return marks


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return ["    " + line.rstrip() for line in lines]


def _row(label: str, data: dict[str, Any], protocols: list[str], cell: Callable[[Any], str]) -> list[str]:
    return [label] + [cell(data[p]) for p in protocols]


def _present(results: dict[str, Any], section: str) -> tuple[dict[str, Any], list[str]]:
    data = results.get(section) or {}
    return data, [p for p in results.get("meta", {}).get("protocols", []) if p in data]


def _throughput(results: dict[str, Any], marks: dict[str, str]) -> list[str]:
    tp, ps = _present(results, "throughput")
    if not ps:
        return []
    out = ["", "(a) throughput, jobs/s (all jobs seeded first; first call to last settle)"]
    where = "server process" if results.get("meta", {}).get("dynamodb") == "process" else "embedded"
    rows = [
        _row(f"runtime (local pool, {where} moto DynamoDB)", tp, ps, lambda r: _fmt(r["runtime_jobs_per_s"], 1)),
        _row("minimal hand-rolled worker", tp, ps, lambda r: _fmt(r["minimal_jobs_per_s"], 1)),
        _row("ratio runtime / minimal", tp, ps, lambda r: _fmt(r["ratio"])),
        _row("runtime executor p50 / p95 ms", tp, ps,
             lambda r: f"{_fmt(r['executor_ms']['p50'], 0)} / {_fmt(r['executor_ms']['p95'], 0)}"),
        _row("scheduler waits for a free executor", tp, ps, lambda r: _fmt(r["scheduler"]["full_waits"])),
    ]
    rows.append(_row("DynamoDB writes/s the runtime drove", tp, ps,
                     lambda r: _fmt((r["runtime_jobs_per_s"] or 0.0) * r["dynamodb"]["writes_per_job"], 0)))
    cpu = [("runtime", "runtime"), ("dynamodb", "moto"), ("minimal", "minimal worker")]
    if any(tp[p].get("cpu_ms_per_job") for p in ps):
        rows.append(_row("CPU ms / job: " + " / ".join(label for _, label in cpu), tp, ps, lambda r: " / ".join(
            _fmt((r.get("cpu_ms_per_job") or {}).get(key), 1) for key, _ in cpu)))
    ceiling = results.get("dynamodb_ceiling_writes_per_s")
    if ceiling:
        label = f"{where} moto alone, 50 threads of ledger-sized writes/s"
        rows.append([label, _fmt(ceiling, 0)] + [""] * (len(ps) - 1))
    out += _table(["", *ps], rows)
    out.append(f"    target {marks['a_ratio']}")

    out += ["", "(b) HTTP calls per job by endpoint: runtime / minimal worker / protocol minimum"]
    for p in ps:
        r = tp[p]
        names = sorted(set(r["runtime_calls"]) | set(r["minimal_calls"]) | set(r["minimum_calls"]))
        rows = [[name, _fmt(r["runtime_calls"].get(name, 0.0), 4), _fmt(r["minimal_calls"].get(name, 0.0), 4),
                 _fmt(r["minimum_calls"].get(name, 0.0), 4)] for name in names]
        out.append(f"  {p}:")
        out += _table(["endpoint", "runtime", "minimal", "minimum"], rows)
    for key, what in (("calls_above_minimum", "beyond the protocol minimum"),
                      ("calls_above_minimal_worker", "beyond the minimal worker's calls")):
        parts = [f"{p} " + (", ".join(f"{k} +{round(v * tp[p]['jobs'])}" for k, v in tp[p][key].items())
                            or "none") for p in ps]
        out.append(f"    {what} (heartbeats apart), calls in the whole run: " + "; ".join(parts))
    beats = ", ".join(f"{p} {_fmt(tp[p]['heartbeats_per_job'], 4)}" for p in ps)
    out.append(f"    heartbeats per job: {beats}")
    out.append(f"    targets: {marks['b_above_minimum']}; heartbeats {marks['b_heartbeats']}")

    out += ["", "(c) DynamoDB requests per job (runtime; per-tick requests included)"]
    rows = [_row("writes / job", tp, ps, lambda r: _fmt(r["dynamodb"]["writes_per_job"], 3)),
            _row("reads / job", tp, ps, lambda r: _fmt(r["dynamodb"]["reads_per_job"], 3)),
            _row("settled ledger item, bytes", tp, ps, lambda r: _fmt(r["dynamodb"]["ledger_item_bytes"], 0))]
    out += _table(["", *ps], rows)
    by_op = tp[ps[0]]["dynamodb"]["by_operation_per_job"]
    out.append(f"    per job, {ps[0]}: " + ", ".join(f"{k} {_fmt(v, 3)}" for k, v in by_op.items()))
    out.append(f"    targets: writes {marks['c_writes']}; reads {marks['c_reads']}")
    return out


def _local(results: dict[str, Any], marks: dict[str, str]) -> list[str]:
    """(a') ``serverless-worker local`` as it runs: the runtime on its SQLite state file."""
    lo, ps = _present(results, "local")
    first, first_ps = _present(results, "first_pull")
    if not ps:
        return _first_pull(first, first_ps, marks)
    out = ["", "(a') local worker (serverless-worker local: SQLite state file) vs minimal worker, jobs/s"]
    rows = [
        _row("local worker", lo, ps, lambda r: _fmt(r["local_jobs_per_s"], 1)),
        _row("minimal hand-rolled worker", lo, ps, lambda r: _fmt(r["minimal_jobs_per_s"], 1)),
        _row("ratio local / minimal (median)", lo, ps, lambda r: _fmt(r["ratio"])),
        _row("ratio in each round", lo, ps, lambda r: " ".join(_fmt(x) for x in r.get("ratios", [r["ratio"]]))),
        _row("state-file writes / job", lo, ps, lambda r: _fmt(r["state_ops_per_job"].get("write"), 2)),
        _row("CPU ms / job: local / minimal worker", lo, ps, lambda r: " / ".join(
            _fmt(r["cpu_ms_per_job"].get(key), 1) for key in ("local", "minimal"))),
    ]
    out += _table(["", *ps], rows)
    out.append(f"    target {marks['a_local_ratio']}; rounds in turn, minimal worker first, each on a fresh sandbox")
    return out + _first_pull(first, first_ps, marks)


def _first_pull(first: dict[str, Any], ps: list[str], marks: dict[str, str]) -> list[str]:
    if not ps:
        return []
    runs = len(next(iter(next(iter(first.values())).values()))["runs"])
    out = ["", f"(a'') serverless-worker local, start to first pull, s (median of {runs} starts)"]
    rows = [_row(f"{path} path", first, ps, lambda r, path=path: _fmt(r[path]["median_s"]))
            for path in next(iter(first.values()))]
    out += _table(["", *ps], rows)
    out.append("    short: short handlers only (no moto); long: a sliced handler too (moto's Step Functions "
               "and Lambda start first)")
    out.append(f"    target {marks['a_first_pull']}")
    return out


def _coldstart(results: dict[str, Any], marks: dict[str, str]) -> list[str]:
    cold = results.get("coldstart")
    if not cold:
        return []
    out = ["", f"(d) cold start: median wall time of a fresh process, {cold['rounds']} rounds "
               f"(python -c 'import boto3': {_fmt(cold['boto3_import_median_s'], 3)} s)"]
    rows = [[key, _fmt(f["median_s"], 3), _fmt(f["ratio_to_boto3"]), _fmt(f.get("cpu_ratio_to_boto3")),
             _fmt(f["import_s"], 3), _fmt(f["init_s"], 3), _fmt(f.get("first_client_s"), 3), str(f.get("modules"))]
            for key, f in cold["functions"].items()]
    header = ["function/protocol", "seconds", "ratio", "CPU ratio", "import app.py", "build runtime",
              "then DynamoDB client", "modules"]
    out += _table(header, rows)
    out.append("    then DynamoDB client: built on the first call, not counted above; every function makes one")
    out.append(f"    target {marks['d_ratio']}")
    return out


def _latency(results: dict[str, Any], marks: dict[str, str]) -> list[str]:
    lat, ps = _present(results, "latency")
    if not ps:
        return []
    out = ["", "(e) job creation -> handler start, poll window active (jobs arriving one by one)"]
    rows = [_row("p50 s", lat, ps, lambda r: _fmt(r["p50_s"], 3)),
            _row("p95 s", lat, ps, lambda r: _fmt(r["p95_s"], 3)),
            _row("jobs started / seeded", lat, ps, lambda r: f"{r['started']}/{r['jobs']}")]
    out += _table(["", *ps], rows)
    out.append(f"    target {marks['e_p50']}")
    return out


def _cost(results: dict[str, Any], marks: dict[str, str]) -> list[str]:
    cost = results.get("cost")
    if not cost:
        return []
    out = ["", f"(f) cost, us-east-1 list prices as of {cost['prices_as_of']}, no free tier "
               "(benchmarks/cost.py)"]
    per = cost["per_million_jobs"]
    ps = [p for p in results.get("meta", {}).get("protocols", []) if p in per]
    if ps:
        rows = [
            _row("short path, $ / million jobs", per, ps, lambda c: _fmt(c["short_path_usd"])),
            _row("  DynamoDB $ (WRU / job incl. GSI)", per, ps,
                 lambda c: f"{_fmt(c['short_path']['dynamodb_usd'])} "
                           f"({_fmt(c['short_path']['wru_per_job'], 1)})"),
            _row("  Lambda $ (executor ms, run alone)", per, ps, _lambda_cell),
            _row("long-running path, $ / million jobs", per, ps, lambda c: _fmt(c["long_path_usd"])),
        ]
        out += _table(["", *ps], rows)
        lp = per[ps[0]]["long_path"]
        out.append(f"    long path: {lp['transitions']} state transitions and {lp['lambda_invocations']} "
                   f"steps invocations per job ({lp['slices']} slice, {lp['renewals']} renewal); "
                   "handler time excluded")
    fixed, cheapest = cost["fixed_monthly"], cost.get("fixed_monthly_cheapest", {}).get("modes", {})
    default = cost.get("liveness_default")
    config = fixed["scheduler"]
    out.append(f"  at zero jobs, $ / month ({fixed['ticks_per_month']:.0f} ticks; scheduler {config['memory_mb']} MB"
               f"{' arm64' if config['arm64'] else ''}; alarms, custom metrics, logs, X-Ray, secret, DynamoDB: "
               f"{_fmt(sum(fixed['common'].values()))} of each total)")
    calls = cost.get("idle_calls_per_hour", {})
    ps_calls = [p for p in results.get("meta", {}).get("protocols", []) if p in calls]
    rows = [[name + (" (default)" if name == default else ""), _fmt(m["billed_s_per_tick"]),
             _fmt(m["lambda_compute_usd"]), _fmt(m["total_usd"]), _fmt(m["total_with_free_tier_usd"]),
             _fmt(cheapest.get(name, {}).get("total_usd"))]
            + [f"{calls[p][name]['pulls']:.0f}/{calls[p][name]['heartbeats']:.0f}" for p in ps_calls]
            for name, m in fixed["modes"].items()]
    header = ["liveness (SW_LIVENESS)", "billed s/tick", "Lambda", "total", "with free tier",
              "SSM key, no X-Ray"] + [f"{p} calls/h" for p in ps_calls]
    out += _table(header, rows)
    out += [f"    {name}: {m['what']}" for name, m in fixed["modes"].items()]
    out.append("    total: the key in Secrets Manager, SchedulerTracing as the template's default; SSM key, no "
               "X-Ray: ApiKeyParameterName and SchedulerTracing=PassThrough; calls/h: the job server's pulls/"
               "heartbeats per hour at zero jobs")
    out += [f"    instead, always on: {name} ${_fmt(alt['usd'])} / month ({alt['what']})"
            for name, alt in cost["always_on"].items()]
    out.append(f"    targets as deployed by default: liveness while work exists {marks['f_while_work']}; "
               f"continuous liveness {marks['f_continuous']}")
    if cheapest:
        out.append("    targets with the SSM key and no scheduler X-Ray: liveness while work exists "
                   f"{marks['f_while_work_cheapest']}; continuous liveness {marks['f_continuous_cheapest']}")
    return out


def _lambda_cell(c: dict[str, Any]) -> str:
    short = c["short_path"]
    usd = short["lambda_requests_usd"] + short["lambda_gb_seconds_usd"]
    return f"{_fmt(usd)} ({_fmt(short['executor_ms'], 0)})"


def _dispatch(results: dict[str, Any], marks: dict[str, str]) -> list[str]:
    disp, ps = _present(results, "dispatch")
    if not ps:
        return []
    out = ["", "(g) scheduler dispatch rate: one tick, enqueue-only dispatcher, backlog seeded first, "
               "ledger in moto's server process"]
    rows = [_row("dispatches / s", disp, ps, lambda r: _fmt(r["dispatches_per_s"], 1)),
            _row("dispatched / seeded", disp, ps, lambda r: f"{r['dispatched']}/{r['deliveries']}"),
            _row("pull calls", disp, ps, lambda r: ", ".join(f"{k} {v}" for k, v in r["pull_calls"].items())),
            _row("pull ms per delivery (call time)", disp, ps, lambda r: _fmt(r["pull_ms_per_delivery"], 1)),
            _row("record ms each (16 in parallel, beside pulls)", disp, ps,
                 lambda r: _fmt(r["record_ms_each"], 1))]
    if all(disp[p].get("cpu_ms_per_delivery") for p in ps):
        rows.append(_row("scheduler CPU ms / delivery (per vCPU: / s)", disp, ps,
                         lambda r: f"{_fmt(r['cpu_ms_per_delivery'], 2)} ({1000 / r['cpu_ms_per_delivery']:.0f})"))
    out += _table(["", *ps], rows)
    out.append(f"    target {marks['g_rate']}")
    return out


def _write_units(results: dict[str, Any], marks: dict[str, str]) -> list[str]:
    units, ps = _present(results, "write_units")
    if not ps:
        return []
    out = ["", "(h) DynamoDB write units per job on the short path (1 KB units; the in-flight index's own)"]
    rows = [_row("ledger writes / job", units, ps, lambda r: _fmt(r["ledger_writes_per_job"])),
            _row("table units / job", units, ps, lambda r: _fmt(r["ledger_table_units_per_job"])),
            _row("in-flight index units / job", units, ps, lambda r: _fmt(r["ledger_index_units_per_job"])),
            _row("ledger units / job", units, ps, lambda r: _fmt(r["ledger_units_per_job"])),
            _row("sessions, locks, counters / job", units, ps, lambda r: _fmt(r["other_units_per_job"])),
            _row("$ per million jobs, ledger writes", units, ps, lambda r: _fmt(r["usd_per_million_jobs"])),
            _row("settled item, bytes", units, ps, lambda r: _fmt(r["ledger_item_bytes"], 0))]
    out += _table(["", *ps], rows)
    out.append(f"    target {marks['h_write_units']} (on-demand write request units at "
               f"${_fmt(next(iter(units.values()))['usd_per_million_units'], 3)} per million)")
    return out


def _backlog(results: dict[str, Any], marks: dict[str, str]) -> list[str]:
    """(i): one column per protocol and delivery path, the paths of a protocol side by side."""
    backlog = results.get("backlog") or {}
    columns = [(protocol, path) for protocol in results.get("meta", {}).get("protocols", [])
               for path in sorted(backlog.get(protocol, {}))]
    if not columns:
        return []
    first = backlog[columns[0][0]][columns[0][1]]
    out = ["", f"(i) a backlog of {first['jobs']} jobs through the Lambda entry points (first tick to last "
               f"settle; the scheduler ticks on its schedule; capacity {first['capacity']})"]
    cells: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("jobs/s", lambda r: _fmt(r["jobs_per_s"], 1)),
        ("Lambda invocations / job", lambda r: _fmt(r["invocations_per_job"], 3)),
        ("  scheduler, executor, steps", lambda r: "/".join(str(r["invocations"].get(f, 0)) for f in
                                                           ("SchedulerFunction", "ExecutorFunction",
                                                            "StepsFunction"))),
        ("ledger write units / job", lambda r: _fmt(r["ledger_units_per_job"])),
        ("  other write units / job", lambda r: _fmt(r["other_units_per_job"])),
        ("DynamoDB reads / job", lambda r: _fmt(r.get("reads_per_job"))),
        ("most jobs held at once", lambda r: _fmt(r.get("most_held_at_once"))),
        ("scheduler CPU ms / job", lambda r: _fmt(1000 * r["scheduler_cpu_s_per_job"])),
        ("executor ms / job", lambda r: _fmt(r["executor_ms_per_job"], 1)),
        ("pickup while busy p50 / p95, s", lambda r: f"{_fmt(r['pickup_busy_s']['p50'])} / "
                                                    f"{_fmt(r['pickup_busy_s']['p95'])}"),
        ("$ / million short jobs", lambda r: _fmt(r["usd_per_million_short_jobs"])),
        ("model jobs/s per 1,000 executions", lambda r: f"{_fmt(r['per_1000_concurrent']['jobs_per_s'], 0)} "
                                                       f"({r['per_1000_concurrent']['bound_by']})"),
        ("settled once / all", lambda r: f"{r['settled_once']}/{r['jobs']}"),
    ]
    rows = [[label] + [cell(backlog[protocol][path]) for protocol, path in columns] for label, cell in cells]
    out += _table(["", *(f"{protocol} {path}" for protocol, path in columns)], rows)
    out += [f"    target {marks[key]}" for key in _BACKLOG_TARGETS]
    assumptions = first["per_1000_concurrent"].get("assumptions") or (
        "each job holds an execution for its executor ms (a lone run's); the scheduler gets its memory's vCPU "
        "share and the CPU per job measured here; DynamoDB, the job server and Lambda's burst limits not limiting")
    out.append(f"    model: {assumptions}")
    return out


def render(results: dict[str, Any]) -> str:
    meta = results.get("meta", {})
    marks = verdicts(results)
    out = [f"serverless-worker benchmarks, {meta.get('started', '')}, commit {meta.get('commit')}, "
           f"{meta.get('cpus')} CPUs, load average {meta.get('load_before')} -> {meta.get('load_after')}",
           f"{meta.get('jobs')} jobs per protocol, concurrency {meta.get('concurrency')}, batch "
           f"{meta.get('batch_size')}, {'quick' if meta.get('quick') else 'full'} mode, "
           f"{_fmt(meta.get('seconds'), 0)} s"]
    for section in (_throughput, _local, _coldstart, _latency, _cost, _dispatch, _write_units, _backlog):
        out += section(results, marks)
    if results.get("errors"):
        out += ["", "errors: " + "; ".join(results["errors"])]
    return "\n".join(out)
