"""The local run's summary: jobs, not deliveries, and latencies labelled by where they
start: "created → ..." only for jobs whose creation time the server gave, "pulled → ..."
for the others."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from serverless_worker.local.summary import JobRecord, render_summary, summarize
from serverless_worker.model import LedgerStatus, OutcomeKind


def record(job: str, attempt: int, *, created: float | None, pulled: float, reported: float | None,
           status: LedgerStatus = LedgerStatus.ACKNOWLEDGED,
           outcome: OutcomeKind | None = OutcomeKind.SUCCESS) -> JobRecord:
    return JobRecord(ledger_id=f"{job}:{attempt}", job_id=job, handler="double", status=status, outcome=outcome,
                     created_at=created, pulled_at=pulled, reported_at=reported)


def text(records: list[JobRecord], starts: dict[str, float], **extra: Any) -> str:
    summary = summarize(records, protocol="priostack", seconds=1.0, handler_starts=starts, handler_runs=len(starts),
                        executor_errors=0, admin_created=extra.get("admin_created"), client_calls={},
                        server_calls=None, store_ops={})
    console = Console(width=140, record=True, file=io.StringIO())
    console.print(render_summary(summary))
    return console.export_text()


def test_without_a_creation_time_the_latency_is_labelled_from_the_pull() -> None:
    out = text([record("a", 1, created=None, pulled=100.0, reported=100.5)], {"a:1": 100.2})

    assert "pulled → handler start" in out and "pulled → result reported" in out
    assert "created →" not in out
    assert "pull time (1)" in out


def test_with_the_servers_creation_time_the_latency_is_from_creation() -> None:
    out = text([record("a", 1, created=99.0, pulled=100.0, reported=100.5)], {"a:1": 100.2})

    assert "created → handler start" in out and "p50 1200 ms" in out
    assert "pulled →" not in out


def test_mixed_sources_get_one_row_each() -> None:
    records = [record("a", 1, created=99.0, pulled=100.0, reported=100.5),
               record("b", 1, created=None, pulled=100.0, reported=100.5)]

    out = text(records, {"a:1": 100.2, "b:1": 100.1})

    assert "created → handler start" in out and "pulled → handler start" in out
    assert out.count("(n=1)") == 4


def test_a_job_delivered_twice_is_one_job_with_its_last_outcome() -> None:
    records = [record("a", 1, created=None, pulled=100.0, reported=100.5, outcome=OutcomeKind.FAILURE),
               record("a", 2, created=None, pulled=101.0, reported=101.5)]

    summary = summarize(records, protocol="priostack", seconds=1.0, handler_starts={}, handler_runs=2,
                        executor_errors=0, admin_created=None, client_calls={}, server_calls=None, store_ops={})

    assert (summary.taken, summary.done, summary.failed_total, summary.retried) == (1, 1, 0, 1)


def test_failed_jobs_are_listed_with_code_and_message_and_the_deliberate_ones_say_so() -> None:
    records = [
        JobRecord(ledger_id="a:1", job_id="a", handler="pay", status=LedgerStatus.ACKNOWLEDGED,
                  outcome=OutcomeKind.BUSINESS_ERROR, created_at=None, pulled_at=100.0, reported_at=100.5,
                  code="CARD_DECLINED", message="the card was declined"),
        JobRecord(ledger_id="b:1", job_id="b", handler="pay", status=LedgerStatus.ACKNOWLEDGED,
                  outcome=OutcomeKind.FAILURE, created_at=None, pulled_at=101.0, reported_at=101.5,
                  code="ValueError", message="ValueError: " + "x" * 300 + "\nsecond line"),
        record("c", 1, created=None, pulled=102.0, reported=102.5),
    ]
    summary = summarize(records, protocol="priostack", seconds=1.0, handler_starts={}, handler_runs=3,
                        executor_errors=0, admin_created=None, client_calls={"pull": 3}, server_calls=None,
                        store_ops={"read": 3, "write": 9}, deliberate={"a": "on purpose"})
    console = Console(width=140, record=True, file=io.StringIO())
    console.print(render_summary(summary), soft_wrap=True)
    out = console.export_text()

    assert "failed (2): job id, handler, code: message" in out
    assert "a  pay  CARD_DECLINED: the card was declined  [on purpose]" in out
    # the whole message, on one line however narrow the console, its type said once
    assert "\n  b  pay  ValueError: " + "x" * 300 + "\n      second line\n" in out
    assert "ValueError: ValueError" not in out
    assert "1 on purpose (the demo's), listed below" in out
    assert "  c  " not in out                                      # a success is not listed
    # without stats, no benchmark tables; with them, both
    assert "HTTP calls per job" not in out and "state store" not in out
    console.print(render_summary(summary, stats=True))
    out = console.export_text()
    assert "HTTP calls per job, by endpoint" in out and "1.0 reads and 3.0 writes per job" in out
