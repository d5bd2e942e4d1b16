"""Keeps the benchmark code working (``make bench``): its cheap pieces, run for real.

No timing is asserted here: the figures belong to ``make bench`` on an idle machine. These
tests check that the pieces count what they claim to count.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # benchmarks/ is a top-level package of the repository
    sys.path.insert(0, str(ROOT))

from benchmarks import cost, report  # noqa: E402
from benchmarks.harness import (  # noqa: E402
    CREDENTIALS,
    HandlerClock,
    MotoProcess,
    minimum_calls,
    percentile,
    seed_body,
)
from benchmarks.minimal_worker import MinimalWorker  # noqa: E402
from benchmarks.rig import RuntimeRig  # noqa: E402
from benchmarks.throughput import ThroughputResult, dynamodb_per_job  # noqa: E402

ASL = json.loads((ROOT / "functions" / "statemachine" / "worker.asl.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("protocol", ["pipelogiq", "priostack", "claimqueue"])
def test_minimal_worker_makes_exactly_the_protocol_calls(protocol: str, serve: Callable[..., Any],
                                                         admin_for: Callable[..., Any]) -> None:
    server = serve(protocol)
    admin = admin_for(server)
    jobs = 20
    admin.seed(seed_body(protocol, [{"n": n, "t": 0.5} for n in range(jobs)]))
    clock = HandlerClock()
    worker = MinimalWorker(protocol, server.url, CREDENTIALS[protocol], concurrency=4, batch_size=10,
                           note=clock.note)
    try:
        took = worker.run(jobs, timeout=60)
    finally:
        worker.close()
    assert took is not None and worker.done == jobs and not worker.errors
    assert len(clock.starts) == jobs and all(created == 0.5 for created, _ in clock.starts)
    calls = admin.stats()["calls"]
    minimum = minimum_calls(protocol, 10, jobs)
    for endpoint, per_job in minimum.items():
        if endpoint == "activate":  # batches shrink to the free slots once the pool is full
            assert jobs * per_job <= calls[endpoint] <= jobs + 1, calls
        elif endpoint in ("pull", "claim"):  # one per job, plus the poll that finds the queue empty
            assert jobs <= calls[endpoint] <= jobs + 2, calls
        else:
            assert calls[endpoint] == round(jobs * per_job), calls
    settled = [j for j in admin.jobs() if str(j.get("status", j.get("state"))).lower()
               in ("succeeded", "completed", "finished")]
    assert len(settled) == jobs, admin.jobs()[:2]


def test_runtime_rig_counts_every_job(serve: Callable[..., Any], admin_for: Callable[..., Any]) -> None:
    """The runtime wired as the local runner wires it, on moto's server: 5 jobs, each counted."""
    from serverless_worker.local.aws import EmbeddedAws

    server = serve("priostack")  # no long poll: the rig stops at once without stopping the server
    admin = admin_for(server)
    admin.seed(seed_body("priostack", [{"n": n} for n in range(5)]))
    sandbox = SimpleNamespace(protocol="priostack", url=server.url, credential=CREDENTIALS["priostack"])
    clock = HandlerClock()
    aws = EmbeddedAws.start(pool_size=16)
    try:
        rig = RuntimeRig(aws, sandbox, registry=clock.registry(), concurrency=2, batch_size=10,
                         max_in_flight=50, poll_window=30.0)
        try:
            rig.start()
            assert rig.wait_reported(5, timeout=60) is not None
            operations = rig.store_calls.snapshot()
        finally:
            rig.stop()
            rig.close()
    finally:
        aws.close()
    assert len(clock.starts) == 5 and rig.actions == {"reported": 5}
    for name in ("record_delivery", "start_run", "store_outcome", "mark_acknowledged"):
        assert operations[name] == 5, operations
    assert "mark_reported" not in operations  # report and ack are recorded in one write
    assert admin.stats()["calls"]["complete"] == 5


