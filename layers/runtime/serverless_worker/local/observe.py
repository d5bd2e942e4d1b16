"""What the local runner sees as it happens, kept in memory: arrivals, executors running,
handler starts, and each job's deliveries. Nothing here does I/O, so watching a run adds
no calls per job.

Handler starts are taken by wrapping each handler function (``instrument``): the ledger
knows when a run was claimed, but only the wrapper knows when the handler itself began.
Jobs are counted as the end-of-run summary counts them (``summary.summarize``): a job
delivered again (a retry, a redelivery) is one job, whose outcome is its last reported
result, else how its last delivery ended. The runtime tells the observer of each
delivery recorded and settled (``runtime.watcher.DeliveryWatcher``), so the live status
line and the summary count the same unit.

What the run leaves without a definite outcome, and the server answers it could not use,
are fed here by whichever part of the run finds them (:meth:`RunObserver.unsettled`,
:meth:`RunObserver.unusable_answer`); the summary lists them and the exit status is then
non-zero.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from ..registry import HandlerRegistry

__all__ = ["JobCounts", "JobProgress", "RunObserver", "instrument"]


@dataclasses.dataclass(frozen=True)
class JobCounts:
    """Jobs taken so far, by where each stands now."""

    taken: int = 0
    running: int = 0        # a delivery of it is recorded and not settled yet
    done: int = 0
    failed: int = 0
    handed_back: int = 0
    discarded: int = 0


@dataclasses.dataclass
class _Job:
    open: set[str] = dataclasses.field(default_factory=set)  # ledger ids recorded, not yet settled
    reported: str | None = None   # "done" or "failed": its last reported result
    last: str | None = None       # how its last settled delivery ended


@dataclasses.dataclass(frozen=True)
class JobProgress:
    """The last ``job.progress`` value of a running job, as the handler gave it (formatted
    only when shown); ``seq`` orders reports across jobs."""

    job_id: str
    handler: str
    value: Any
    seq: int


class RunObserver:
    """Thread-safe counters of one local run."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.started_at = clock()
        self.arrivals = 0
        self.last_arrival: float | None = None
        self.executors_running = 0
        self.executor_errors = 0
        self.handler_runs = 0
        self.handler_starts: dict[str, float] = {}  # ledger id -> wall time the handler first started
        self._jobs: dict[str, _Job] = {}             # job id -> its deliveries (DeliveryWatcher)
        self._unsettled: dict[str, str] = {}         # job id -> why it has no definite outcome
        self._unusable: Counter[str] = Counter()     # answers the worker could not use, by reason
        self._progress: dict[str, JobProgress] = {}  # job id -> its last job.progress, while it runs
        self._progress_ended: list[JobProgress] = []  # those of jobs since settled, until shown
        self._progress_seq = 0
        self._not_asked: Counter[str] = Counter()    # deliveries given back as not asked for, by kind
        self.capacity = threading.Event()  # set whenever an executor finishes (a slot is free)
        self._pulls = 0                    # pulls in flight (pull_begins .. pull_ended)
        self._pulls_closed = False         # the run ended at its idle edge: no pull starts

    def restart_clock(self) -> None:
        """Idleness counts from now (the worker is ready), not from when start-up began."""
        with self._lock:
            self.started_at = self._clock()

    def arrived(self) -> None:
        """A delivery was recorded and dispatched (an executor or an execution is on its way)."""
        with self._lock:
            self.arrivals += 1
            self.last_arrival = self._clock()

    def executor_started(self) -> None:
        with self._lock:
            self.executors_running += 1

    def executor_finished(self, failed: bool) -> None:
        with self._lock:
            self.executors_running -= 1
            self.executor_errors += int(failed)
        self.capacity.set()

    def handler_started(self, ledger_id: str) -> None:
        now = time.time()
        with self._lock:
            self.handler_runs += 1
            self.handler_starts.setdefault(ledger_id, now)  # a continued job keeps its first start

    # -- runtime.watcher.DeliveryWatcher --------------------------------------------------
    def recorded(self, delivery: Any) -> None:
        with self._lock:
            self._jobs.setdefault(str(delivery.job_id), _Job()).open.add(str(delivery.ledger_id))

    def settled(self, delivery: Any, how: str) -> None:
        with self._lock:
            job = self._jobs.setdefault(str(delivery.job_id), _Job())
            job.open.discard(str(delivery.ledger_id))
            job.last = how
            if how in ("done", "failed"):
                job.reported = how
            ended = self._progress.pop(str(delivery.job_id), None) if not job.open else None
            if ended is not None:
                self._progress_ended.append(ended)

    def progress(self, delivery: Any, value: Any) -> None:
        """A handler's ``job.progress(value)``: kept as given, the last one per job (the
        live view and the log format it when they show it, a few times a second at most)."""
        with self._lock:
            self._progress_seq += 1
            job_id = str(delivery.job_id)
            self._progress[job_id] = JobProgress(job_id, str(delivery.handler), value, self._progress_seq)

    def running_progress(self, most: int) -> list[JobProgress]:
        """The last progress of the ``most`` running jobs that reported one latest, oldest first."""
        with self._lock:
            found = sorted(self._progress.values(), key=lambda entry: entry.seq)
        return found[-most:] if most > 0 else []

    def progress_after(self, seq: int) -> list[JobProgress]:
        """Each job's last progress reported after ``seq`` (running or since settled), oldest
        first; the settled jobs' are forgotten once returned."""
        with self._lock:
            found = [entry for entry in [*self._progress.values(), *self._progress_ended] if entry.seq > seq]
            self._progress_ended.clear()
        return sorted(found, key=lambda entry: entry.seq)

    def pull_begins(self) -> bool:
        with self._lock:
            if self._pulls_closed:
                return False
            self._pulls += 1
            return True

    def pull_ended(self, deliveries: int) -> None:
        with self._lock:
            self._pulls -= 1
            if deliveries:  # work arrived at the edge: it runs, and the run is not idle after all
                self.last_arrival = self._clock()
                self._pulls_closed = False

    def end_pulls_if_idle(self, idle_seconds: float, idle: Callable[[float], bool]) -> bool:
        """The idle edge: once nothing arrived for ``idle_seconds`` and ``idle(quiet)`` holds
        (nothing running; ``quiet``: the seconds since the last arrival; it must not call back
        into this observer), no new pull begins; ``True`` once none is in flight either, and
        the run may end. A pull in flight at the edge that brings work reopens the run
        (:meth:`pull_ended`), so what it brought is run, not handed back. Checked under the
        lock every pull begins and ends under."""
        with self._lock:
            last = self.last_arrival if self.last_arrival is not None else self.started_at
            quiet = self._clock() - last
            if quiet < idle_seconds or not idle(quiet):
                return False
            self._pulls_closed = True
            return self._pulls == 0

    # -- what the summary lists and the exit status stands on -------------------------------
    def unsettled(self, job_id: str, reason: str) -> None:
        """A delivery this run took and leaves without a definite outcome on the server.

        Call it where the run gives the delivery up, with the job's id (``delivery.job_id``,
        or the raw id when no delivery could be built) and a short why, e.g.
        ``"activated, never completed: stranded"``, ``"handler still running at shutdown"``,
        ``"report not confirmed"``, ``"unaddressable: executionId missing"``. The summary
        lists each job once (the first reason given wins; a ledger item still in flight is
        listed even if nobody calls this), and the run exits ``EXIT_INCOMPLETE`` (1).
        Thread-safe and without I/O: callable from any thread, a signal path excepted."""
        with self._lock:
            self._unsettled.setdefault(str(job_id), str(reason))

    def unusable_answer(self, reason: str) -> None:
        """The server sent an answer the worker could not use (a body that does not decode,
        a delivery that cannot be addressed, a shape the protocol does not allow). Counted
        by ``reason`` (keep it free of ids, so equal causes add up: ``"pull: response body
        is not JSON"``); the summary lists them and the run exits ``EXIT_INCOMPLETE`` (1).
        Thread-safe and without I/O."""
        with self._lock:
            self._unusable[str(reason)] += 1

    def not_asked_for(self, kind: str) -> None:
        """A pull brought a delivery it did not ask for (``kind``: ``type``, ``criteria`` or
        ``count``; ``runtime/pulling.py``), given back untouched. Counted by kind; the
        summary sums them and the run exits ``EXIT_INCOMPLETE`` (1). Thread-safe, no I/O."""
        with self._lock:
            self._not_asked[str(kind)] += 1

    def not_asked_for_counts(self) -> Counter[str]:
        """Kind -> deliveries, as reported to :meth:`not_asked_for` so far."""
        with self._lock:
            return Counter(self._not_asked)

    def unsettled_deliveries(self) -> dict[str, str]:
        """Job id -> why, as reported to :meth:`unsettled` so far."""
        with self._lock:
            return dict(self._unsettled)

    def unusable_answers(self) -> Counter[str]:
        """Reason -> how many answers, as reported to :meth:`unusable_answer` so far."""
        with self._lock:
            return Counter(self._unusable)

    def jobs(self) -> JobCounts:
        """Every job so far, each counted once, where it stands."""
        counts = {"running": 0, "done": 0, "failed": 0, "handed_back": 0, "discarded": 0}
        with self._lock:
            for job in self._jobs.values():
                where = "running" if job.open else job.reported or job.last
                if where in counts:
                    counts[where] += 1
            return JobCounts(taken=len(self._jobs), **counts)

    def forget(self, ledger_ids: list[str]) -> None:
        """Drop the starts of deliveries gone from the ledger (swept), so a long run stays bounded."""
        with self._lock:
            for ledger_id in ledger_ids:
                self.handler_starts.pop(ledger_id, None)

    def quiet_for(self) -> float:
        """Seconds since the last arrival (or since the run started)."""
        with self._lock:
            last = self.last_arrival if self.last_arrival is not None else self.started_at
        return self._clock() - last


def _timed(fn: Callable[..., Any], observer: RunObserver) -> Callable[..., Any]:
    """``fn`` noting when it starts; an ``async def`` handler's coroutine passes through unchanged."""

    def run(job: Any) -> Any:
        observer.handler_started(str(job.ledger_id))
        return fn(job)

    run.__name__ = getattr(fn, "__name__", "handler")
    run.__qualname__ = getattr(fn, "__qualname__", run.__name__)
    run.__doc__ = fn.__doc__
    return run


def instrument(registry: HandlerRegistry, observer: RunObserver) -> HandlerRegistry:
    """A registry with the same handlers, each noting its start in ``observer``."""
    timed = HandlerRegistry()
    for spec in registry.specs():
        timed.register(dataclasses.replace(spec, fn=_timed(spec.fn, observer)))
    return timed
