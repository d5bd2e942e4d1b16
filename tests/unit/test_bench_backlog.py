"""Keeps ``make bench``'s backlog step (i) working: a tiny backlog through the Lambda entry
points, run for real, and the arithmetic and table built on it.

No timing is asserted: the figures belong to ``make bench``. These tests check that the run
settles every job once and that each figure counts what it says it counts.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # benchmarks/ is a top-level package of the repository
    sys.path.insert(0, str(ROOT))

from benchmarks import report  # noqa: E402
from benchmarks.backlog import PATH_SETTINGS, held_at_once, measure_backlog, pickup_while_busy  # noqa: E402
from benchmarks.cost import PRICES  # noqa: E402

JOBS, CAPACITY = 20, 5
# A short window and period, so a tick that does not drain the backlog is followed soon;
# a capacity below the backlog, so pickups happen while busy.
SETTINGS = {"poll_window_seconds": 4, "schedule_seconds": 5, "max_in_flight": CAPACITY}


@pytest.fixture(scope="module")
def backlog() -> dict:
    return measure_backlog("claimqueue", jobs=JOBS, timeout=120.0, settings=SETTINGS)


@pytest.fixture(scope="module")
def self_pulled() -> dict:
    return measure_backlog("claimqueue", jobs=JOBS, path="self-pull", timeout=120.0, settings=SETTINGS)


def test_every_job_is_settled_once_through_the_entry_points(backlog: dict) -> None:
    assert backlog["errors"] == []
    assert backlog["drained"] and backlog["ticks_ended"]
    assert (backlog["settled_once"], backlog["settled_twice_or_more"], backlog["unsettled"]) == (JOBS, 0, 0)
    assert backlog["path"] == "scheduler" and backlog["capacity"] == CAPACITY


def test_the_scheduler_path_is_pinned_whatever_the_default() -> None:
    # The template's SelfPull default may flip; the "scheduler" column stays today's path.
    assert PATH_SETTINGS["scheduler"] == {"self_pull": False}
    assert PATH_SETTINGS["self-pull"] == {"self_pull": True}


def test_todays_path_costs_an_invocation_a_job_and_more(backlog: dict) -> None:
    invocations = backlog["invocations"]
    assert invocations["ExecutorFunction"] == JOBS  # one executor per delivery
    assert invocations["SchedulerFunction"] == backlog["ticks"] >= 1  # each tick reported back
    assert backlog["invocations_per_job"] == sum(invocations.values()) / JOBS >= 1
    assert backlog["pulls"] >= 1 and backlog["calls_per_job"]["result"] == 1.0


def test_write_units_cpu_and_cost_come_from_the_counts(backlog: dict) -> None:
    # Each ledger write costs at least a unit; a job is recorded and settled at least.
    assert backlog["ledger_writes_per_job"] >= 2
    assert backlog["ledger_table_units_per_job"] >= backlog["ledger_writes_per_job"]
    assert backlog["ledger_units_per_job"] == pytest.approx(
        backlog["ledger_table_units_per_job"] + backlog["ledger_index_units_per_job"])
    assert backlog["scheduler_cpu_s_per_job"] > 0 and backlog["scheduler_billed_s"] > 0
    priced = backlog["usd_breakdown"]
    assert priced["lambda_requests_usd"] == pytest.approx(
        1e6 * backlog["invocations_per_job"] * PRICES["lambda_request"].usd)
    assert priced["wru_per_job"] == pytest.approx(backlog["ledger_units_per_job"] + backlog["other_units_per_job"])
    assert backlog["usd_per_million_short_jobs"] == pytest.approx(
        priced["lambda_requests_usd"] + priced["lambda_gb_seconds_usd"] + priced["dynamodb_usd"])
    model = backlog["per_1000_concurrent"]
    assert model["jobs_per_s"] == min(model["executor_bound"], model["scheduler_bound"]) > 0


def test_pickups_while_busy_are_every_one_after_the_first_slots(backlog: dict) -> None:
    pickup = backlog["pickup_busy_s"]
    assert pickup["count"] == JOBS - CAPACITY
    assert 0 <= pickup["p50"] <= pickup["p95"]


def test_capacity_bounds_the_jobs_held_at_once(backlog: dict) -> None:
    assert 1 <= backlog["most_held_at_once"] <= CAPACITY
    assert backlog["reads_per_job"] >= 0


# -- the self-pull path: executors that keep pulling -----------------------------------------

def test_self_pull_settles_every_job_once(self_pulled: dict) -> None:
    assert self_pulled["errors"] == []
    assert self_pulled["drained"] and self_pulled["ticks_ended"]
    assert (self_pulled["settled_once"], self_pulled["settled_twice_or_more"], self_pulled["unsettled"]) == (
        JOBS, 0, 0)
    assert self_pulled["path"] == "self-pull" and self_pulled["capacity"] == CAPACITY


def test_self_pull_needs_fewer_executor_invocations_than_jobs(self_pulled: dict) -> None:
    invocations = self_pulled["invocations"]
    assert 1 <= invocations["ExecutorFunction"] < JOBS, invocations
    assert invocations["SchedulerFunction"] == self_pulled["ticks"] >= 1
    assert self_pulled["invocations_per_job"] == sum(invocations.values()) / JOBS


def test_self_pull_holds_no_more_than_capacity(self_pulled: dict) -> None:
    # The executors hand their own slot over and never take a new one past the limit.
    assert 1 <= self_pulled["most_held_at_once"] <= CAPACITY


def test_self_pull_writes_three_ledger_writes_a_job(self_pulled: dict) -> None:
    # record_running (record and claim in one), store_outcome, the final write; the
    # scheduler's deliveries (record, dispatch, start_run, ...) cost more, so the mean
    # is three or a little above, never below, and below the scheduler path's.
    assert 3 <= self_pulled["ledger_writes_per_job"] < 4, self_pulled["ledger_writes_per_job"]
    assert self_pulled["ledger_units_per_job"] < 6


def test_self_pull_model_prices_the_scheduler_per_executor_started(self_pulled: dict) -> None:
    # Executors hold their executions for executor ms per job; the scheduler starts executors,
    # each running up to self_pull_max_jobs (100) jobs under a long backlog.
    model = self_pulled["per_1000_concurrent"]
    assert model["executor_bound"] == pytest.approx(1000 / (self_pulled["executor_ms_per_job"] / 1000))
    assert model["jobs_per_executor"] == 100
    assert model["scheduler_cpu_s_per_executor"] == pytest.approx(
        self_pulled["scheduler_cpu_s_per_job"] * JOBS / self_pulled["invocations"]["ExecutorFunction"])
    assert model["scheduler_cpu_s_per_job"] == pytest.approx(model["scheduler_cpu_s_per_executor"] / 100)
    assert model["jobs_per_s"] == min(model["executor_bound"], model["scheduler_bound"]) > 0
    assert "500 jobs/s" in model["assumptions"]  # the in-flight index's one partition per instance


def test_held_at_once_counts_overlapping_takes() -> None:
    # (available, taken, settles): [1,5], [2,6], [5,7] (taken as the first settles), never settled from 9.
    times = [(0.0, 1.0, [5.0]), (0.0, 2.0, [6.0]), (0.0, 5.0, [7.0]), (0.0, 9.0, []), (0.0, None, [])]
    assert held_at_once(times) == 2
    assert held_at_once([]) == 0


def test_pickup_waits_for_the_settle_that_frees_a_slot() -> None:
    # Two slots: the third pickup could happen from the first settle (t=5) on, the fourth
    # from the second (t=6), or from its creation (t=9) if later.
    times = [(0.0, 1.0, [5.0]), (0.0, 2.0, [6.0]), (0.0, 5.5, [7.0]), (9.0, 9.25, [])]
    assert pickup_while_busy(times, capacity=2) == [0.5, 0.25]
    assert pickup_while_busy(times, capacity=4) == []


def test_an_unknown_path_is_refused_before_anything_starts() -> None:
    with pytest.raises(ValueError, match="carrier-pigeon"):
        measure_backlog("claimqueue", jobs=1, path="carrier-pigeon")


def test_the_table_puts_paths_side_by_side(backlog: dict) -> None:
    results = {"meta": {"protocols": ["claimqueue"]},
               "backlog": {"claimqueue": {"scheduler": backlog}}}
    text = report.render(results)
    assert "(i) a backlog of 20 jobs" in text and "claimqueue scheduler" in text
    assert "target <= 0.2 Lambda invocations / job: scheduler NOT met" in text
    later = {**backlog, "path": "self-pull", "invocations_per_job": 0.1}
    both = report.render({**results, "backlog": {"claimqueue": {"scheduler": backlog, "self-pull": later}}})
    header = next(line for line in both.splitlines() if "claimqueue scheduler" in line)
    assert "claimqueue self-pull" in header
    assert "scheduler NOT met, self-pull met" in both