def test_runtime_rig_on_the_local_state_file(serve: Callable[..., Any], admin_for: Callable[..., Any],
                                            tmp_path: Path) -> None:
    """The local benchmark's wiring: the rig on a SQLite store and no AWS at all; each job
    costs the four ledger writes there too."""
    from serverless_worker.state import SqliteStateStore

    server = serve("priostack")
    admin = admin_for(server)
    admin.seed(seed_body("priostack", [{"n": n} for n in range(5)]))
    sandbox = SimpleNamespace(protocol="priostack", url=server.url, credential=CREDENTIALS["priostack"])
    clock = HandlerClock()
    store = SqliteStateStore(tmp_path / "state.sqlite3")
    rig = RuntimeRig(None, sandbox, registry=clock.registry(), concurrency=2, batch_size=10, max_in_flight=50,
                     poll_window=30.0, store=store)
    try:
        rig.start()
        assert rig.wait_reported(5, timeout=60) is not None
        operations = rig.store_calls.snapshot()
        writes = store.ops["write"]
    finally:
        rig.stop()
        rig.close()
        store.close()
    assert rig.actions == {"reported": 5} and len(clock.starts) == 5
    for name in ("start_run", "store_outcome", "mark_acknowledged"):
        assert operations[name] == 5, operations
    # Each pulled batch recorded at once, a lone delivery alone: one record each either way.
    assert operations.get("record_new", 0) >= 1, operations
    assert writes == 4 * 5, store.ops
    assert admin.stats()["calls"]["complete"] == 5


def test_runtime_rig_on_a_moto_server_process(serve: Callable[..., Any], admin_for: Callable[..., Any]) -> None:
    """The throughput benchmark's DynamoDB: moto's server in a child process, whose CPU the
    benchmark reads; each job costs the four ledger writes and no counters write."""
    server = serve("claimqueue")
    admin_for(server).seed(seed_body("claimqueue", [{"n": n} for n in range(4)]))
    sandbox = SimpleNamespace(protocol="claimqueue", url=server.url, credential=CREDENTIALS["claimqueue"])
    clock = HandlerClock()
    with MotoProcess(pool_size=8) as dynamodb:
        cpu_before = dynamodb.cpu_seconds()
        rig = RuntimeRig(dynamodb, sandbox, registry=clock.registry(), concurrency=2, batch_size=10,
                         max_in_flight=50, poll_window=30.0)
        try:
            rig.start()
            assert rig.wait_reported(4, timeout=60) is not None
            operations = rig.store_calls.snapshot()
        finally:
            rig.stop()
            rig.close()
        cpu_after = dynamodb.cpu_seconds()
    assert rig.actions == {"reported": 4} and len(clock.starts) == 4
    for name in ("record_delivery", "start_run", "store_outcome", "mark_acknowledged"):
        assert operations[name] == 4, operations
    assert "add_counters" not in operations  # counted in memory, written at most every 30 s
    assert cpu_before is not None and cpu_after is not None and cpu_after > cpu_before


