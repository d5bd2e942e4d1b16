"""The local runner's live job counts: each job once, where it stands now, as the summary
counts it (its last reported result, else how its last delivery ended)."""

from __future__ import annotations

from dataclasses import dataclass

from serverless_worker.local.observe import JobCounts, RunObserver


@dataclass(frozen=True)
class D:
    job_id: str
    ledger_id: str


def test_a_job_retried_after_a_failure_is_one_job_done() -> None:
    observer = RunObserver()
    observer.recorded(D("a", "a:r3"))
    observer.settled(D("a", "a:r3"), "failed")
    observer.recorded(D("a", "a:r2"))

    assert observer.jobs() == JobCounts(taken=1, running=1)

    observer.settled(D("a", "a:r2"), "done")
    assert observer.jobs() == JobCounts(taken=1, done=1)


def test_a_handed_back_redelivery_keeps_the_reported_result() -> None:
    observer = RunObserver()
    for how, ledger in (("failed", "b:1"), ("handed_back", "b:2")):
        observer.recorded(D("b", ledger))
        observer.settled(D("b", ledger), how)
    observer.recorded(D("c", "c:1"))
    observer.settled(D("c", "c:1"), "handed_back")

    assert observer.jobs() == JobCounts(taken=2, failed=1, handed_back=1)


@dataclass(frozen=True)
class P:
    job_id: str
    ledger_id: str
    handler: str = "slow"


def test_job_progress_is_kept_as_given_the_last_per_job_until_shown() -> None:
    # given two running jobs reporting progress
    observer = RunObserver()
    for job in ("a", "b"):
        observer.recorded(P(job, f"{job}:1"))
    observer.progress(P("a", "a:1"), 10)
    observer.progress(P("b", "b:1"), {"page": 1})
    observer.progress(P("a", "a:1"), 20)

    # then each job's last value is there, oldest report first, and the live view gets the latest
    assert [(e.job_id, e.value) for e in observer.progress_after(0)] == [("b", {"page": 1}), ("a", 20)]
    assert [e.job_id for e in observer.running_progress(1)] == ["a"]

    # when a job settles before its last value was shown
    seen = max(e.seq for e in observer.progress_after(0))
    observer.progress(P("b", "b:1"), {"page": 2})
    observer.settled(P("b", "b:1"), "done")

    # then the log still gets that value once, and the live view no longer shows the job
    assert [(e.job_id, e.value) for e in observer.progress_after(seen)] == [("b", {"page": 2})]
    assert observer.progress_after(seen) == []
    assert [e.job_id for e in observer.running_progress(3)] == ["a"]
