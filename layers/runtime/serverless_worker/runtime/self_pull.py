"""An executor that has finished a short delivery pulls the next one for the same handler
itself, while the backlog lasts (docs/limits.md).

It pulls one delivery at a time, in the settle hook of the one it is finishing
(``Settler.before_final``: after the report and the ack, before the final ledger write),
so its slot in the in-flight index is handed over without ever showing free; then records
it in the ledger as RUNNING under a run epoch of its own (``StateStore.record_running``:
the scheduler's record and the claim in one write) and runs it once the finished one is
settled. Whether to pull again is one pure function, :func:`stop_reason`; everything that
is not the handler's own short work (another handler's delivery, a long-running one) is
handed back unstarted and ends the loop, and a failed pull ends it too, never slept on:
the scheduler owns pacing and back-off.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import ConfigurationError, ProtocolError, RateLimitedError, SessionExpiredError, UnknownHandlerError
from ..model import Delivery, LedgerStatus, SessionState
from ..protocols.base import PullRequest
from ..state.errors import StaleWriteError, UnrecordableDeliveryError
from ..state.items import LedgerItem
from .budget import self_pull_fits
from .capacity import capacity_limit
from .context import LambdaContextLike
from .pipeline import deliver
from .poison import settle_unrecordable
from .pulling import NotAskedFor, criteria, discard_duplicate, long_running, pull_asked_for
from .retry_owners import CLIENT_RETRIED
from .services import Services
from .session import same_session
from .settle import Settlement, Settler, hand_back, handback_epoch, settle

__all__ = ["STOP_REASONS", "Facts", "SelfPull", "keep_pulling", "stop_reason"]

log = logging.getLogger("serverless_worker.self_pull")

# Why an executor stops pulling, in the order :func:`stop_reason` asks.
STOP_REASONS: tuple[str, ...] = (
    "stopped", "draining", "unfit", "rate_limited", "pull_error", "refused", "session", "empty", "cap",
    "no_timeout", "time", "capacity",
)
# A self-pulled run's ledger deadline: its own run's end plus this much for the store and
# report calls (docs/ledger.md), then the reaper's grace, as for the executor's first run.
RUN_SLACK_SECONDS = 10.0
REAP_GRACE_SECONDS = 30.0


@dataclass(frozen=True)
class Facts:
    """What the decision to pull again rests on, read by the loop (see :func:`stop_reason`)."""

    last_full: bool                 # the last pull (the executor's own, or the scheduler's) came back full
    remaining: float                # seconds left in this invocation
    next_budget: float | None       # the handler's declared timeout; None: no declared timeout
    report_margin: float
    done: int                       # deliveries this invocation has taken so far
    max_jobs: int
    control: Mapping[str, Any]      # the instance's control item (draining, stopped, unfit)
    handler: str
    in_flight: int                  # the ledger's in-flight count, as last read
    limit: int                      # runtime.capacity.capacity_limit
    new_slot: bool = False          # a puller's first pull takes a new slot (<); else our own is handed over (<=)
    refused: bool = False           # the last delivery was refused, handed back or lost its lease
    session_ok: bool = True         # a fresh stored session (or none needed), and no recovery since
    pull_error: str | None = None   # "rate_limited" or "pull_error": the last pull raised


def stop_reason(facts: Facts) -> str | None:
    """``None`` to pull one more delivery, else why not (one of :data:`STOP_REASONS`)."""
    control = facts.control
    if control.get("stopped"):
        return "stopped"
    if control.get("draining"):
        return "draining"
    if facts.handler in (control.get("unfit") or {}):
        return "unfit"
    if facts.pull_error is not None:
        return facts.pull_error
    if facts.refused:
        return "refused"
    if not facts.session_ok:
        return "session"
    if not facts.last_full:
        return "empty"
    if facts.done >= facts.max_jobs:
        return "cap"
    if facts.next_budget is None:
        # A handler with no declared timeout is promised the executor's whole time.
        return "no_timeout"
    if not self_pull_fits(remaining_lambda=facts.remaining, next_budget=facts.next_budget,
                          report_margin=facts.report_margin):
        return "time"
    if facts.in_flight > facts.limit or (facts.new_slot and facts.in_flight >= facts.limit):
        return "capacity"
    return None


@dataclass
class _Pulled:
    """A delivery this executor pulled and recorded, not started yet."""

    key: str
    delivery: Delivery
    epoch: str
    item: LedgerItem


@dataclass
class SelfPull:
    """The loop of one executor invocation for one handler (see the module's docstring)."""

    services: Services
    context: LambdaContextLike
    handler: str
    last_full: bool = True
    new_slot: bool = False
    done: int = 0
    stopped: str | None = None
    self_pulled: list[dict[str, str]] = field(default_factory=list)
    not_asked_for: int = 0  # deliveries its pulls brought that were not asked for, given back (runtime/pulling.py)
    _stash: _Pulled | None = None
    _checked_at: float = -math.inf
    _control: Mapping[str, Any] = field(default_factory=dict)
    _in_flight: int = 0
    _session: SessionState | None = None
    _lambda_limit: float = 0.0
    _pull_error: str | None = None  # "rate_limited", "session" or "pull_error": the last pull raised

    def __post_init__(self) -> None:
        self._session = self._held_session()
        # The invocation's whole time, as the first delivery's run sees it: whether a handler
        # can never fit is judged against it, never against what a late run has left.
        self._lambda_limit = self._remaining()

    # -- what the executor calls -----------------------------------------------------
    def settler(self) -> Settler:
        """The settler whose final write waits for this loop's next pull."""
        return replace(self.services.settler(), before_final=self._before_final)

    def first(self) -> None:
        """A puller's first pull, before it holds a slot."""
        self.new_slot = True
        try:
            self._pull_next()
        finally:
            self.new_slot = False

    def run(self) -> None:
        """Run every delivery the hook pulled, one after another, until one is not followed."""
        try:
            while self._stash is not None and self.stopped is None:
                pulled, self._stash = self._stash, None
                self._run(pulled)
        finally:
            self._give_back_stash()
        if self.stopped is None:
            self.stopped = "empty"

    def end(self, reason: str) -> None:
        """Stop here: the delivery being settled failed; hand back what was pulled and not run."""
        self._stop(reason)
        self._give_back_stash()

    def after(self, settlement: Settlement | None) -> None:
        """Note how the delivery just run was settled: one refused, handed back or with
        its lease lost ends the loop."""
        if settlement is None or settlement.action != "reported":
            self._stop("refused")

    # -- the hook -----------------------------------------------------------------------
    def _before_final(self) -> None:
        if self._stash is not None or self.stopped is not None:
            return  # a second ack of the same delivery (a forgotten job re-reported)
        self._pull_next()

    def _pull_next(self) -> None:
        """Pull until one delivery is recorded to run next or a reason to stop is found (a
        duplicate or a delivery the ledger cannot hold is settled unrun, and counts as taken)."""
        try:
            while self._stash is None and self.stopped is None:
                reason = stop_reason(self._facts())
                if reason is not None:
                    self._stop(reason)
                    return
                self._pull_and_record()
        except Exception:
            self._stop("pull_error")
            raise

    def _facts(self) -> Facts:
        services, settings = self.services, self.services.settings
        now = services.clock()
        if self.new_slot or now - self._checked_at >= settings.self_pull_check_seconds:
            self._checked_at = now
            self._control = services.store.get_control(services.protocol_name, services.instance)
            self._in_flight = services.store.count_in_flight(services.protocol_name, services.instance,
                                                             live_at=now)
        try:
            timeout = services.registry.get(self.handler).timeout
        except UnknownHandlerError:  # never pull for a handler this stack does not have
            timeout = None
        return Facts(last_full=self.last_full, remaining=self._remaining(), next_budget=timeout,
                     report_margin=settings.report_margin_seconds, done=self.done,
                     max_jobs=settings.self_pull_max_jobs, control=self._control, handler=self.handler,
                     in_flight=self._in_flight, limit=capacity_limit(settings), new_slot=self.new_slot,
                     session_ok=self._pull_error != "session" and self._session_ok(),
                     pull_error=self._pull_error if self._pull_error != "session" else None)

    def _session_ok(self) -> bool:
        """A fresh stored session, never a bootstrap (Pipelogiq), and the same one this loop began with."""
        services = self.services
        protocol = services.protocol
        if not protocol.needs_session:
            return True
        held = services.keeper.ensure(protocol, bootstrap=False)
        if held is None:
            return False
        if self._session is None:
            self._session = held
        return same_session(held, self._session)

    def _held_session(self) -> SessionState | None:
        services = self.services
        if not services.protocol.needs_session:
            return None
        return services.keeper.session

    def _pull_and_record(self) -> None:
        services = self.services
        request = PullRequest(handler=self.handler, max_items=1, wait_seconds=0,
                              criteria=criteria(services, self.handler))
        # Each error ends the loop (stop_reason), none is waited on: pacing and back-off
        # are the scheduler's.
        unasked_before = self.not_asked_for
        try:
            deliveries = pull_asked_for(services, request, unaddressable=_log_unaddressable,
                                        not_asked=self._note_not_asked)
        except RateLimitedError as err:
            log.info("self-pull rate limited: %s", err)
            self._pull_error = "rate_limited"
            return
        except SessionExpiredError as err:
            log.info("self-pull: worker session rejected: %s", err)
            self._pull_error = "session"
            return
        except (ProtocolError, ConfigurationError) as err:
            log.warning("self-pull: pull failed: %s", err)
            self._pull_error = "pull_error"
            return
        self.last_full = len(deliveries) >= 1
        if deliveries:  # never more than the one asked for: pull_asked_for gave back the rest
            self._admit(deliveries[0])
        elif self.not_asked_for > unasked_before:
            self._stop("refused")  # the server hands out what we did not ask for: pacing is the scheduler's

    def _note_not_asked(self, unasked: NotAskedFor) -> None:
        self.not_asked_for += 1

    def _admit(self, delivery: Delivery) -> None:
        """Record ``delivery`` as running under a new run epoch, or settle what cannot run here."""
        services = self.services
        if long_running(services, delivery.handler):
            # A long-running handler's delivery: the state machine runs those, not this loop.
            self._give_back(delivery, record=True)
            self._stop("refused")
            return
        epoch = f"{self.context.aws_request_id}/{uuid.uuid4().hex[:8]}"
        now = services.clock()
        settled_before = now if services.protocol.settled_id_returns_as_new else None
        try:
            item = self._record_running(delivery, epoch=epoch, deadline=self._deadline(now),
                                        settled_before=settled_before)
        except UnrecordableDeliveryError as err:
            settle_unrecordable(services, delivery, err)
            self.done += 1
            return
        except Exception:
            self._give_back(delivery)
            raise
        self.done += 1
        if item is None:
            discard_duplicate(services, delivery)
            return
        self._stash = _Pulled(key=item.key, delivery=delivery, epoch=epoch, item=item)

    def _record_running(self, delivery: Delivery, *, epoch: str, deadline: float,
                        settled_before: float | None) -> LedgerItem | None:
        """The scheduler's record and the claim in one write (``StateStore.record_running``),
        under the same rules as the scheduler's deliveries."""
        services = self.services
        return services.store.record_running(delivery, instance=services.instance, epoch=epoch, deadline=deadline,
                                             again_after_hand_back=True, settled_before=settled_before)

    def _deadline(self, now: float) -> float:
        """The run's own end (its budget, the report margin and slack), not the Lambda's:
        a killed self-pulled run is reaped soon."""
        settings = self.services.settings
        budget = self.services.registry.get(self.handler).timeout or 0.0
        run = min(self._remaining(), budget + settings.report_margin_seconds + RUN_SLACK_SECONDS)
        return now + run + REAP_GRACE_SECONDS

    # -- running what was pulled -------------------------------------------------------
    def _run(self, pulled: _Pulled) -> None:
        services = self.services
        item, key, delivery = pulled.item, pulled.key, pulled.delivery
        action = "unknown"
        try:
            if item.status is LedgerStatus.OUTCOME_STORED and item.outcome is not None:
                # A forgotten job with our outcome stored: re-report it, never run it again.
                settlement = settle(self.settler(), key, delivery, item.outcome)
            else:
                settlement = deliver(services, key, delivery, epoch=pulled.epoch, remaining=self._remaining,
                                     lambda_limit=self._lambda_limit, settler=self.settler())
            action = settlement.action
            self.after(settlement)
        except StaleWriteError:
            log.warning("self-pulled run of %s was taken over (the reaper or a newer run owns it): its outcome was "
                        "not stored, and is lost; the owner settles the job", key)
            action = "superseded"
            self._stop("superseded")
        except CLIENT_RETRIED as err:
            log.warning("self-pulled delivery %s left to the reaper, which settles it at the time noted on it "
                        "(%s): nothing is lost", key, err)
            action = "deferred"
            self._stop("deferred")
        finally:
            self.self_pulled.append({"ledger_key": key, "action": action})

    def _remaining(self) -> float:
        return self.context.get_remaining_time_in_millis() / 1000

    def _stop(self, reason: str) -> None:
        if self.stopped is None:
            self.stopped = reason
            log.info("executor stops pulling for %s: %s", self.handler, reason,
                     extra={"self_pull": {"handler": self.handler, "stopped": reason, "done": self.done}})

    # -- handing back ----------------------------------------------------------------------
    def _give_back(self, delivery: Delivery, *, record: bool = False) -> None:
        """Return an unstarted delivery we cannot run; with ``record`` under a hand-back
        claim first, so the ledger fences a redelivery the same way as the drain's."""
        services = self.services
        if record:
            claim = handback_epoch()
            try:
                item = services.store.record_running(delivery, instance=services.instance, epoch=claim,
                                                     deadline=services.clock() + 60, again_after_hand_back=True)
                if item is None:
                    discard_duplicate(services, delivery)
                elif item.status is LedgerStatus.OUTCOME_STORED and item.outcome is not None:
                    settle(services.settler(), item.key, delivery, item.outcome)  # forgotten: re-report
                else:
                    hand_back(services.settler(), item.key, delivery, "not for this executor", epoch=claim)
                return
            except UnrecordableDeliveryError as err:
                settle_unrecordable(services, delivery, err)
                return
            except (ProtocolError, ConfigurationError) as err:
                log.warning("hand back of job %s failed: %s", delivery.job_id, err)
                return
        try:
            services.call(lambda p: p.hand_back(delivery))
        except ProtocolError as err:
            log.warning("hand back of job %s failed; left to the server's timeout: %s", delivery.job_id, err)

    def _give_back_stash(self) -> None:
        """The loop ended with a delivery recorded but not started: hand it back."""
        pulled, self._stash = self._stash, None
        if pulled is None:
            return
        try:
            hand_back(self.services.settler(), pulled.key, pulled.delivery, "executor stopped pulling",
                      epoch=pulled.epoch)
            self.self_pulled.append({"ledger_key": pulled.key, "action": "handed_back"})
        except Exception as err:  # noted on the item; the reaper takes it from its deadline
            log.warning("pulled delivery %s not handed back: %s", pulled.key, err)


def keep_pulling(services: Services, context: LambdaContextLike, handler: str, *,
                 first_full: bool, taken: int = 1) -> SelfPull:
    """The loop for ``handler``, to pass its :meth:`SelfPull.settler` to the first delivery
    (``first_full``: the pull that brought it came back full; ``taken``: the deliveries this
    invocation already has, 1 with the event's, 0 for a puller) and then :meth:`SelfPull.run`."""
    return SelfPull(services, context, handler, last_full=first_full, done=taken)


def _log_unaddressable(lacks: list[str]) -> None:
    for lack in lacks:
        log.warning("self-pull: a delivery with %s, left to the server's own return path", lack)

