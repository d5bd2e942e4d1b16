"""Drain: stop pulling, say so, let in-flight work finish (or hand back what never
started), then mark the worker stopped.

The draining flag lives in the state table, so every scheduler tick, in any container,
sees it before it pulls again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ProtocolError, ServerlessWorkerError
from ..protocols.base import WorkerStatus
from .services import Services
from .settle import hand_back, handback_epoch

__all__ = ["DrainReport", "drain", "resume_pulling"]

log = logging.getLogger("serverless_worker.drain")


@dataclass
class DrainReport:
    waited_seconds: float = 0.0
    finished_in_flight: int = 0
    handed_back: int = 0
    still_running: int = 0
    shutdown_called: bool = False
    settled_at_end: int = 0  # outcomes left to the reaper, settled by the drain's last try


def drain(services: Services, *, grace_seconds: float = 60.0, poll_seconds: float = 1.0,
          sleep: Callable[[float], None] = time.sleep, shutdown: bool = True,
          quiet_seconds: float = 0.0) -> DrainReport:
    """Drain this worker instance; returns when nothing is in flight or the grace ends.

    ``quiet_seconds``: how long after the flag is set a scheduler tick that read it just
    before may still record new work (``runtime.control.pull_quiet_seconds``); an empty
    count counts only after that. 0 where no tick can be running (the local runner's drain
    waits for its own tick first)."""
    store = services.store
    protocol_name, instance = services.protocol_name, services.instance
    store.set_draining(protocol_name, instance, True)
    services.events.add("worker.draining", "drain requested: no new pulls")
    report = DrainReport()
    start = services.clock()
    initial = store.count_in_flight(protocol_name, instance)
    next_heartbeat = 0.0
    while True:
        now = services.clock()
        if now >= next_heartbeat:
            _heartbeat(services, "draining")
            session = services.keeper.session
            next_heartbeat = now + (session.heartbeat_interval if session else 15.0)
        # Hand back whatever never started: nothing to finish there.
        for item in store.in_flight(protocol_name, instance):
            claim = handback_epoch()
            if str(item.status).endswith(("RECORDED", "DISPATCHED")) and store.start_run(
                    item.key, epoch=claim, deadline=now + 60) is not None:
                try:
                    hand_back(services.settler(), item.key, item.delivery, "worker draining", epoch=claim)
                    report.handed_back += 1
                except ServerlessWorkerError as err:
                    log.warning("hand back during drain failed: %s", err)
        # Waited for: what an executor or execution still works on. An item whose settling
        # the client gave up on (a noted failure) is the reaper's: nothing here settles it
        # sooner, so it holds no drain (it gets one more try below).
        remaining = sum(1 for item in store.in_flight(protocol_name, instance) if not item.settle_failures)
        if (remaining == 0 and now - start >= quiet_seconds) or now - start >= grace_seconds:
            break
        sleep(poll_seconds)
    report.settled_at_end = _settle_left_to_the_reaper(services)
    report.still_running = store.count_in_flight(protocol_name, instance)
    report.waited_seconds = services.clock() - start
    report.finished_in_flight = max(0, initial - report.handed_back - report.still_running)
    services.counters.flush()  # this container's batched counts (runtime.counters), before it stops
    if shutdown:
        _heartbeat(services, "stopped")
        try:
            services.call(lambda p: p.shutdown("drained"))
            report.shutdown_called = True
        except ProtocolError as err:
            log.warning("shutdown call failed: %s", err)
    services.events.add("worker.drained", f"drained: {report.handed_back} handed back, "
                        f"{report.still_running} still running")
    services.events.flush(services.protocol)
    return report


def _settle_left_to_the_reaper(services: Services) -> int:
    """One more try, before the worker stops, for each delivery whose outcome is stored and
    whose report (or acknowledgement) the client gave up on: a server that has relented gets
    it now rather than at the next reap. One attempt each (the reaper's client), whatever
    its noted retry time; a failure is noted as the reaper's would be. Returns how many settled."""
    from .reaper import reap_action
    from .settle import acknowledge, settle

    settler = services.settler(reaping=True)
    settled = 0
    for item in services.store.in_flight(services.protocol_name, services.instance):
        action = reap_action(item) if item.settle_failures else None
        try:
            if action == "resettle" and item.outcome is not None:
                settle(settler, item.key, item.delivery, item.outcome)
            elif action == "acknowledge":
                acknowledge(settler, item.key, item.delivery)
            else:
                continue
            settled += 1
        except ServerlessWorkerError as err:
            log.warning("delivery %s still not settled at the drain's end (left to the reaper and the next run; "
                        "nothing is lost yet): %s", item.key, err)
    return settled


def resume_pulling(services: Services) -> None:
    """Clear the draining, stopped and unfit-handler flags so the next tick pulls again (an
    operator resumes after fixing whatever stopped the worker)."""
    services.store.set_draining(services.protocol_name, services.instance, False)
    services.store.set_stopped(services.protocol_name, services.instance, None)
    services.store.clear_unfit(services.protocol_name, services.instance)


def _heartbeat(services: Services, state: str) -> None:
    try:
        services.call(lambda p: p.heartbeat(WorkerStatus(state=state)))
    except ProtocolError as err:
        log.warning("heartbeat (%s) failed: %s", state, err)
