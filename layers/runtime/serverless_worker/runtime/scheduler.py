"""One scheduler tick: keep the session and liveness, pull only what can run now,
record each delivery before dispatching it, and reap what got stranded.

A tick lasts the poll window (less than the schedule period), heartbeating at the
server's interval throughout, so the worker stays online between ticks while pulls
happen continuously.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..errors import (
    BadRequestError,
    ConfigurationError,
    ForbiddenError,
    InvalidApiKeyError,
    NotFoundError,
    ProtocolError,
    RateLimitedError,
    ServerUnavailableError,
)
from ..protocols.base import Delivery, PullRequest, WorkerStatus
from .context import LambdaContextLike
from .dispatch import DispatchError
from .reaper import reap
from .services import Services
from .session import SessionUnavailableError
from .settle import hand_back, handback_epoch

__all__ = ["TickReport", "Scheduler"]

log = logging.getLogger("serverless_worker.scheduler")

SAFETY_SECONDS = 5.0  # end the window this long before Lambda's own timeout


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
    stopped: str | None = None
    duration: float = 0.0
    errors: list[str] = field(default_factory=list)

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
        self._next_heartbeat = 0.0
        self._started = time.time()
        self._next_handler = 0  # where the next round of pulls starts (see _in_turn)

    # -- the tick ---------------------------------------------------------------
    def tick(self, context: LambdaContextLike, *, window: float | None = None) -> TickReport:
        services, settings, store = self.services, self.services.settings, self.services.store
        clock = services.clock
        start = clock()
        window = settings.poll_window_seconds if window is None else window
        deadline = start + max(0.0, min(window, context.get_remaining_time_in_millis() / 1000 - SAFETY_SECONDS))
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
            control = store.get_control(services.protocol_name, services.instance)
            if control.get("stopped") or control.get("draining"):
                report.stopped = "stopped" if control.get("stopped") else "draining"
                self._heartbeat(report, state="draining", force=True)
                report.duration = clock() - start
                return report
            self._heartbeat(report, state="ready", force=True)
            limit = self._capacity_limit()
            in_flight = store.count_in_flight(services.protocol_name, services.instance)
            handlers = services.handler_names()
            # Stop when less than a second is left: a pull then could outlast the window.
            while deadline - clock() >= 1.0 and report.stopped is None:
                if self._heartbeat(report, state="ready"):
                    control = store.get_control(services.protocol_name, services.instance)
                    if control.get("stopped") or control.get("draining"):
                        report.stopped = "stopped" if control.get("stopped") else "draining"
                        break
                free = limit - in_flight
                if free <= 0:
                    # Re-count: executors finish during the window.
                    in_flight = store.count_in_flight(services.protocol_name, services.instance)
                    if limit - in_flight <= 0:
                        report.full_waits += 1
                        self._wait_for_capacity(min(1.0, max(0.0, deadline - clock())))
                    continue
                got = 0
                for name in self._in_turn(handlers):
                    room = min(settings.batch_size, limit - in_flight)
                    if room <= 0 or clock() >= deadline:
                        break
                    self._next_handler = (handlers.index(name) + 1) % len(handlers)
                    deliveries = self._pull(report, name, room, deadline, len(handlers))
                    got += len(deliveries)
                    in_flight += self._dispatch(report, deliveries)
                if got == 0 and not services.protocol.long_poll:
                    self._sleep(min(services.protocol.empty_poll_backoff, max(0.0, deadline - clock())))
        report.duration = clock() - start
        log.info("tick done", extra={"tick": report.as_dict()})
        return report

    # -- pieces -----------------------------------------------------------------
    def _in_turn(self, handlers: list[str]) -> list[str]:
        """``handlers`` starting where the last round stopped.

        Every empty long poll takes at least a second, so a window can end before a round
        reaches its last handlers; starting each round (and tick) at the first handler
        again would starve those handlers forever. Resuming where the previous round
        stopped gives each handler its turn.
        """
        start = self._next_handler % len(handlers) if handlers else 0
        return handlers[start:] + handlers[:start]

    def _capacity_limit(self) -> int:
        settings = self.services.settings
        limit = settings.max_in_flight
        if settings.executor_reserved_concurrency:
            # Throttled async invocations wait and then come back as redeliveries: never
            # pull more than the executor can run at once.
            limit = min(limit, settings.executor_reserved_concurrency)
        return int(limit)

    def _heartbeat(self, report: TickReport, *, state: str, force: bool = False) -> bool:
        services = self.services
        now = services.clock()
        if not force and now < self._next_heartbeat:
            return False
        session = services.keeper.session
        interval = session.heartbeat_interval if session is not None else 15.0
        self._next_heartbeat = now + interval
        counters = services.store.read_counters(services.protocol_name, services.instance) if force else {}
        status = WorkerStatus(state=state, processed=int(counters.get("processed", 0)),
                              failed=int(counters.get("failed", 0)),
                              in_flight=0, uptime_seconds=time.time() - self._started)
        try:
            services.call(lambda p: p.heartbeat(status))
            report.heartbeats += 1
        except ProtocolError as err:
            report.errors.append(f"heartbeat: {err}")
            log.warning("heartbeat failed: %s", err)
        return True

    def _pull(self, report: TickReport, handler: str, room: int, deadline: float, handlers: int) -> list[Delivery]:
        services = self.services
        settings = services.settings
        left = deadline - services.clock()
        wait = 0.0
        if services.protocol.long_poll:
            # Whole seconds (the server's unit); at least one, so a short remainder never
            # turns the long poll into a busy loop. A heartbeat may then be a second late.
            until_heartbeat = self._next_heartbeat - services.clock()
            wait = max(1.0, min(settings.wait_seconds_long_poll, left - 0.5, until_heartbeat) / handlers)
        request = PullRequest(handler=handler, max_items=room, wait_seconds=wait,
                              criteria=self._criteria(handler))
        report.pulls += 1
        try:
            deliveries = services.call(lambda p: p.pull(request))
        except RateLimitedError as err:
            self._sleep(min(err.retry_after or 1.0, max(0.0, left)))
            return []
        except ServerUnavailableError as err:
            report.errors.append(f"pull: {err}")
            self._sleep(min(2.0, max(0.0, left)))
            return []
        except (InvalidApiKeyError, ForbiddenError, BadRequestError, NotFoundError,
                ConfigurationError) as err:
            # Configuration is wrong: pulling again this tick cannot succeed.
            report.errors.append(f"pull: {err}")
            report.stopped = f"configuration: {type(err).__name__}"
            services.events.add("worker.pull_rejected", str(err), level="ERROR")
            log.error("pull rejected, ending tick: %s", err)
            return []
        except ProtocolError as err:
            # A garbage, truncated or oversized answer: the server misbehaves. Back off as
            # for a 5xx; the tick goes on and ends on time.
            report.errors.append(f"pull: {err}")
            log.warning("pull answer unusable: %s", err)
            self._sleep(min(2.0, max(0.0, left)))
            return []
        report.pulled += len(deliveries)
        return deliveries

    def _dispatch(self, report: TickReport, deliveries: list[Delivery]) -> int:
        """Record then dispatch each delivery; returns how many are now in flight."""
        if not deliveries:
            return 0
        results = list(self._pool.map(self._record_and_dispatch, deliveries))
        report.dispatched += sum(1 for r in results if r == "dispatched")
        report.duplicates += sum(1 for r in results if r == "duplicate")
        report.dispatch_failed += sum(1 for r in results if r == "failed")
        return sum(1 for r in results if r in ("dispatched", "failed_in_flight"))

    def _record_and_dispatch(self, delivery: Delivery) -> str:
        services, settings = self.services, self.services.settings
        long_running = self._long_running(delivery.handler)
        mode = "state_machine" if long_running else "invoke"
        deadline = services.clock() + settings.dispatch_timeout_seconds
        # A delivery we handed back earlier comes back under the same ledger key (same
        # execution / same retries): it is the redelivery we asked for, so record it again.
        key = services.store.record_delivery(delivery, instance=services.instance, deadline=deadline,
                                             dispatch_mode=mode, again_after_hand_back=True)
        if key is None:
            # The ledger already has this execution: a duplicate delivery. Settle it unrun.
            try:
                services.call(lambda p: p.discard(delivery))
            except ProtocolError as err:
                log.info("duplicate not acknowledged: %s", err)
            services.events.add("job.duplicate_discarded", f"duplicate delivery of job {delivery.job_id}",
                                job_id=delivery.job_id)
            return "duplicate"
        try:
            if long_running:
                services.dispatcher.start_execution(key)  # type: ignore[union-attr]
            else:
                services.dispatcher.invoke_executor(key)  # type: ignore[union-attr]
        except DispatchError as err:
            log.warning("dispatch failed for %s: %s", delivery.job_id, err)
            try:
                claim = handback_epoch()
                if services.store.start_run(key, epoch=claim, deadline=deadline) is not None:
                    hand_back(services, key, delivery, f"dispatch failed: {err}", epoch=claim)
                    return "failed"
            except ProtocolError as hand_err:
                log.warning("hand back after failed dispatch did not go through: %s", hand_err)
            return "failed_in_flight"
        return "dispatched"

    def _criteria(self, handler: str) -> dict[str, Any] | None:
        """SW_CRITERIA overrides what the handler declared with ``@handler(criteria=...)``."""
        configured = (self.services.settings.criteria or {}).get(handler)
        if configured is not None:
            return dict(configured)
        try:
            declared = self.services.registry.get(handler).criteria
        except Exception:
            return None
        return dict(declared) if declared else None

    def _long_running(self, handler: str) -> bool:
        try:
            return bool(self.services.registry.get(handler).long_running)
        except Exception:  # unknown handler: the executor reports it as a failure
            return False

    def wake(self) -> None:
        """Heartbeat and re-read the control flags at the next turn of a running tick's loop,
        instead of at the next heartbeat: a long-lived process (the local runner) that set
        ``draining`` itself calls this so its tick stops pulling at once."""
        self._next_heartbeat = 0.0

    def close(self) -> None:
        self._pool.shutdown(wait=True)
