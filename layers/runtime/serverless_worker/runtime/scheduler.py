"""One scheduler tick: keep the session and liveness, pull only what can run now,
record each delivery before dispatching it, and reap what got stranded.

A tick heartbeats at the server's interval and pulls for as long as pulls return work,
up to the poll window; without work it stays as long as its liveness mode says
(``runtime/polling.py``). Deliveries are recorded and dispatched on a thread pool while
the next pull runs (on the local SQLite file, a pulled batch is recorded at once, in one
transaction), each one recorded before it is dispatched, and counted in flight from the
moment it is pulled, so capacity never overshoots. A delivery the ledger cannot hold is
settled on its own (``runtime/poison.py``); the rest of its batch goes on.

Where executors keep pulling (setting ``self_pull``, docs/limits.md), a full pull for a
short handler with a declared timeout fans out: its deliveries go out flagged (each
executor may pull the next itself), and up to as many pullers, executors with no delivery
that pull their own, start on top, never more than the free slots. Each puller's slot is reserved until the ``by`` it
was given (it never takes a first slot later), and every count of capacity adds the
reservations still running, so the scheduler and its pullers never fill the same slot.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..errors import (
    BadRequestError,
    ConfigurationError,
    DispatchError,
    ForbiddenError,
    InvalidApiKeyError,
    NotFoundError,
    ProtocolError,
    ProtocolViolationError,
    RateLimitedError,
    ServerUnavailableError,
    SessionUnavailableError,
    UnknownHandlerError,
)
from ..model import Delivery
from ..protocols.base import PullRequest, WorkerStatus
from ..state.errors import UnrecordableDeliveryError
from .capacity import capacity_limit
from .context import LambdaContextLike
from .control import CONTROL_CHECK_SECONDS
from .poison import UNSETTLED, settle_unrecordable
from .polling import WORK_LINGER_SECONDS, EmptyPollBackoff, answered_early, idle_window
from .pulling import NotAskedFor, criteria, discard_duplicate, long_running, pull_asked_for
from .reaper import reap
from .services import Services
from .settle import hand_back, handback_epoch

__all__ = ["TickReport", "Scheduler"]

_T = TypeVar("_T")

log = logging.getLogger("serverless_worker.scheduler")
# How long a tick waits for a batch's worth of room when only a few slots are free: one
# step of PARTIAL_ROOM_WAIT_SECONDS at a time, for at most ROOM_WAIT_MAX_SECONDS in a row,
# then it takes what fits. Never longer: a slot held by a long job (or a ledger item
# nothing settles soon) must not stop every other job from being taken.
PARTIAL_ROOM_WAIT_SECONDS = 0.05
ROOM_WAIT_MAX_SECONDS = 2.0

SAFETY_SECONDS = 5.0  # end the window this long before Lambda's own timeout
# The least time a puller gets to start before its ``by``: less, and it would most likely
# arrive late and only cost an invocation.
PULLER_LEAD_SECONDS = 1.0
# Pulls failing in a row (5xx, unreachable) before a tick gives up: during an outage the
# rest of the window would only burn Lambda time; the next scheduled tick tries again, and
# the silent-poller alarm (no SuccessfulPolls) shows the outage meanwhile.
UNAVAILABLE_PULLS_MAX = 3


@dataclass
class TickReport:
    pulls: int = 0
    pulled: int = 0
    dispatched: int = 0
    duplicates: int = 0
    dispatch_failed: int = 0
    heartbeats: int = 0
    reaped: int = 0
    full_waits: int = 0
    unrecordable: int = 0  # deliveries the ledger cannot hold, settled on their own (runtime/poison.py)
    unsettled: list[str] = field(default_factory=list)  # "job <id>: why" of those left without an outcome
    stopped: str | None = None
    duration: float = 0.0
    errors: list[str] = field(default_factory=list)
    unusable: list[str] = field(default_factory=list)  # answers the server sent that could not be used
    unfit: dict[str, str] = field(default_factory=dict)  # handler -> why its timeout can never fit
    pullers: int = 0  # executors started without a delivery to pull their own (setting self_pull)
    pullers_failed: int = 0  # puller invokes that did not go through (their slots freed at once)
    handed_back: int = 0  # pulled as a drain or stop began: recorded and handed back unstarted
    # Deliveries a pull brought that it did not ask for, given back untouched (runtime/pulling.py):
    # {"job_id", "why", "kind", "given_back"} each.
    not_asked_for: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Scheduler:
    """Runs ticks; one instance per container (it keeps the dispatch pool warm)."""

    def __init__(self, services: Services, *, sleep: Callable[[float], None] = time.sleep,
                 dispatch_workers: int = 16,
                 wait_for_capacity: Callable[[float], None] | None = None) -> None:
        self.services = services
        self._sleep = sleep
        # How a full tick waits for an executor to finish (``sleep`` unless given): the local
        # runner, whose executors run in its own process, returns as soon as one does.
        self._wait_for_capacity = wait_for_capacity or sleep
        self._pool = ThreadPoolExecutor(max_workers=dispatch_workers, thread_name_prefix="dispatch")
        # Deliveries pulled but not yet recorded and dispatched: enough to keep the pool busy
        # while the next pull runs, few enough that a tick never holds many unrecorded.
        self._max_pending = 2 * dispatch_workers
        self._pull_pool: ThreadPoolExecutor | None = None  # parallel claims (protocol.parallel_pulls)
        self._report_lock = threading.Lock()
        self._backlog: set[str] = set()  # handlers whose last pull came back full
        self._next_heartbeat = 0.0
        self._started = time.time()
        self._next_handler = 0  # where the next round of pulls starts (see _in_turn)
        self.room_wait_max = ROOM_WAIT_MAX_SECONDS  # the longest wait for a batch's worth of room
        self._unavailable = 0  # pulls failing in a row with the server unavailable (across ticks)
        self._early_empties = 0  # empty long polls answered sooner than asked, since the round began
        # The stored counters as the last forced heartbeat read them, repeated in the beats between.
        self._counted: dict[str, int] = {}
        self._reservations = _Reservations()  # slots held for the pullers started (self_pull)
        self._control_read_at = -math.inf  # when this tick last read the control item (runtime/control.py)
        self._halted = False  # this tick saw draining or stopped: what it still records goes back unstarted
        self._halt = threading.Event()  # halt(): this process is stopping (the local runner), pull no more

    # -- the tick ---------------------------------------------------------------
    def tick(self, context: LambdaContextLike, *, window: float | None = None) -> TickReport:
        services, settings = self.services, self.services.settings
        clock = services.clock
        start = clock()
        window = settings.poll_window_seconds if window is None else window
        full_end = start + max(0.0, min(window, context.get_remaining_time_in_millis() / 1000 - SAFETY_SECONDS))
        report = TickReport()
        with services.flushing_events():
            try:
                services.ensure_session()
            except (ProtocolError, ConfigurationError, SessionUnavailableError) as err:
                # No session (a garbage bootstrap answer, a rejected key, a broken setting):
                # nothing can be pulled, so end the tick now and say why.
                report.errors.append(f"session: {err}")
                report.stopped = f"no session: {type(err).__name__}"
                log.error("no worker session, ending tick: %s", err)
                report.duration = clock() - start
                return report
            report.reaped = reap(services).total
            self._halted = False
            control = self._read_control(report)
            if self._halted:
                self._heartbeat(report, state="draining", force=True)
                report.duration = clock() - start
                return report
            self._heartbeat(report, state="ready", force=True)
            pending = _Pending(self._pool, self._max_pending)
            try:
                self._poll(report, start=start, full_end=full_end, pending=pending,
                           unfit=control.get("unfit") or {})
            finally:
                pending.drain(report)  # every pulled delivery is recorded before the tick returns
            if self._keeps_liveness() and report.stopped is None:
                # Close the window with a heartbeat, not before the liveness window's end (the
                # loop stops a second early): the silence until the next tick's first one is
                # what the server's offline threshold must cover.
                live_until = min(full_end, start + self._idle_window(full_end - start))
                self._sleep(max(0.0, live_until - clock()))
                self._heartbeat(report, state="ready", force=True)
        report.duration = clock() - start
        log.info("tick done", extra={"tick": report.as_dict()})
        return report

    def _poll(self, report: TickReport, *, start: float, full_end: float, pending: _Pending,
              unfit: dict[str, str]) -> None:
        """Pull, record and dispatch until the window is over: the poll window while pulls
        return work (or capacity is full), the liveness mode's idle window otherwise."""
        services, settings = self.services, self.services.settings
        clock = services.clock
        limit = capacity_limit(self.services.settings)
        # Room wanted before a pull: one slot, or a whole batch where one call hands out a batch.
        want = min(settings.batch_size, limit) if services.protocol.batch_pull else 1
        in_flight = self._count_in_flight()
        handlers = self._fit_handlers(report, unfit)
        if not handlers:
            return
        busy_until = start + self._idle_window(full_end - start)
        backoff = EmptyPollBackoff(settings.poll_backoff_seconds,
                                   settings.poll_backoff_max_seconds or services.protocol.empty_poll_backoff)
        rounds = 0
        worked = False  # the last round's pulls returned work (see _pull's ``hurry``)
        room_since: float | None = None  # since when some, but not a batch's worth of, room is free
        self._early_empties = 0
        while report.stopped is None:
            if self._halt.is_set():  # the process is stopping: its own sleeps end at once, so pull no more
                self._halted = True
                report.stopped = "draining"
                break
            end = min(full_end, busy_until)
            # Stop when less than a second is left: a pull then could outlast the window. The
            # first round of pulls is always made (the while-work mode's one poll).
            if rounds and end - clock() < 1.0:
                break
            rounds += 1
            self._heartbeat(report, state="ready")
            if self._control_due():
                control = self._read_control(report)
                if self._halted:
                    break
                if set(control.get("unfit") or {}) - set(unfit):
                    unfit = control["unfit"]
                    handlers = self._fit_handlers(report, unfit)
                    if not handlers:
                        break
            in_flight -= pending.harvest(report)
            if limit - in_flight < want:
                # Re-count once every pulled delivery is in the ledger: executors finish
                # during the window.
                pending.drain(report)
                in_flight = self._count_in_flight()
                free = limit - in_flight
                if free <= 0:
                    room_since = None
                elif room_since is None:
                    room_since = clock()
                waited_enough = room_since is not None and clock() - room_since >= self.room_wait_max
                if free < want and not waited_enough:
                    report.full_waits += 1
                    busy_until = max(busy_until, clock() + WORK_LINGER_SECONDS)  # work exists
                    # Nothing free: wait for an executor. A few slots free where one call
                    # hands out a whole batch: wait briefly for a batch's worth rather than
                    # spend a call on every few jobs, but never longer than room_wait_max.
                    pause = 1.0 if free <= 0 else PARTIAL_ROOM_WAIT_SECONDS
                    self._wait_for_capacity(min(pause, max(0.0, end - clock())))
                    continue
            room_since = None
            got, full = 0, False
            round_started = clock()
            for name in self._in_turn(handlers):
                room = min(settings.batch_size, limit - in_flight)
                if room <= 0 or (rounds > 1 and clock() >= end):
                    break
                self._next_handler = (handlers.index(name) + 1) % len(handlers)
                # While any queue has work, the others are only peeked at (no long poll):
                # a second's wait per empty queue per round would starve the busy one.
                asked = clock()  # before the pull is sent: what settled earlier cannot be in its answer
                deliveries = self._pull_backlog(report, name, room, end, len(handlers),
                                                hurry=worked or got > 0)
                if deliveries and self._control_due():
                    # The pull outlived the last read (a long poll): a drain may have begun
                    # meanwhile, and then these are recorded and handed back, not run.
                    self._read_control(report)
                got += len(deliveries)
                full = full or len(deliveries) >= room
                fan_out = not self._halted and self._fans_out(name, deliveries, room)
                in_flight += self._record(deliveries, pending, report, asked, pull=fan_out)
                if fan_out:
                    # As many pullers as deliveries at most (the pulling executors at most
                    # double per full round), and never more than the free slots. Each holds
                    # its slot until the window's end now that work was seen (as busy_until
                    # becomes below), never past the Lambda's own time.
                    by = min(full_end, max(busy_until, clock() + WORK_LINGER_SECONDS))
                    in_flight += self._start_pullers(name, min(len(deliveries), limit - in_flight),
                                                     by, pending, report)
                if self._halted:
                    break
            # An all-empty round makes the next one long-poll (never a busy loop); a lone
            # handler has no other queue to starve, so it always long-polls.
            worked = got > 0 and len(handlers) > 1
            with self._report_lock:
                early, self._early_empties = self._early_empties, 0
            if got:
                backoff.reset()
                busy_until = max(busy_until, clock() + WORK_LINGER_SECONDS)
            if full or (services.protocol.long_poll and (got or not early)):
                continue  # a held long poll waited server-side; a full pull means more is waiting
            # Nothing, or less than asked: the queue is empty now. Wait the first step after
            # work, doubling while pulls stay empty. An empty long poll the server answered at
            # once (no long poll there: waitSeconds ignored, a 204 at once) is paced the same
            # way, by what the server did rather than what it promised; there the time the
            # round's pulls took counts towards the wait (a server holding polls shorter than
            # asked is not made to wait twice).
            pause = backoff.next_wait()
            if services.protocol.long_poll:
                pause -= clock() - round_started
            self._sleep(min(max(0.0, pause), max(0.0, end - clock())))

    # -- pieces -----------------------------------------------------------------
    def _read_control(self, report: TickReport) -> dict[str, Any]:
        """The control item, read now. Draining or stopped ends this tick's pulling
        (``report.stopped``) and sends what it still records back unstarted (``_dispatch``)."""
        services = self.services
        control = services.store.get_control(services.protocol_name, services.instance)
        self._control_read_at = services.clock()
        if control.get("stopped") or control.get("draining"):
            self._halted = True
            if report.stopped is None:
                report.stopped = "stopped" if control.get("stopped") else "draining"
        return control

    def _control_due(self) -> bool:
        """The last read of the control item is old enough to read again (runtime/control.py)."""
        return self.services.clock() - self._control_read_at >= CONTROL_CHECK_SECONDS

    def _count_in_flight(self) -> int:
        """The ledger's live in-flight count plus the slots held for pullers until their ``by``."""
        services = self.services
        now = services.clock()
        return services.store.count_in_flight(services.protocol_name, services.instance,
                                              live_at=now) + self._reservations.held(now)

    def _fans_out(self, handler: str, deliveries: list[Delivery], room: int) -> bool:
        """A full pull, with executors that keep pulling, for a handler they pull for: more is
        waiting than this pull could take, and executors can take it themselves. Not for a
        long-running handler (the state machine runs those), nor for one without a declared
        timeout (it is promised the executor's whole time, so no executor pulls after it)."""
        if not (self.services.settings.self_pull and deliveries and len(deliveries) >= room):
            return False
        try:
            spec = self.services.registry.get(handler)
        except UnknownHandlerError:  # the executor reports it as a failure
            return False
        return spec.timeout is not None and not long_running(self.services, handler)

    def _start_pullers(self, handler: str, count: int, by: float, pending: _Pending,
                       report: TickReport) -> int:
        """Start ``count`` pullers for ``handler`` on the dispatch pool, their slots reserved
        until ``by``; returns how many now count in flight (a failed invoke frees its own)."""
        if count <= 0 or by - self.services.clock() < PULLER_LEAD_SECONDS:
            return 0
        self._reservations.add(by, count)
        return pending.submit(functools.partial(self._invoke_puller, by=by), [handler] * count, report)

    def _invoke_puller(self, handler: str, *, by: float) -> str:
        try:
            self.services.dispatch.invoke_puller(handler, by)
        except DispatchError as err:
            # No ledger item exists for a puller: nothing to hand back, only its slot to free.
            log.warning("puller for %s not started: %s", handler, err)
            self._reservations.release(by)
            return "puller_failed"
        return "puller"

    def _fit_handlers(self, report: TickReport, unfit: dict[str, str]) -> list[str]:
        """The handlers to pull for: not those whose timeout can never fit (``runtime/fit.py``);
        ``report.unfit`` names those, and ``report.stopped`` says so when none is left."""
        report.unfit = dict(unfit)
        handlers = [name for name in self.services.handler_names() if name not in unfit]
        if not handlers:
            report.stopped = "unfit: no handler's timeout can fit its limits"
        return handlers

    def _in_turn(self, handlers: list[str]) -> list[str]:
        """``handlers`` starting where the last round stopped.

        Every empty long poll takes at least a second, so a window can end before a round
        reaches its last handlers; starting each round (and tick) at the first handler
        again would starve those handlers forever. Resuming where the previous round
        stopped gives each handler its turn.
        """
        start = self._next_handler % len(handlers) if handlers else 0
        return handlers[start:] + handlers[:start]

    def _heartbeat(self, report: TickReport, *, state: str, force: bool = False) -> None:
        """A heartbeat when one is due (or ``force``)."""
        services = self.services
        now = services.clock()
        if not force and now < self._next_heartbeat:
            return
        session = services.keeper.session
        interval = session.heartbeat_interval if session is not None else 15.0
        self._next_heartbeat = now + interval
        # Counts are batched per container (runtime.counters): write this container's when
        # due; read the stored totals once per tick and repeat them in the beats between.
        services.counters.flush_if_due()
        if force:
            self._counted = services.counters.read()
        counters = self._counted
        status = WorkerStatus(state=state, processed=counters.get("processed", 0),
                              failed=counters.get("failed", 0),
                              in_flight=0, uptime_seconds=time.time() - self._started)
        try:
            services.call(lambda p: p.heartbeat(status))
            report.heartbeats += 1
        except ProtocolError as err:
            report.errors.append(f"heartbeat: {err}")
            log.warning("heartbeat failed: %s", err)

    def _pull(self, report: TickReport, handler: str, room: int, deadline: float, handlers: int,
              hurry: bool = False) -> list[Delivery]:
        """One pull; a long poll (on a protocol that has them) unless ``hurry``: another
        queue has work, so this one is asked only for what is already waiting."""
        services = self.services
        settings = services.settings
        if self._halt.is_set():
            return []
        left = deadline - services.clock()
        wait = 0.0
        if services.protocol.long_poll and not hurry:
            # Whole seconds (the server's unit); at least one, so a short remainder never
            # turns the long poll into a busy loop. A heartbeat may then be a second late.
            until_heartbeat = self._next_heartbeat - services.clock()
            wait = max(1.0, min(settings.wait_seconds_long_poll, left - 0.5, until_heartbeat) / handlers)
        request = PullRequest(handler=handler, max_items=room, wait_seconds=wait,
                              criteria=criteria(self.services, handler))
        watcher = services.watcher
        if watcher is not None and not watcher.pull_begins():
            return []  # the local run is ending at its idle edge: no pull starts after it
        brought = 0
        try:
            deliveries, pause = self._pull_once(report, request, wait, left)
            brought = len(deliveries)
        finally:
            if watcher is not None:
                watcher.pull_ended(brought)
        if pause > 0:  # a refused or failed pull's back-off: no pull is in flight meanwhile
            self._sleep(pause)
        return deliveries

    def _pull_once(self, report: TickReport, request: PullRequest, wait: float,
                   left: float) -> tuple[list[Delivery], float]:
        """:meth:`_pull`'s call and what each of its errors means for the tick: the
        deliveries, and how long to pause before the next pull (after the pull is over)."""
        services = self.services
        settings = services.settings
        with self._report_lock:  # parallel claims report from several threads
            report.pulls += 1
        asked_at = services.clock()
        note = functools.partial(self._note_unaddressable, report)
        try:
            deliveries = pull_asked_for(services, request, unaddressable=note,
                                        not_asked=functools.partial(self._note_not_asked, report))
        except RateLimitedError as err:
            # The server's hint, but never past the window nor the configured maximum: one pull
            # per pause, never a storm, and a stop ends the pause (the local runner's sleep).
            pause = min(err.retry_after or 1.0, max(0.0, left), settings.max_wait_seconds)
            if err.retry_after is not None and err.retry_after > pause:
                log.info("pull rate limited: the server asked to wait %.10g s (Retry-After); pausing %.1f s, "
                         "the most this tick waits (nothing was taken, so nothing is lost)", err.retry_after, pause)
            return [], pause
        except ServerUnavailableError as err:
            self._note_error(report, f"pull: {err}")
            with self._report_lock:
                self._unavailable += 1
                if self._unavailable >= UNAVAILABLE_PULLS_MAX and report.stopped is None:
                    report.stopped = "server unavailable"
                    log.warning("job server unavailable for %d pulls in a row, ending the tick: %s",
                                self._unavailable, err)
                    return [], 0.0
            return [], min(2.0, max(0.0, left))
        except (InvalidApiKeyError, ForbiddenError, BadRequestError, NotFoundError,
                ConfigurationError) as err:
            # Configuration is wrong: pulling again this tick cannot succeed.
            self._note_error(report, f"pull: {err}")
            report.stopped = f"configuration: {type(err).__name__}"
            services.events.add("worker.pull_rejected", str(err), level="ERROR")
            log.error("pull rejected, ending tick: %s", err)
            return [], 0.0
        except ProtocolError as err:
            # A garbage, truncated or oversized answer: the server misbehaves. Back off as
            # for a 5xx; the tick goes on and ends on time.
            self._note_error(report, f"pull: {err}")
            if isinstance(err, ProtocolViolationError):
                with self._report_lock:
                    report.unusable.append(f"pull: {err}")
            log.warning("pull answer unusable: %s", err)
            return [], min(2.0, max(0.0, left))
        with self._report_lock:
            report.pulled += len(deliveries)
            self._unavailable = 0
            if not deliveries and answered_early(wait, services.clock() - asked_at):
                self._early_empties += 1
        return deliveries, 0.0

    def _note_unaddressable(self, report: TickReport, lacks: list[str]) -> None:
        """Each delivery a pull took and left to the server's own return path, in
        ``report.unusable`` by what it lacked (no id: equal causes add up)."""
        with self._report_lock:
            report.unusable.extend(f"pull: a delivery with {lack}, left to the server's own "
                                   "return path" for lack in lacks)

    def _note_not_asked(self, report: TickReport, unasked: NotAskedFor) -> None:
        with self._report_lock:
            report.not_asked_for.append({"job_id": unasked.job_id, "why": unasked.why, "kind": unasked.kind,
                                         "given_back": unasked.given_back})

    def _pull_backlog(self, report: TickReport, handler: str, room: int, deadline: float,
                      handlers: int, *, hurry: bool = False) -> list[Delivery]:
        """One pull; several at once, sharing ``room``, where a call takes one item
        (``protocol.parallel_pulls``) and the handler's last pull came back full. An idle
        queue thus sees one call at a time, a backlog several."""
        calls = min(self.services.protocol.parallel_pulls, room) if handler in self._backlog else 1
        if calls <= 1:
            deliveries = self._pull(report, handler, room, deadline, handlers, hurry)
        else:
            if self._pull_pool is None:
                self._pull_pool = ThreadPoolExecutor(max_workers=self.services.protocol.parallel_pulls,
                                                     thread_name_prefix="pull")
            shares = [room // calls + (1 if index < room % calls else 0) for index in range(calls)]
            futures = [self._pull_pool.submit(self._pull, report, handler, share, deadline, handlers, hurry)
                       for share in shares]
            deliveries = [delivery for future in futures for delivery in future.result()]
        if len(deliveries) >= room:
            self._backlog.add(handler)
        else:
            self._backlog.discard(handler)
        return deliveries

    def _note_error(self, report: TickReport, error: str) -> None:
        with self._report_lock:
            report.errors.append(error)

    def _idle_window(self, window: float) -> float:
        """How long this tick stays without work (``runtime/polling.py``)."""
        settings = self.services.settings
        session = self.services.keeper.session if self.services.protocol.needs_session else None
        return idle_window(settings.liveness, window=window, schedule_seconds=settings.schedule_seconds,
                           heartbeat_interval=session.heartbeat_interval if session is not None else None,
                           offline_after=session.offline_after if session is not None else None)

    def _keeps_liveness(self) -> bool:
        """Continuous liveness on a protocol with a session: ticks end with a heartbeat."""
        return (self.services.settings.liveness == "continuous" and self.services.protocol.needs_session
                and self.services.keeper.session is not None)

    def _record(self, deliveries: list[Delivery], pending: _Pending, report: TickReport, asked: float,
                *, pull: bool = False) -> int:
        """Record and dispatch ``deliveries``; returns how many now count in flight. ``pull``:
        their pull was full, and the executors they go to may keep pulling.

        Where the store writes a batch for less (the local SQLite file), the new ones of a
        batch are recorded here in one transaction and dispatched at once; what it leaves
        (an item exists, or it cannot be recorded) goes to the pool one at a time. Otherwise, and for a
        lone delivery, each goes to the pool, recorded beside the next pull (one DynamoDB
        request each). ``asked`` is when the pull was sent (see ``_record_and_dispatch``).
        """
        store = self.services.store
        record_and_dispatch = functools.partial(self._record_and_dispatch, asked=asked, report=report, pull=pull)
        if len(deliveries) < 2 or not store.records_in_batches:
            return pending.submit(record_and_dispatch, deliveries, report)
        deadline = self._dispatch_deadline()
        modes = [self._mode(delivery) for delivery in deliveries]
        keys = store.record_new(list(zip(deliveries, modes, strict=True)), instance=self.services.instance,
                                deadline=deadline)
        recorded = list(zip(deliveries, keys, modes, strict=True))
        pending.submit(record_and_dispatch, [delivery for delivery, key, _ in recorded if key is None],
                       report)
        pending.add([self._dispatch(delivery, key, mode, deadline, pull=pull) for delivery, key, mode in recorded
                     if key is not None], report)
        return len(deliveries)

    def _mode(self, delivery: Delivery) -> str:
        return "state_machine" if long_running(self.services, delivery.handler) else "invoke"

    def _dispatch_deadline(self) -> float:
        """When a delivery recorded now counts as stranded if no executor has claimed it."""
        return self.services.clock() + self.services.settings.dispatch_timeout_seconds

    def _record_and_dispatch(self, delivery: Delivery, report: TickReport, *, asked: float,
                             pull: bool = False) -> str:
        services = self.services
        deadline = self._dispatch_deadline()
        mode = self._mode(delivery)
        # A delivery we handed back earlier comes back under the same ledger key (same
        # execution / same retries): it is the redelivery we asked for, so record it again.
        # One settled before this pull was sent is new work where only a reset server reuses
        # ids; one settled since may have been handed out before our outcome landed.
        settled_before = asked if services.protocol.settled_id_returns_as_new else None
        try:
            key = services.store.record_delivery(
                delivery, instance=services.instance, deadline=deadline, dispatch_mode=mode,
                again_after_hand_back=True, settled_before=settled_before)
        except UnrecordableDeliveryError as err:
            # This delivery alone: its outcome is settled here, and the rest of its batch runs.
            result, why = settle_unrecordable(services, delivery, err)
            with self._report_lock:
                report.unrecordable += 1
                if result == UNSETTLED:
                    report.unsettled.append(f"job {delivery.job_id!a}: {why}")
            return result
        if key is None:
            discard_duplicate(services, delivery)
            return "duplicate"
        return self._dispatch(delivery, key, mode, deadline, pull=pull)

    def _dispatch(self, delivery: Delivery, key: str, mode: str, deadline: float, *, pull: bool = False) -> str:
        """Fan out a recorded delivery; a failed dispatch is handed back (or left to the reaper)."""
        services = self.services
        if services.watcher is not None:
            services.watcher.recorded(delivery)
        if self._halted:  # pulled as a drain or stop began: nothing new starts
            return "handed_back" if self._hand_back_unstarted(delivery, key, deadline, "worker stopping") \
                else "failed_in_flight"
        try:
            if mode == "state_machine":
                services.dispatch.start_execution(key)
            elif pull:
                services.dispatch.invoke_executor(key, pull=True)
            else:
                services.dispatch.invoke_executor(key)
        except DispatchError as err:
            log.warning("dispatch failed for %s: %s", delivery.job_id, err)
            return "failed" if self._hand_back_unstarted(delivery, key, deadline, f"dispatch failed: {err}") \
                else "failed_in_flight"
        return "dispatched"

    def _hand_back_unstarted(self, delivery: Delivery, key: str, deadline: float, reason: str) -> bool:
        """Claim a recorded delivery no executor was sent and hand it back; ``False`` where
        it stays in flight for the reaper (an executor claimed it first, or the call failed)."""
        services = self.services
        try:
            claim = handback_epoch()
            if services.store.start_run(key, epoch=claim, deadline=deadline) is not None:
                hand_back(services.settler(), key, delivery, reason, epoch=claim)
                return True
        except ProtocolError as err:
            log.warning("hand back (%s) did not go through: %s", reason, err)
        return False

    def halt(self) -> None:
        """The process is stopping (the local runner's Ctrl-C, SIGTERM or idleness): a running
        tick sends no further pull, from any thread, and ends at its loop's next turn. Its
        sleeps end early by then, and without this a refused pull would follow a refused
        pull at once. Lambda's ticks never need it: the draining flag stops them."""
        self._halt.set()

    def wake(self) -> None:
        """Heartbeat and re-read the control flags at the next turn of a running tick's loop,
        instead of at the next heartbeat: a long-lived process (the local runner) that set
        ``draining`` itself calls this so its tick stops pulling at once."""
        self._next_heartbeat = 0.0
        self._control_read_at = -math.inf

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        if self._pull_pool is not None:
            self._pull_pool.shutdown(wait=True)


class _Reservations:
    """Slots held for pullers: ``by -> count``, each freed at its ``by`` (after which its
    puller takes no first slot) or when its invoke failed. Pool threads release, the tick
    counts: hence the lock."""

    def __init__(self) -> None:
        self._held: dict[float, int] = {}
        self._lock = threading.Lock()

    def add(self, by: float, count: int) -> None:
        with self._lock:
            self._held[by] = self._held.get(by, 0) + count

    def release(self, by: float) -> None:
        with self._lock:
            left = self._held.get(by, 0) - 1
            if left > 0:
                self._held[by] = left
            else:
                self._held.pop(by, None)

    def held(self, now: float) -> int:
        """The slots still held at ``now``; the expired ones are forgotten."""
        with self._lock:
            self._held = {by: count for by, count in self._held.items() if by > now}
            return sum(self._held.values())


class _Pending:
    """Deliveries being recorded and dispatched on the pool while the tick pulls on, and
    pullers being started.

    Each is counted in flight from :meth:`submit` until :meth:`harvest` finds it was a
    duplicate, a failed dispatch or a failed puller; :meth:`drain` waits for all and re-raises the first
    error one raised (a state-store failure fails the tick, as a serial tick would).
    """

    _IN_FLIGHT = frozenset({"dispatched", "failed_in_flight", "puller"})

    def __init__(self, pool: ThreadPoolExecutor, bound: int) -> None:
        self._pool = pool
        self._bound = max(1, bound)
        self._futures: list[Future[str]] = []
        self._freed = 0
        self._error: BaseException | None = None

    def submit(self, fn: Callable[[_T], str], items: list[_T], report: TickReport) -> int:
        """Queue ``fn`` for each item (a delivery, or a puller's handler), waiting while
        ``bound`` are queued; returns how many were queued (each counts in flight from now)."""
        for item in items:
            while len(self._futures) >= self._bound:
                wait(self._futures, return_when=FIRST_COMPLETED)
                self._collect(report)
            self._futures.append(self._pool.submit(fn, item))
        return len(items)

    def add(self, results: list[str], report: TickReport) -> None:
        """Deliveries recorded and dispatched on the tick's own thread: accounted at once."""
        for result in results:
            self._account(result, report)

    def harvest(self, report: TickReport) -> int:
        """Account for the finished ones; returns how many turned out not to be in flight."""
        self._collect(report)
        freed, self._freed = self._freed, 0
        return freed

    def drain(self, report: TickReport) -> int:
        """Wait for every queued delivery, then :meth:`harvest`."""
        wait(self._futures)
        freed = self.harvest(report)
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return freed

    def _collect(self, report: TickReport) -> None:
        done = [future for future in self._futures if future.done()]
        if not done:
            return
        finished = set(done)
        self._futures = [future for future in self._futures if future not in finished]
        for future in done:
            error = future.exception()
            if error is not None:
                self._error = self._error or error
                continue
            self._account(future.result(), report)

    def _account(self, result: str, report: TickReport) -> None:
        report.dispatched += int(result == "dispatched")
        report.duplicates += int(result == "duplicate")
        report.dispatch_failed += int(result == "failed")
        report.pullers += int(result == "puller")
        report.pullers_failed += int(result == "puller_failed")
        report.handed_back += int(result == "handed_back")
        self._freed += int(result not in self._IN_FLIGHT)