def test_cost_model_arithmetic() -> None:
    long_path = cost.long_path_transitions(ASL, slices=2, renewals=3)
    assert long_path == {"transitions": 10 + 2 * 2 + 3 * 3, "lambda_invocations": 3 + 2 + 3,
                         "slices": 2, "renewals": 3}
    dynamodb = dynamodb_per_job({"read": 10, "write": 600}, {
        "record_delivery": 100, "start_run": 100, "store_outcome": 100, "mark_reported": 100,
        "mark_acknowledged": 100, "add_counters": 100, "get_control": 2}, 100, item_bytes=1500.0)
    assert dynamodb["writes_per_job"] == 6 and dynamodb["reads_per_job"] == 0.1
    assert dynamodb["write_units_per_ledger_write"] == 2
    assert dynamodb["per_tick_operations"] == {"get_control": 2}
    one = cost.per_million_jobs(protocol="pipelogiq", dynamodb=dynamodb, executor_ms=99.2,
                                executor_memory_mb=512, steps_memory_mb=512,
                                long_path=cost.long_path_transitions(ASL))
    short = one["short_path"]
    # 5 ledger writes of 2 units, 1 counters write, index: record 1 + final 1 (start_run moves no key).
    assert short["wru_per_job"] == 5 * 2 + 1 + 2 and short["gsi_wru_per_job"] == 2
    assert short["lambda_requests_usd"] == pytest.approx(0.20)
    # 99.2 ms bills as 100 ms (1 ms granularity) at 0.5 GB.
    assert short["lambda_gb_seconds_usd"] == pytest.approx(1e6 * 0.100 * 0.5 * 0.0000166667)
    assert short["dynamodb_usd"] == pytest.approx(13 * 0.625 + 0.1 * 0.125)
    assert one["long_path"]["step_functions_usd"] == pytest.approx(15 * 25.0)
    # (h)'s measured ledger units (table, index) replace the modelled ones; the counters write stays.
    measured = cost.per_million_jobs(protocol="pipelogiq", dynamodb=dynamodb, executor_ms=99.2,
                                     executor_memory_mb=512, steps_memory_mb=512,
                                     long_path=cost.long_path_transitions(ASL), ledger_units=(4.0, 2.0))
    assert measured["short_path"]["wru_per_job"] == 4 + 1 + 2 and measured["short_path"]["gsi_wru_per_job"] == 2

    idle = {"window_s": 50.0, "duration_s": 1.5, "reads": 4, "writes": 0}
    fixed = cost.fixed_monthly(idle=idle, schedule_minutes=1, window_s=50, scheduler_memory_mb=128, alarms=5)
    modes = fixed["modes"]
    assert fixed["ticks_per_month"] == 730 * 60
    # The scheduler's own windows: 60 s period, offline after 45 s, 4 s margin; none; the poll window.
    assert [modes[m]["window_s"] for m in ("continuous", "while-work", "full-window")] == [19, 0, 50]
    assert modes["continuous"]["billed_s_per_tick"] == 20.5 and modes["while-work"]["billed_s_per_tick"] == 1.5
    configured = modes["full-window"]["lambda_compute_usd"]
    assert configured == pytest.approx(43800 * 50 * 0.125 * 0.0000166667)
    totals = [modes[m]["total_usd"] for m in ("full-window", "continuous", "while-work")]
    assert totals == sorted(totals, reverse=True)
    assert all(m["total_with_free_tier_usd"] < m["total_usd"] for m in modes.values())
    cheapest = cost.fixed_monthly(idle=idle, schedule_minutes=1, window_s=50,
                                  scheduler_memory_mb=128, alarms=5, secret=False, tracing=False)
    saved = modes["while-work"]["total_usd"] - cheapest["modes"]["while-work"]["total_usd"]
    assert saved == pytest.approx(0.40 + 43800 * 5e-6)  # the secret and a trace per tick
    stretched = cost.fixed_monthly(idle={**idle, "cpu_s": 0.01}, schedule_minutes=1, window_s=50,
                                   scheduler_memory_mb=128, alarms=5)["modes"]["while-work"]
    assert stretched["billed_s_per_tick"] == pytest.approx(1.5 + 0.01 * (1769 / 128 - 1), abs=0.001)
    measured = cost.fixed_monthly(idle=idle, idle_continuous={"duration_s": 20.4}, schedule_minutes=1,
                                  window_s=50, scheduler_memory_mb=128, alarms=5)["modes"]["continuous"]
    assert measured["billed_s_per_tick"] == 20.4  # a measured continuous tick replaces the estimate
    calls = {m: cost.idle_calls_per_hour("claimqueue", liveness=m, window_s=50, schedule_minutes=1)
             for m in ("full-window", "continuous", "while-work")}
    assert calls["continuous"] == calls["while-work"] == {"window_s": 0.0, "pulls": 60.0, "heartbeats": 0}
    assert calls["full-window"]["pulls"] > 60 * 25  # 2 s at most between claims, 1.5 s on average
    beats = cost.idle_calls_per_hour("pipelogiq", liveness="continuous", window_s=50, schedule_minutes=1)
    assert beats == {"window_s": 19.0, "pulls": 120.0, "heartbeats": 60 * 3}  # 0 s, 15 s and closing
    # a Pipelogiq server that answers empty pulls at once: paced as the scheduler paces it (0.15,
    # 0.3, 0.6, 1.2, 2.4, then 3.75 s apart at the jitter's mean), 18 pulls in a 50 s window
    at_once = cost.idle_calls_per_hour("pipelogiq", liveness="full-window", window_s=50, schedule_minutes=1,
                                       long_poll_held=False)
    held = cost.idle_calls_per_hour("pipelogiq", liveness="full-window", window_s=50, schedule_minutes=1)
    assert held["pulls"] == 60 * 4 and at_once["heartbeats"] == held["heartbeats"]
    priostack = cost.idle_calls_per_hour("priostack", liveness="full-window", window_s=50, schedule_minutes=1)
    assert at_once["pulls"] == priostack["pulls"] == 60 * 18  # the same 5 s cap as Priostack's document
    always_on = cost.always_on_alternatives()
    assert always_on["ec2_t4g_nano"]["usd"] == pytest.approx(730 * (0.0042 + 0.005) + 8 * 0.08)


def test_cost_model_refuses_a_drifted_state_machine() -> None:
    drifted = json.loads(json.dumps(ASL))
    drifted["States"]["Acquire2"] = drifted["States"].pop("Acquire")
    with pytest.raises(ValueError, match="Acquire"):
        cost.long_path_transitions(drifted)


