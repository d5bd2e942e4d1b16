"""The local run's verdict: a run that leaves a delivery without a definite outcome on the
server, or that got answers it could not use, lists them (job id, why) and exits non-zero;
"every delivery has a definite outcome" only when it is so."""

from __future__ import annotations

import io

from rich.console import Console

from serverless_worker.local.observe import RunObserver
from serverless_worker.local.summary import JobRecord, RunSummary, render_summary, summarize
from serverless_worker.local.worker import EXIT_INCOMPLETE, LocalRunner
from serverless_worker.model import LedgerStatus, OutcomeKind

S = LedgerStatus
DEFINITE = "none: every delivery has a definite outcome"


def record(job: str, status: LedgerStatus = S.ACKNOWLEDGED, *, outcome: OutcomeKind | None = OutcomeKind.SUCCESS,
           error: str | None = None, unconfirmed: bool = False) -> JobRecord:
    return JobRecord(ledger_id=f"{job}:r3", job_id=job, handler="double", status=status, outcome=outcome,
                     created_at=None, pulled_at=100.0, reported_at=100.5 if status is S.ACKNOWLEDGED else None,
                     error=error, unconfirmed=unconfirmed)


def summary_of(records: list[JobRecord], observer: RunObserver | None = None) -> RunSummary:
    observer = observer or RunObserver()
    return summarize(records, protocol="priostack", seconds=1.0, handler_starts={}, handler_runs=len(records),
                     executor_errors=0, admin_created=None, client_calls={}, server_calls=None, store_ops={},
                     unsettled=observer.unsettled_deliveries(), unusable=observer.unusable_answers())


def rendered(summary: RunSummary) -> str:
    console = Console(width=160, record=True, file=io.StringIO())
    console.print(render_summary(summary))
    return console.export_text()


def verdict(summary: RunSummary) -> tuple[int, str]:
    out = io.StringIO()
    runner = LocalRunner(settings=None, own_sandbox=True, console=Console(file=out, width=200), live=False)
    status, said = runner._verdict(summary, forced=False)
    return status, said or ""


def test_every_delivery_settled_is_definite_and_exits_0() -> None:
    # given deliveries all settled, one of them reported after an ambiguous retry (404: applied)
    summary = summary_of([record("a"), record("b", unconfirmed=True), record("c", S.HANDED_BACK, outcome=None)])

    # then the run says so and exits 0
    assert summary.definite and not summary.unsettled
    assert DEFINITE in rendered(summary)
    assert verdict(summary)[0] == 0


def test_deliveries_left_in_flight_are_listed_with_why_and_exit_non_zero() -> None:
    # given one delivery per status that has no definite outcome on the server
    records = [record("done-1"), record("run-1", S.RUNNING, outcome=None),
               record("stored-1", S.OUTCOME_STORED), record("new-1", S.RECORDED, outcome=None),
               record("gone-1", S.DISCARDED, outcome=None, unconfirmed=True,
                      error="abandoned after 10 failed settling calls in a row (last: 503)")]
    summary = summary_of(records)

    # then each is listed, job id and why, and the run exits 1 saying how many
    assert not summary.definite
    assert summary.unsettled == {
        "run-1": "handler still running at shutdown", "stored-1": "outcome stored, report not confirmed",
        "new-1": "taken, never started",
        "gone-1": "settling abandoned: abandoned after 10 failed settling calls in a row (last: 503)"}
    out = rendered(summary)
    assert DEFINITE not in out and "4 deliveries without a definite outcome" in out
    for job_id, why in summary.unsettled.items():
        assert f"{job_id}  {why}" in out
    assert "done-1  " not in out
    status, said = verdict(summary)
    assert status == EXIT_INCOMPLETE and "4 deliveries left without a definite outcome" in said


def test_a_delivery_the_run_reported_unsettled_counts_though_the_ledger_never_saw_it() -> None:
    # given a job activated and never recorded (the run gave it up), and one in the ledger running
    observer = RunObserver()
    observer.unsettled("2251799813685250", "activated, never completed: stranded")
    observer.unsettled("2251799813685250", "a second reason is not kept")
    observer.unsettled("run-1", "handler abandoned at shutdown")
    summary = summary_of([record("a"), record("run-1", S.RUNNING, outcome=None)], observer)

    # then both are listed, the run's own reason before the ledger's, and the run exits 1
    assert summary.unsettled == {"2251799813685250": "activated, never completed: stranded",
                                 "run-1": "handler abandoned at shutdown"}
    assert summary.in_flight == 1 and not summary.definite
    assert verdict(summary)[0] == EXIT_INCOMPLETE


def test_unusable_answers_are_listed_and_exit_non_zero_though_every_delivery_settled() -> None:
    # given a run whose every delivery settled, but whose pulls got answers it could not use
    observer = RunObserver()
    for _ in range(3):
        observer.unusable_answer("pull: response body is not JSON")
    observer.unusable_answer("pull: unexpected status\x1b[31m")
    summary = summary_of([record("a")], observer)

    # then they are counted by reason (control characters escaped) and the run exits 1
    out = rendered(summary)
    assert "answers from the server the worker could not use (4):" in out
    assert "3  pull: response body is not JSON" in out and "unexpected status\\x1b[31m" in out
    status, said = verdict(summary)
    assert status == EXIT_INCOMPLETE and "sent 4 answers the worker could not use" in said


def test_a_long_list_is_cut_and_counted() -> None:
    observer = RunObserver()
    for n in range(25):
        observer.unsettled(f"job-{n:02d}", "activated, never completed: stranded")

    out = rendered(summary_of([], observer))

    assert "without a definite outcome on the server (25)" in out and "... and 5 more" in out
    assert "job-19  " in out and "job-20  " not in out
