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
