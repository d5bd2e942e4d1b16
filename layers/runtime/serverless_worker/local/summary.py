"""The end-of-run summary: counted from the ledger (every delivery this run took, and
where it ended), latencies from job creation, and HTTP calls per job by endpoint.

Reading the ledger once at the end (one scan of the state file) costs nothing per
job. Job creation time comes from the best source there is, and the table says which:
our own sandbox's admin history, else ``Delivery.created_at`` when the protocol sends
it, else the time the job was pulled. Latencies are labelled by where they start:
"created → ..." only for jobs whose creation time the server gave, "pulled → ..." for
the others (a latency from the pull is not one from the job's creation, and leaves out
the time the job waited on the server).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..outcome import OutcomeKind
from ..state import FINAL_STATUSES, LedgerStatus
from ..state.items import delivery_record

__all__ = ["JobRecord", "RunSummary", "ledger_records", "percentile", "render_summary", "summarize"]

_REPORTED = frozenset({LedgerStatus.REPORTED, LedgerStatus.ACKNOWLEDGED})
SOURCE_ADMIN = "sandbox admin history"
SOURCE_DELIVERY = "Delivery.created_at"
SOURCE_PULL = "pull time"


@dataclass(frozen=True)
class JobRecord:
    """One ledger item (one delivery), reduced to what the summary needs."""

    ledger_id: str
    job_id: str
    handler: str
    status: LedgerStatus
    outcome: OutcomeKind | None
    created_at: float | None     # as the protocol said (Delivery.created_at)
    pulled_at: float
    reported_at: float | None


def ledger_records(items: Iterable[Mapping[str, Any]]) -> list[JobRecord]:
    """Ledger items, as plain attributes (the SQLite store's documents, or ``from_item``'s)."""
    records: list[JobRecord] = []
    for attrs in items:
        delivery = delivery_record(dict(attrs))
        outcome = json.loads(attrs["outcome"]) if attrs.get("outcome") else None
        status = LedgerStatus(attrs["status"])
        records.append(JobRecord(
            ledger_id=str(delivery["ledger_id"]), job_id=str(delivery["job_id"]),
            handler=str(delivery["handler"]), status=status,
            outcome=OutcomeKind(outcome["kind"]) if outcome else None,
            created_at=delivery.get("created_at"), pulled_at=float(delivery["pulled_at"]),
            reported_at=_reported_at(dict(attrs), status)))
    return records


def _reported_at(attrs: dict[str, Any], status: LedgerStatus) -> float | None:
    """When the result went in: ``reported_at``; where report and acknowledgement were
    recorded in one write (the short path), that write's time, right after the ack call."""
    if "reported_at" in attrs:
        return float(attrs["reported_at"])
    if status is LedgerStatus.ACKNOWLEDGED and "report" in attrs:
        return float(attrs["updated_at"])
    return None


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile; ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


@dataclass
class RunSummary:
    """Everything the summary table shows."""

    protocol: str
    seconds: float
    taken: int = 0        # jobs
    deliveries: int = 0   # ledger items: a job delivered again counts once more here
    done: int = 0
    failed: Counter[str] = field(default_factory=Counter)  # outcome kind -> jobs
    retried: int = 0
    handed_back: int = 0
    discarded: int = 0
    in_flight: int = 0
    # Deliveries the ledger could not hold and no call settled ("job <id>: why", runtime/poison.py):
    # never in the ledger, so told by the run's observer.
    unsettled: list[str] = field(default_factory=list)
    handler_runs: int = 0
    executor_errors: int = 0
    to_start: list[float] = field(default_factory=list)    # from creation (the server gave it)
    to_report: list[float] = field(default_factory=list)
    pulled_to_start: list[float] = field(default_factory=list)   # from the pull (no creation time)
    pulled_to_report: list[float] = field(default_factory=list)
    creation_sources: Counter[str] = field(default_factory=Counter)
    client_calls: dict[str, int] = field(default_factory=dict)
    server_calls: dict[str, int] | None = None
    store_ops: dict[str, int] = field(default_factory=dict)
    busy_seconds: float | None = None  # first pull to last reported result

    @property
    def failed_total(self) -> int:
        return sum(self.failed.values())

    @property
    def definite(self) -> bool:
        """Every job taken reached a definite outcome: nothing left in flight or stranded."""
        return self.in_flight == 0 and not self.unsettled


