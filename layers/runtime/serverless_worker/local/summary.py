"""The end-of-run summary: counted from the ledger (every delivery this run took, and
where it ended), latencies from job creation, and HTTP calls per job by endpoint.

Reading the ledger once at the end (one scan of the state file) costs nothing per
job. Job creation time comes from the best source there is, and the table says which:
our own sandbox's admin history, else ``Delivery.created_at`` when the protocol sends
it, else the time the job was pulled. Latencies are labelled by where they start:
"created → ..." only for jobs whose creation time the server gave, "pulled → ..." for
the others (a latency from the pull is not one from the job's creation, and leaves out
the time the job waited on the server).

The exit status stands on :attr:`RunSummary.definite`: every delivery this run took has a
definite outcome on the server. What has not is listed, job id and why: each ledger item
still in flight (its status says why, ``unsettled_reason``), each whose settling was
abandoned, and what other parts of the run reported to the observer
(``RunObserver.unsettled``); and so are the server's answers the worker could not use
(``RunObserver.unusable_answer``).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..model import FINAL_STATUSES, LedgerStatus, OutcomeKind
from ..state.items import delivery_record
from ..textforms import clipped_line, coded_message

__all__ = ["DoneJob", "FailedJob", "JobRecord", "RunSummary", "ledger_records", "percentile", "render_summary",
           "summarize", "summary_document", "unsettled_reason"]

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
    error: str | None = None          # why it was handed back, discarded or abandoned
    unconfirmed: bool = False         # the server answered "not found" or settling was abandoned
    code: str | None = None           # the stored outcome's error code (a failure's)
    message: str | None = None        # and its message
    value: Any = None                 # the stored outcome's value (a success's result)


# Why a ledger item still in flight at the end has no definite outcome on the server.
_IN_FLIGHT_REASONS = {
    LedgerStatus.RECORDED: "taken, never started",
    LedgerStatus.DISPATCHED: "taken, never started",
    LedgerStatus.DISPATCH_FAILED: "dispatch failed, never handed back",
    LedgerStatus.RUNNING: "handler still running at shutdown",
    LedgerStatus.OUTCOME_STORED: "outcome stored, report not confirmed",
    LedgerStatus.REPORTED: "reported, acknowledgement not confirmed",
}
_REASON_MAX = 160


def unsettled_reason(record: JobRecord) -> str | None:
    """Why this delivery has no definite outcome on the server, or ``None`` when it has:
    every status in flight, and a delivery whose settling was given up (``mark_abandoned``:
    discarded, unconfirmed), which the server still holds."""
    if record.status in _IN_FLIGHT_REASONS:
        return _IN_FLIGHT_REASONS[record.status]
    if record.status is LedgerStatus.DISCARDED and record.unconfirmed:
        why = f"settling abandoned: {record.error or 'no reason recorded'}"
        return why if len(why) <= _REASON_MAX else why[:_REASON_MAX - 3] + "..."
    return None


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
            reported_at=_reported_at(dict(attrs), status), error=attrs.get("error"),
            unconfirmed=bool(attrs.get("unknown_to_server", False)),
            code=outcome.get("error_code") if outcome else None,
            message=outcome.get("message") if outcome else None,
            value=outcome.get("value") if outcome else None))
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


@dataclass(frozen=True)
class FailedJob:
    """A job whose last reported result is a failure: what the summary lists for it."""

    job_id: str
    handler: str
    kind: str
    code: str | None
    message: str | None
    deliberate: str | None = None   # why it fails on purpose (the demo's), else None


@dataclass(frozen=True)
class DoneJob:
    """A job whose last reported result is a success, with what it returned."""

    job_id: str
    handler: str
    result: Any


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
    unsettled: dict[str, str] = field(default_factory=dict)  # job id -> why it has no definite outcome
    unusable: Counter[str] = field(default_factory=Counter)  # server answers not usable, by reason
    # Deliveries the server sent that were not asked for (another type, outside the criteria,
    # beyond the count), given back untouched: by kind (type, criteria, count).
    not_asked_for: Counter[str] = field(default_factory=Counter)
    failed_jobs: list[FailedJob] = field(default_factory=list)  # in the order they were pulled
    done_jobs: list[DoneJob] = field(default_factory=list)      # likewise

    @property
    def failed_total(self) -> int:
        return sum(self.failed.values())

    @property
    def definite(self) -> bool:
        """Every delivery taken reached a definite outcome on the server: nothing left in
        flight, stranded or abandoned."""
        return self.in_flight == 0 and not self.unsettled


def summarize(records: list[JobRecord], *, protocol: str, seconds: float, handler_starts: Mapping[str, float],
              handler_runs: int, executor_errors: int, admin_created: Mapping[str, float] | None,
              client_calls: Mapping[str, int], server_calls: Mapping[str, int] | None,
              store_ops: Mapping[str, int], unsettled: Mapping[str, str] | None = None,
              unusable: Mapping[str, int] | None = None, not_asked_for: Mapping[str, int] | None = None,
              deliberate: Mapping[str, str] | None = None) -> RunSummary:
    """Count jobs, not deliveries: a job delivered twice (a retry, a redelivery after a lost
    connection) is one job, and its outcome is that of its last reported delivery.

    ``unsettled`` (job id -> why) and ``unusable`` (reason -> answers) are what the run's
    other parts reported (``RunObserver``); the ledger's own unsettled deliveries join them,
    a reason reported by the run taking precedence over the one the ledger's status gives.
    ``deliberate`` (job id -> why) marks the jobs that fail on purpose (the demo's)."""
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
    summary.unsettled = dict(unsettled or {})
    for record in records:
        reason = unsettled_reason(record)
        if reason is not None:
            summary.unsettled.setdefault(record.job_id, reason)
    summary.unusable = Counter(dict(unusable or {}))
    summary.not_asked_for = Counter(dict(not_asked_for or {}))
    for deliveries in by_job.values():
        _count_job(summary, deliveries, admin_created, handler_starts, deliberate or {})
    return summary


def _count_job(summary: RunSummary, deliveries: list[JobRecord], admin_created: Mapping[str, float] | None,
               handler_starts: Mapping[str, float], deliberate: Mapping[str, str]) -> None:
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
            summary.done_jobs.append(DoneJob(job_id=last.job_id, handler=last.handler, result=last.value))
        else:
            kind = str(last.outcome.value if last.outcome else "unknown")
            summary.failed[kind] += 1
            summary.failed_jobs.append(FailedJob(job_id=last.job_id, handler=last.handler, kind=kind,
                                                 code=last.code, message=last.message,
                                                 deliberate=deliberate.get(last.job_id)))
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

_LISTED_MAX = 20  # deliveries (and answer reasons) listed one a line; the rest are counted


def _printable(text: str) -> str:
    """Server-given text (job ids, error messages) with control characters escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _failed_jobs(summary: RunSummary) -> list[Any]:
    """The failed jobs, one each: job id, handler, then the code and the whole message (the
    code once: an exception's message already starts with its type); a message of several
    lines goes on below, indented. The deliberate ones say so, and why."""
    from rich.text import Text

    if not summary.failed_jobs:
        return []
    lines = [f"failed ({len(summary.failed_jobs)}): job id, handler, code: message"]
    for job in summary.failed_jobs[:_LISTED_MAX]:
        code = job.code or _KIND_NAMES.get(job.kind, job.kind)
        first, *more = coded_message(code, job.message, "no message").splitlines() or [""]
        note = f"  [{job.deliberate}]" if job.deliberate else ""
        lines.append(f"  {_printable(job.job_id)}  {_printable(job.handler)}  {_printable(first)}{note}")
        lines += [f"      {_printable(line)}" for line in more]
    if len(summary.failed_jobs) > _LISTED_MAX:
        lines.append(f"  ... and {len(summary.failed_jobs) - _LISTED_MAX} more "
                     "(`serverless-worker ledger --status failed` lists them all)")
    deliberate = all(job.deliberate for job in summary.failed_jobs)
    return [Text("\n".join(lines) + "\n", style="dim" if deliberate else "yellow")]


_RESULT_MAX = 160  # a result in the list of results


def _results(summary: RunSummary) -> list[Any]:
    """What each job that succeeded returned, one a line (clipped): shown when the job
    server was the built-in sandbox, which ends with the run, so nothing else can show them."""
    from rich.text import Text

    if not summary.done_jobs:
        return []
    lines = [f"results ({len(summary.done_jobs)}): job id, handler, result"]
    for job in summary.done_jobs[:_LISTED_MAX]:
        text = json.dumps(job.result, separators=(", ", ": "), default=str, ensure_ascii=False)
        text = clipped_line(text, _RESULT_MAX)
        lines.append(f"  {_printable(job.job_id)}  {_printable(job.handler)}  {_printable(text)}")
    if len(summary.done_jobs) > _LISTED_MAX:
        lines.append(f"  ... and {len(summary.done_jobs) - _LISTED_MAX} more")
    return [Text("\n".join(lines) + "\n", style="green")]


def _trouble(summary: RunSummary) -> list[Any]:
    """The deliveries without a definite outcome and the unusable answers, one a line."""
    from rich.text import Text

    parts: list[Any] = []
    if summary.unsettled:
        lines = [f"without a definite outcome on the server ({len(summary.unsettled)}): job id, why"]
        items = sorted(summary.unsettled.items())
        lines += [f"  {_printable(job_id)}  {_printable(why)}" for job_id, why in items[:_LISTED_MAX]]
        if len(items) > _LISTED_MAX:
            lines.append(f"  ... and {len(items) - _LISTED_MAX} more")
        parts.append(Text("\n".join(lines) + "\n", style="bold red"))
    if summary.unusable:
        total = sum(summary.unusable.values())
        lines = [f"answers from the server the worker could not use ({total}):"]
        common = summary.unusable.most_common()
        lines += [f"  {count}  {_printable(reason)}" for reason, count in common[:_LISTED_MAX]]
        if len(common) > _LISTED_MAX:
            lines.append(f"  ... and {len(common) - _LISTED_MAX} other reasons")
        parts.append(Text("\n".join(lines) + "\n", style="bold red"))
    return parts

_NOT_ASKED_NAMES = {"type": "another type or handler", "criteria": "outside the criteria",
                    "count": "beyond the count asked for"}
_KIND_NAMES = {"business_error": "business rejection", "bad_input": "bad input", "failure": "error",
               "timeout": "timeout"}


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 10 else f"{value:.1f} s"


def _latency(values: list[float]) -> str:
    return f"p50 {_ms(percentile(values, 50))} · p95 {_ms(percentile(values, 95))} (n={len(values)})"


_LATENCIES = {"created_to_handler_start": "to_start", "created_to_result_reported": "to_report",
              "pulled_to_handler_start": "pulled_to_start", "pulled_to_result_reported": "pulled_to_report"}


def summary_document(summary: RunSummary, *, exit_status: int, verdict: str | None) -> dict[str, Any]:
    """The summary as JSON-able data (``local --json``): every field of :class:`RunSummary`
    as pydantic dumps it, the latency lists as p50/p95/n (seconds), and the run's exit
    status with the line that explains it (``None`` when the run succeeded)."""
    from pydantic import TypeAdapter

    data: dict[str, Any] = TypeAdapter(RunSummary).dump_python(summary, mode="json")
    latency = {}
    for name, attribute in _LATENCIES.items():
        values = data.pop(attribute)
        if values:
            latency[name] = {"p50": percentile(values, 50), "p95": percentile(values, 95), "n": len(values)}
    data.update(failed_total=summary.failed_total, definite=summary.definite, latency_seconds=latency,
                exit_status=exit_status, verdict=verdict)
    return data


def render_summary(summary: RunSummary, *, stats: bool = False, results: bool = False) -> Any:
    """The summary as rich renderables, for ``Console.print(..., soft_wrap=True)`` (so a
    message is never cut or wrapped mid-word): the jobs table, the failed jobs, what has no
    definite outcome; with ``results`` (a run on the built-in sandbox, whose jobs end with
    it) what each job returned; with ``stats`` (``local --stats``) also the HTTP calls per
    job by endpoint and the state store's reads and writes per job."""
    from rich import box
    from rich.console import Group
    from rich.table import Table

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
    on_purpose = sum(1 for job in summary.failed_jobs if job.deliberate)
    if on_purpose:
        failed_detail += f" · {'all' if on_purpose == summary.failed_total else on_purpose} on purpose (the demo's)"
    jobs.add_row("failed", str(summary.failed_total),
                 f"{failed_detail}, listed below" if failed_detail else "result reported")
    jobs.add_row("retried", str(summary.retried),
                 f"deliveries beyond a job's first ({summary.deliveries} deliveries in all)")
    jobs.add_row("handed back", str(summary.handed_back), "returned unstarted, no attempt used")
    if summary.discarded:
        jobs.add_row("discarded", str(summary.discarded), "stale, refused or lost lease; no result")
    if summary.not_asked_for:
        kinds = ", ".join(f"{_NOT_ASKED_NAMES.get(kind, kind)} {n}"
                          for kind, n in sorted(summary.not_asked_for.items()))
        jobs.add_row("not asked for", str(sum(summary.not_asked_for.values())),
                     f"given back untouched, not run, no attempt used: {kinds}")
    if summary.definite:
        in_flight = "none: every delivery has a definite outcome"
    else:
        count = len(summary.unsettled)
        in_flight = f"{count} deliver{'y' if count == 1 else 'ies'} without a definite outcome, listed below"
    jobs.add_row("still in flight", str(summary.in_flight), in_flight)
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
    parts: list[Any] = [jobs, *(_results(summary) if results else []), *_failed_jobs(summary), *_trouble(summary)]
    if stats:
        parts += _stats(summary)
    return Group(*parts)


def _stats(summary: RunSummary) -> list[Any]:
    """HTTP calls per job by endpoint (the client's count and the sandbox's) and the state
    store's operations per job: for benchmarks and tuning, not for every run."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

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
    parts: list[Any] = [calls]
    ops = summary.store_ops
    if ops and summary.taken:
        reads, writes = ops.get("read", 0) / summary.taken, ops.get("write", 0) / summary.taken
        parts.append(Text(f"state store (SQLite file): {reads:.1f} reads and {writes:.1f} writes "
                          "per job", style="dim"))
    return parts