def test_report_renders_and_judges_targets() -> None:
    result = ThroughputResult(protocol="priostack", jobs=100, concurrency=4, batch_size=10,
                              runtime_jobs_per_s=90.0, minimal_jobs_per_s=100.0,
                              runtime_calls={"activate": 0.14, "complete": 1.0},
                              minimal_calls={"activate": 0.11, "complete": 1.0},
                              minimum_calls=minimum_calls("priostack", 10, 100),
                              dynamodb={"writes_per_job": 6.0, "reads_per_job": 0.1,
                                        "ledger_item_bytes": 900.0,
                                        "by_operation_per_job": {"start_run": 1.0}},
                              executor_ms={"mean": 10.0, "p50": 9.0, "p95": 20.0},
                              scheduler={"full_waits": 0})
    assert result.ratio == pytest.approx(0.9)
    assert result.calls_above_minimal_worker == {"activate": pytest.approx(0.03)}
    results = {"meta": {"protocols": ["priostack"], "jobs": 100},
               "throughput": {"priostack": result.as_dict()},
               "latency": {"priostack": {"p50_s": 0.4, "p95_s": 0.9, "started": 5, "jobs": 5}},
               "dispatch": {"priostack": {"dispatches_per_s": 150.0, "dispatched": 5, "deliveries": 5,
                                          "pull_calls": {"activate": 1}, "pull_ms_per_delivery": 1.0,
                                          "record_ms_each": 2.0}},
               "write_units": {"priostack": {"ledger_writes_per_job": 4.0, "ledger_table_units_per_job": 5.0,
                                             "ledger_index_units_per_job": 2.0, "ledger_units_per_job": 7.0,
                                             "other_units_per_job": 0.0, "usd_per_million_jobs": 4.375,
                                             "usd_per_million_units": 0.625, "ledger_item_bytes": 1100}},
               "local": {"priostack": {"local_jobs_per_s": 600.0, "minimal_jobs_per_s": 1000.0, "ratio": 0.6,
                                       "ratios": [0.55, 0.6, 0.9], "state_ops_per_job": {"write": 4.0},
                                       "cpu_ms_per_job": {"local": 1.4, "minimal": 0.8}}},
               "first_pull": {"priostack": {"short": {"median_s": 0.61, "runs": [0.6, 0.61, 0.7]},
                                            "long": {"median_s": 1.52, "runs": [1.4, 1.52, 1.6]}}}}
    marks = report.verdicts(results)
    assert marks["a_first_pull"] == "first pull <= 1.5 s after start: NOT met"  # the long path's median
    assert marks["a_local_ratio"] == ">= 0.85: NOT met"  # the median, though one round met it
    assert marks["a_ratio"].endswith(": met") and marks["e_p50"].endswith(": met")
    assert marks["b_above_minimum"].endswith(": met")  # 3 calls in the run: within the slack
    assert marks["c_writes"].endswith("NOT met") and marks["g_rate"].endswith("NOT met")
    assert marks["d_ratio"].endswith("not measured")
    assert marks["h_write_units"] == "<= 6 write units / job: NOT met"
    text = report.render(results)
    assert "(a) throughput" in text and "(g) scheduler dispatch rate" in text and "(d) cold start" not in text
    assert "(h) DynamoDB write units per job" in text and "4.38" in text
    assert "0.55 0.60 0.90" in text and "target >= 0.85: NOT met" in text
    assert "start to first pull, s (median of 3 starts)" in text and "1.52" in text
    assert report.verdicts({**results, "first_pull": {"priostack": {"short": {"median_s": 0.61, "runs": [0.61]}}}}
                           )["a_first_pull"].endswith(": met")


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([float(n) for n in range(1, 101)], 95) == 95.0


def test_state_file_writes_counts_four_writes_a_job_and_their_commits() -> None:
    from benchmarks.state_file_writes import measure

    alone = measure(40, 1)
    assert alone["writes_per_commit"] == pytest.approx(1.0)  # one thread: nothing to group with
    turns = measure(40, 4, one_at_a_time=True)
    assert turns["writes_per_commit"] == pytest.approx(1.0)  # one job at a time: nothing either
    shared = measure(200, 8)
    assert shared["writes_per_commit"] >= 1.0 and shared["cpu_ms_per_job"] > 0


def test_stop_benchmark_times_a_real_stop_and_reads_its_exit(tmp_path: Path) -> None:
    import signal

    from benchmarks.stop import time_to_exit

    # a report the server tells to wait a year: the run stops with that job unreported (exit 1)
    seconds, status = time_to_exit("claimqueue", "report told to wait a year", signal.SIGTERM,
                                   workdir=tmp_path, timeout=120)
    assert status == 1 and seconds > 0