def summarize(records: list[JobRecord], *, protocol: str, seconds: float, handler_starts: Mapping[str, float],
              handler_runs: int, executor_errors: int, admin_created: Mapping[str, float] | None,
              client_calls: Mapping[str, int], server_calls: Mapping[str, int] | None,
              store_ops: Mapping[str, int]) -> RunSummary:
    """Count jobs, not deliveries: a job delivered twice (a retry, a redelivery after a lost
    connection) is one job, and its outcome is that of its last reported delivery."""
    by_job: dict[str, list[JobRecord]] = {}
    for record in sorted(records, key=lambda r: r.pulled_at):
        by_job.setdefault(record.job_id, []).append(record)
    summary = RunSummary(protocol=protocol, seconds=seconds, taken=len(by_job), deliveries=len(records),
                         retried=len(records) - len(by_job), handler_runs=handler_runs,
                         executor_errors=executor_errors, client_calls=dict(client_calls),
                         server_calls=dict(server_calls) if server_calls is not None else None,
                         store_ops=dict(store_ops))
    pulled = [record.pulled_at for record in records]
    reported = [record.reported_at for record in records if record.reported_at is not None]
    if pulled and reported:
        summary.busy_seconds = max(0.0, max(reported) - min(pulled))
    summary.in_flight = sum(1 for record in records if record.status not in FINAL_STATUSES)
    for deliveries in by_job.values():
        _count_job(summary, deliveries, admin_created, handler_starts)
    return summary


def _count_job(summary: RunSummary, deliveries: list[JobRecord], admin_created: Mapping[str, float] | None,
               handler_starts: Mapping[str, float]) -> None:
    """One job's outcome (its last reported delivery, else its last delivery) and latencies."""
    created, source = _created(deliveries[0], admin_created)
    summary.creation_sources[source] += 1
    to_start, to_report = ((summary.pulled_to_start, summary.pulled_to_report) if source == SOURCE_PULL
                           else (summary.to_start, summary.to_report))
    starts = [handler_starts[d.ledger_id] for d in deliveries if d.ledger_id in handler_starts]
    if starts:
        to_start.append(max(0.0, min(starts) - created))
    reported = [d for d in deliveries if d.status in _REPORTED and d.outcome is not None]
    if reported:
        last = reported[-1]
        if last.outcome is OutcomeKind.SUCCESS:
            summary.done += 1
        else:
            summary.failed[str(last.outcome.value if last.outcome else "unknown")] += 1
        if last.reported_at is not None:
            to_report.append(max(0.0, last.reported_at - created))
    elif deliveries[-1].status is LedgerStatus.HANDED_BACK:
        summary.handed_back += 1
    elif deliveries[-1].status is LedgerStatus.DISCARDED:
        summary.discarded += 1


def _created(record: JobRecord, admin_created: Mapping[str, float] | None) -> tuple[float, str]:
    if admin_created is not None and record.job_id in admin_created:
        return admin_created[record.job_id], SOURCE_ADMIN
    if record.created_at is not None:
        return float(record.created_at), SOURCE_DELIVERY
    return record.pulled_at, SOURCE_PULL


# -- rendering --------------------------------------------------------------------------------

_KIND_NAMES = {"business_error": "business rejection", "bad_input": "bad input", "failure": "error",
               "timeout": "timeout"}


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 10 else f"{value:.1f} s"


def _latency(values: list[float]) -> str:
    return f"p50 {_ms(percentile(values, 50))} · p95 {_ms(percentile(values, 95))} (n={len(values)})"


def render_summary(summary: RunSummary) -> Any:
    """The summary as rich renderables (two tables), for ``Console.print``."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    jobs = Table(title=f"serverless-worker local · {summary.protocol} · {summary.seconds:.1f} s",
                 box=box.SIMPLE_HEAD, show_header=True, title_justify="left")
    jobs.add_column("jobs", style="bold")
    jobs.add_column("", justify="right")
    jobs.add_column("", style="dim")
    busy = summary.busy_seconds
    rate = f"{summary.taken / busy:.1f} jobs/s from first pull to last result" if busy else ""
    failed_detail = ", ".join(f"{_KIND_NAMES.get(kind, kind)} {n}"
                              for kind, n in sorted(summary.failed.items()))
    jobs.add_row("taken", str(summary.taken), rate)
    jobs.add_row("done", str(summary.done), "succeeded, result reported")
    jobs.add_row("failed", str(summary.failed_total), failed_detail or "result reported")
    jobs.add_row("retried", str(summary.retried),
                 f"deliveries beyond a job's first ({summary.deliveries} deliveries in all)")
    jobs.add_row("handed back", str(summary.handed_back), "returned unstarted, no attempt used")
    if summary.discarded:
        jobs.add_row("discarded", str(summary.discarded), "stale, refused or lost lease; no result")
    jobs.add_row("still in flight", str(summary.in_flight),
                 "none: every delivery has a definite outcome" if summary.definite
                 else "deliveries left without an outcome")
    if summary.unsettled:
        jobs.add_row("left unsettled", str(len(summary.unsettled)), "; ".join(summary.unsettled))
    jobs.add_row("handler runs", str(summary.handler_runs), "continuation slices count each")
    if summary.executor_errors:
        jobs.add_row("executor errors", str(summary.executor_errors), "invocations that failed every retry")
    for origin, to_start, to_report in (("created", summary.to_start, summary.to_report),
                                        ("pulled", summary.pulled_to_start, summary.pulled_to_report)):
        if to_start or to_report:  # only the origins some job has: "created" needs the server's time
            jobs.add_row(f"{origin} → handler start", "", _latency(to_start))
            jobs.add_row(f"{origin} → result reported", "", _latency(to_report))
    sources = ", ".join(f"{source} ({n})" for source, n in summary.creation_sources.most_common())
    jobs.add_row("job creation time from", "", sources or "-")

    calls = Table(title="HTTP calls per job, by endpoint", box=box.SIMPLE_HEAD, title_justify="left")
    calls.add_column("endpoint", style="bold")
    calls.add_column("client calls", justify="right")
    calls.add_column("per job", justify="right")
    if summary.server_calls is not None:
        calls.add_column("sandbox saw", justify="right")
    endpoints = sorted(set(summary.client_calls) | set(summary.server_calls or {}))
    for endpoint in endpoints:
        count = summary.client_calls.get(endpoint, 0)
        row = [endpoint, str(count), f"{count / summary.taken:.2f}" if summary.taken else "-"]
        if summary.server_calls is not None:
            row.append(str(summary.server_calls.get(endpoint, 0)))
        calls.add_row(*row)
    total = sum(summary.client_calls.values())
    total_row = ["total", str(total), f"{total / summary.taken:.2f}" if summary.taken else "-"]
    if summary.server_calls is not None:
        total_row.append(str(sum(summary.server_calls.values())))
    calls.add_row(*total_row, style="bold")
    parts: list[Any] = [jobs, calls]
    ops = summary.store_ops
    if ops and summary.taken:
        reads, writes = ops.get("read", 0) / summary.taken, ops.get("write", 0) / summary.taken
        parts.append(Text(f"state store (SQLite file): {reads:.1f} reads and {writes:.1f} writes "
                          "per job", style="dim"))
    return Group(*parts)
