"""``serverless-worker local``: the Lambda stack's code, run in one process.

The same scheduler, executor and state-machine steps as in Lambda, with the AWS parts
replaced: scheduler ticks run back to back (each one poll window, as the EventBridge
schedule would start them), every delivery's executor runs in a bounded thread pool
with a Lambda-like context, and the state (ledger, session, counters) is a SQLite file
(``local/state_file.py``) under the same store contract as the stack's DynamoDB table.
Only when a handler is long-running does moto start (``EmbeddedAws``): its Step
Functions interpreter runs the real ASL, whose Task states call the steps in this
process, on the same SQLite store. Against the built-in sandbox it is a demo; pointed at
a real server, a worker for development or a plain VM.

A run that was killed leaves its deliveries in the state file; the next run on the same
file settles them before its first tick (``local/recovery.py``).

Stopping (Ctrl-C, SIGTERM, or ``until_idle_seconds`` without work) is the runtime's
drain: stop pulling, hand back what never started, let running jobs finish, shut the
worker down; then the summary. The exit status is 0 only when every delivery taken reached
a definite outcome on the server (the ledger, and what the run reported to the observer:
``RunObserver.unsettled``) and every answer of the server could be used
(``RunObserver.unusable_answer``); the summary lists what did not. Nothing outlasts the
drain's grace for long: once a stop is requested the scheduler's calls are no longer
retried, the drain's only within its grace, and when the grace is over every retry wait is
abandoned (``waits.py``) and a handler still running is left on its (daemon) thread; the
deliveries they held stay unsettled in the ledger, the summary lists them, the exit status
is not 0, and the next run on the same file settles them.

Example::

    runner = LocalRunner(settings, own_sandbox=True, console=Console(), live=True)
    sys.exit(runner.run())
"""

from __future__ import annotations

import json
import logging
import math
import signal
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from .. import errors
from ..errors import (
    ERROR_PREFIX,
    AuthenticationError,
    BadRequestError,
    ConfigurationError,
    ForbiddenError,
    NotFoundAfterRetryError,
    NotFoundError,
    ServerlessWorkerError,
    SessionExpiredError,
)
from ..protocols.transport import display_url
from ..runtime.context import LambdaContextLike, LocalContext, invocation_time_limit
from ..runtime.drain import drain, resume_pulling
from ..runtime.executor import execute_or_defer
from ..runtime.metrics import metrics
from ..runtime.scheduler import Scheduler, TickReport
from ..runtime.services import Services
from ..runtime.steps import run_step
from ..state.items import LedgerItem
from ..waits import abandon_waits, allow_waits, end_waits_by, time_limit
from .defaults import LOCAL_LEDGER_RETENTION_SECONDS, TTL_SWEEP_SECONDS
from .demo import SAMPLES_DIRECTORY, OwnSandbox, SampleJobs, new_key, sample_jobs
from .dispatcher import LocalDispatcher
from .first_contact import FirstContactError, HeldLogs, probe, refusal, unsupported_detail
from .handler_module import demo_handler_names, load_local_handlers
from .observe import RunObserver, instrument
from .progress import PROGRESS_SHOWN, Progress, Status, progress_text
from .project import find_project_root
from .recovery import RecoveryReport, recover, recovery_note
from .state_file import LocalState
from .summary import RunSummary, ledger_records, render_summary, summarize, summary_document
from .template import function_timeout

if TYPE_CHECKING:
    from .aws import EmbeddedAws

__all__ = ["EXIT_CONFIGURATION", "EXIT_FORCED", "EXIT_INCOMPLETE", "LocalRunner"]

log = logging.getLogger("serverless_worker.local")
_JOB_LOG = logging.getLogger("serverless_worker.job")  # job.log's logger: progress lines go with them

EXIT_INCOMPLETE = 1      # a delivery was left without a definite outcome, the server sent answers
                         # the worker could not use (RunObserver.unsettled, .unusable_answer), or
                         # the server was never reached
EXIT_CONFIGURATION = 2   # the job server refused the configuration (key, permissions, names), or
                         # speaks a protocol version none of whose deliveries can be addressed
EXIT_FORCED = 130        # a second Ctrl-C: stopped without waiting

# Once a stop is requested (Ctrl-C, SIGTERM, idleness, a fatal tick), every wait on the
# server's word ends this soon and no call is retried after it, whatever the server answers:
# the drain's own calls go once each, and the run ends within about 5 s plus one request's
# timeout (a handler still running keeps the drain's grace).
STOP_WAIT_SECONDS = 3.0

# A tick that ends with one of these cannot succeed by trying again: the configuration is wrong.
# Errors that no number of retries can cure: the run stops with EXIT_CONFIGURATION. An
# expired session is re-bootstrapped, and a 404 after an ambiguous retry means "applied".
_FATAL_ERRORS = (ConfigurationError, AuthenticationError, ForbiddenError, BadRequestError, NotFoundError)
_RECOVERABLE_ERRORS = (SessionExpiredError, NotFoundAfterRetryError)
_POLL = 0.25  # how often the controller refreshes the status and checks for idleness
# How long the status line and the log wait for the first tick: a refused first contact
# (a bad key, an unknown queue) shows within a fraction of a second of it.
_FIRST_CONTACT_HOLD = 2.0


def _unique(detail: str) -> str:
    """``a; a; b`` as ``a; b``: a tick's report repeats the same error once per pull."""
    return "; ".join(dict.fromkeys(part.strip() for part in detail.split(";") if part.strip()))


def _told_to_wait(item: LedgerItem) -> bool:
    """A delivery whose settling call the client gave up on because the server rate-limited it
    (its noted error a ``RateLimitedError``): nothing this run does soon can settle it."""
    return bool(item.settle_failures) and str(item.error or "").startswith(errors.RateLimitedError.__name__)


def _is_fatal(error_class: type[BaseException]) -> bool:
    """Whether an error of ``error_class`` ends the run: checked on the error tree (errors.py)."""
    return issubclass(error_class, _FATAL_ERRORS) and not issubclass(error_class, _RECOVERABLE_ERRORS)


@dataclass
class _Stop:
    """Why the run is stopping, and with which exit status if not the ledger's verdict."""

    reason: str
    exit_status: int | None = None
    never_reached: bool = False  # the server refused the first contact: no drain, no summary


class LocalRunner:
    """One local run; ``run()`` returns the process exit status.

    ``ledger_retention_seconds``: how long settled ledger items stay in the state file
    before the store's sweep deletes them (see ``defaults.LOCAL_LEDGER_RETENTION_SECONDS``).
    """

    def __init__(self, settings: Any, *, own_sandbox: bool, console: Any, live: bool,
                 ledger_retention_seconds: int = LOCAL_LEDGER_RETENTION_SECONDS, stats: bool = False,
                 demo_handlers: bool = False, json_summary: bool = False) -> None:
        self.settings = settings
        self.demo_handlers = demo_handlers  # the built-in demo's handlers may run against another server
        self.json_summary = json_summary    # the summary as JSON on stdout (``console`` is then stderr)
        self.stats = stats  # the summary's HTTP-call and state-store tables (--stats)
        self.ledger_retention_seconds = ledger_retention_seconds
        self.own_sandbox = own_sandbox
        self.console = console
        self.live = live
        self._stop_requested = threading.Event()   # set on a signal, idleness or a fatal tick
        self._hurry = threading.Event()            # a second signal: stop waiting
        self._signals: list[int] = []              # appended by the signal handler, nothing else
        self._stop: _Stop | None = None
        self._stop_lock = threading.Lock()
        self._reached_server = False
        self._server_errors = 0
        self._last_warning = ""  # the last "tick ended early" logged, so a repeat is not logged again
        self._first_tick_done = threading.Event()
        self._scheduler_ready = threading.Event()  # _scheduler is set (a stop may come before)
        self._last_trouble = ""  # the last tick error, for the one line when nothing got through
        self._observer = RunObserver()
        self._services: Services      # set by _work, before anything reads them
        self._scheduler: Scheduler
        self._tick_timeout = 120.0
        self._state: LocalState       # set by _build
        self._swept = 0               # settled items the state file's sweep deleted during the run
        self._started_at = time.time()
        self._recovered = RecoveryReport()
        self._server_note: str | None = None  # the state file served another server until now
        self._dispatcher: LocalDispatcher | None = None  # set by _build; told when a stop is requested
        self._intro: list[str] = []   # the banner and start-up notes, printed once the server let us in
        self._progress_logged = 0     # the last job.progress report logged (RunObserver's seq)

    # -- the run -------------------------------------------------------------------------
    def run(self) -> int:
        started = time.monotonic()
        self._started_at = time.time()
        root = find_project_root()
        loaded = load_local_handlers(self.settings.handler_module, root, list(self.settings.handlers))
        names = list(self.settings.handlers) or loaded.names()
        demo = demo_handler_names(loaded, names)
        if demo and not self.own_sandbox and not self.demo_handlers:
            raise ConfigurationError(
                f"{', '.join(demo)} {'is' if len(demo) == 1 else 'are'} the built-in demo's handler"
                f"{'' if len(demo) == 1 else 's'} ({self.settings.handler_module}), which run against "
                f"{display_url(self.settings.base_url)} only with --demo-handlers; name your own module with "
                "--handler-module FILE.py (or SW_HANDLER_MODULE), or pick only yours with --handlers NAME")
        registry = instrument(loaded, self._observer)
        allow_waits()  # a new run: retry waits are allowed again (see _give_up)
        with ExitStack() as cleanup:
            # First: a SIGTERM during start-up then drains (nothing taken yet) instead of killing.
            cleanup.callback(self._restore_signals, self._install_signals())
            sandbox = self._start_sandbox(cleanup) if self.own_sandbox else None
            if sandbox is None:
                probe(self.settings)  # nothing listens there: one line, before anything starts
            samples = sample_jobs(self.settings.protocol, names, demo, root) if sandbox is not None else None
            services, aws, scheduler, dispatcher = self._build(registry, names, cleanup)
            if sandbox is not None and samples is not None:
                sandbox.seed(samples.seeds)
            # The banner waits for the first contact: a server that refuses it gets one line
            # instead (first_contact.refusal), not a banner that promised a run.
            self._intro = self._banner(sandbox, aws, names, dispatcher.concurrency, samples)
            if self._server_note:
                self._intro.append(f"  {self._server_note}")
            # Starting is resuming: the flags an earlier run left in a kept file (its drain on
            # Ctrl-C, a stop, unfit handlers) are cleared, as `drain --resume` clears them.
            resume_pulling(services)
            self._recovered = recover(services)
            if self._recovered.total:
                self._intro.append(f"  {recovery_note(self._recovered)}")
            progress = Progress(self.console, live=self.live)  # started once the first contact went through
            cleanup.callback(progress.stop)
            held = HeldLogs().attach(logging.getLogger().handlers)
            cleanup.callback(held.detach)
            forced = self._work(services, scheduler, dispatcher, progress, held)
            self._give_up(dispatcher)
            if self._stop is not None and self._stop.never_reached:
                progress.abandon()
                held.drop()
                raise FirstContactError(self._stop.reason)
            if not forced and (self._stop is None or self._stop.exit_status is None) and self._nothing_got_through():
                # The server answered HTTP but no bootstrap or pull went through (5xx, 429 to the
                # end): a summary would be all zeros. One line says what happened instead.
                progress.abandon()
                print(f"{ERROR_PREFIX}the job server at {display_url(self.settings.base_url)} "
                      f"never answered a bootstrap or pull that went through ({self._last_trouble or 'see the log'})"
                      "; nothing was taken", file=sys.stderr)
                return EXIT_INCOMPLETE
            self._refresh(progress)  # the last progress lines, before the summary
            progress.stop()
            summary = self._summary(services, sandbox, time.monotonic() - started)
            status, verdict = self._verdict(summary, forced)
            if self.json_summary:
                document = summary_document(summary, exit_status=status, verdict=verdict)
                sys.stdout.write(json.dumps(document, indent=2) + "\n")
                sys.stdout.flush()
            else:
                self.console.print(render_summary(summary, stats=self.stats, results=self.own_sandbox),
                                   soft_wrap=True)
            if self._swept:
                self.console.print(f"({self._swept} settled items older than "
                                   f"{self.ledger_retention_seconds} s were swept from the state file; "
                                   "the summary counts the rest)", highlight=False, markup=False)
            if verdict is not None:
                self.console.print(verdict, highlight=False, markup=False)
        return status

    def _start_sandbox(self, cleanup: ExitStack) -> OwnSandbox:
        """Our own sandbox, accepting only this run's key (a given key, or a fresh one)."""
        key = self.settings.api_key.get_secret_value() if self.settings.api_key else new_key()
        sandbox = OwnSandbox.start(self.settings.protocol, key)
        cleanup.callback(sandbox.stop)
        self.settings = self.settings.model_copy(update={"base_url": sandbox.url, "api_key": SecretStr(key)})
        return sandbox

    def _build(self, registry: Any, names: list[str],
               cleanup: ExitStack) -> tuple[Services, EmbeddedAws | None, Scheduler, LocalDispatcher]:
        settings = self.settings
        concurrency = int(settings.executor_reserved_concurrency or 1)
        retention = self.ledger_retention_seconds
        self._state = LocalState.open(settings.state_path, final_retention_seconds=retention,
                                      sweep_interval=min(TTL_SWEEP_SECONDS, max(1.0, retention / 2)),
                                      on_swept=self._forget)
        cleanup.callback(self._state.close)
        if not self._state.temporary:
            # A wholly other server: said right below the banner.
            self._server_note = self._state.claim_server(settings.protocol, display_url(settings.base_url))
        shared: list[Services] = []

        def steps(event: dict[str, Any], context: LambdaContextLike) -> dict[str, Any]:
            with invocation_time_limit(context):  # as Lambda's entry runs a step
                return run_step(shared[0], event, context)

        # moto only for the long-running path: its Step Functions interpreter runs the real
        # ASL. Started before the first tick (0.6 s): started beside it, its imports slowed
        # every job running beside them more than waiting does (docs/local-development.md).
        aws: EmbeddedAws | None = None
        arn = None
        if any(registry.get(name).long_running for name in names):
            from .aws import EmbeddedAws

            aws = EmbeddedAws.start(pool_size=concurrency + 32, state_table=False)
            cleanup.callback(aws.close)
            arn = aws.install_state_machine({"StepsFunction": steps})
        dispatcher = LocalDispatcher(concurrency=concurrency, observer=self._observer,
                                     executor_timeout=function_timeout("ExecutorFunction"),
                                     state_machine_arn=arn, sfn_client=aws.sfn if aws is not None else None)
        cleanup.callback(dispatcher.close, False)
        self._dispatcher = dispatcher
        overrides = {"transport": "socket"} if settings.transport == "socket" else {}
        services = Services(settings=settings, store=self._state.store,
                            registry=registry, dispatcher=dispatcher, client_overrides=overrides,
                            watcher=self._observer, sleep=self._sleep)  # a refused job's wait ends on a stop
        shared.append(services)
        cleanup.callback(services.close)
        dispatcher.attach(lambda key, context: execute_or_defer(services, key, context))
        scheduler = Scheduler(services, sleep=self._sleep, dispatch_workers=min(16, concurrency),
                              wait_for_capacity=self._wait_for_capacity)
        cleanup.callback(scheduler.close)
        self._tick_timeout = function_timeout("SchedulerFunction")
        return services, aws, scheduler, dispatcher

    def _banner(self, sandbox: OwnSandbox | None, aws: EmbeddedAws | None, names: list[str],
                concurrency: int, samples: SampleJobs | None = None) -> list[str]:
        settings = self.settings
        notes: list[str] = []
        if sandbox is not None:
            sources = sorted(set((samples.sources if samples is not None else {}).values()))
            kind = "demo" if sources == ["the demo"] else "sample"
            origin = "" if kind == "demo" or not sources else f" from {', '.join(sources)}"
            where = (f"{settings.protocol} sandbox (built in) at {sandbox.url}, "
                     f"{sandbox.seeded} {kind} job{'s' if sandbox.seeded != 1 else ''}{origin}")
            for name in samples.missing if samples is not None else []:
                notes.append(f"  no sample job for {name}: put its input in {SAMPLES_DIRECTORY}/{name}.json "
                             "(a JSON object, or a list of them) and run again")
        else:
            transport = f", {settings.transport} transport" if settings.transport != "http" else ""
            where = f"{settings.protocol} server at {settings.base_url}{transport}"
        machine = (f"the real state machine in embedded Step Functions (moto at {aws.endpoint})"
                   if aws is not None else "no long-running handler, no state machine")
        state = "a temporary file" if self._state.temporary else str(self._state.path)
        stop = (f"drains when idle for {settings.until_idle_seconds:g} s or on Ctrl-C"
                if settings.until_idle_seconds else "runs until Ctrl-C, which drains")
        lines = [
            f"serverless-worker local: {where}",
            f"  handlers {', '.join(names)} · {concurrency} executor threads · "
            f"instance {settings.instance_id}",
            f"  state: SQLite {state} · {machine}",
            f"  {stop}",
            *notes,
        ]
        return lines

    def _print_intro(self) -> None:
        """The banner and what start-up found, once the server let us in (or a stop came first)."""
        for line in self._intro:
            # The server note names a URL and a path: never wrapped mid-way.
            self.console.print(line, highlight=False, markup=False, soft_wrap=line == f"  {self._server_note}")
        self._intro = []

    def _forget(self, keys: list[str]) -> None:
        """Swept ledger items: their handler starts are no longer needed for the summary."""
        self._swept += sum(1 for key in keys if key.startswith("delivery#"))
        self._observer.forget([key.split("#", 2)[-1] for key in keys if key.startswith("delivery#")])

    # -- working and stopping ------------------------------------------------------------
    def _work(self, services: Services, scheduler: Scheduler, dispatcher: LocalDispatcher,
              progress: Progress, held: HeldLogs) -> bool:
        """Tick until asked to stop, then drain; returns whether a second signal cut it short."""
        self._services = services
        self._scheduler = scheduler
        self._scheduler_ready.set()
        ticker = threading.Thread(target=self._tick_loop, name="scheduler-ticks", daemon=True)
        self._observer.restart_clock()
        unfit_seen = metrics.totals["HandlerCannotFit"]  # before the first tick, which may add one
        ticker.start()
        self._await_first_contact()
        if self._stop is not None and self._stop.never_reached:
            # Nothing was taken and the server refused us: no draining flag, no shutdown call.
            ticker.join(self._tick_timeout)
            return False
        self._print_intro()
        held.release()
        progress.start()
        progress.phase("working")
        idle = self.settings.until_idle_seconds
        stuck_after = (idle or 0) + self.settings.drain_grace_seconds

        def is_idle(quiet: float) -> bool:
            return quiet >= stuck_after or self._deliveries_running() == 0

        while not self._stop_requested.is_set():
            self._check_signals()
            self._refresh(progress)
            if metrics.totals["HandlerCannotFit"] > unfit_seen:
                self._stop_unfit(services)
            if idle and self._observer.quiet_for() >= idle and self._observer.end_pulls_if_idle(idle, is_idle):
                self._request_stop(f"no job for {idle:g} s")
            self._stop_requested.wait(_POLL)
        stop = self._stop or _Stop("stopped")
        note = f"draining ({stop.reason}): no new pulls; running jobs finish, unstarted ones go back"
        announced = not self._nothing_got_through()  # the first tick may still say otherwise
        if announced:
            progress.phase("draining", note=note)
        try:
            services.store.set_draining(services.protocol_name, services.instance, True)
        except ServerlessWorkerError as err:
            log.warning("draining flag not set: %s", err)
        scheduler.wake()
        if not self._wait(ticker, progress):
            return True
        if self._nothing_got_through():
            # Nothing taken, nothing to hand back: a drain's heartbeat, events and shutdown
            # would each try to bootstrap first against a server that never let us in.
            return self._hurry.is_set()
        if not announced:
            progress.phase("draining", note=note)
        drainer = threading.Thread(target=self._drain, args=(services,), name="drain", daemon=True)
        drainer.start()
        if not self._wait(drainer, progress):
            return True
        dispatcher.close(wait=False)
        self._refresh(progress)
        return self._hurry.is_set()

    @staticmethod
    def _give_up(dispatcher: LocalDispatcher) -> None:
        """The drain is over: whatever still runs is abandoned. No executor is retried and
        every retry wait ends now (its call fails, its delivery stays unsettled in the
        ledger); a stuck handler stays on its daemon thread, which cannot hold the process."""
        dispatcher.close(wait=False)
        abandon_waits()

    def _nothing_got_through(self) -> bool:
        """No bootstrap or pull ever went through and no delivery was taken."""
        return not self.own_sandbox and not self._reached_server and self._observer.arrivals == 0

    def _await_first_contact(self) -> None:
        """Until the first tick ends (or a refusal, a signal, ``_FIRST_CONTACT_HOLD`` seconds):
        a refused first contact must end in its one line, not after a status line and logs."""
        deadline = time.monotonic() + _FIRST_CONTACT_HOLD
        while not self._first_tick_done.is_set() and not self._stop_requested.is_set():
            self._check_signals()
            if self._first_tick_done.wait(min(_POLL, max(0.0, deadline - time.monotonic()))) or \
                    time.monotonic() >= deadline:
                return

    def _stop_unfit(self, services: Services) -> None:
        """A handler's timeout can never fit its limits (``runtime/fit.py``): a configuration
        error, so the run stops with exit status 2 and says which and why."""
        try:
            unfit = services.store.get_control(services.protocol_name, services.instance)["unfit"]
        except ServerlessWorkerError as err:
            unfit = {"?": f"(control not readable: {err})"}
        reasons = "; ".join(unfit.values()) or "a handler's timeout cannot fit its limits"
        self._request_stop(f"configuration refused: {reasons}", exit_status=EXIT_CONFIGURATION)

    def _wait(self, thread: threading.Thread, progress: Progress) -> bool:
        """Join ``thread`` while refreshing the status; ``False`` when a second signal says stop now."""
        while thread.is_alive():
            self._check_signals()
            if self._hurry.is_set():
                return False
            self._refresh(progress)
            thread.join(_POLL)
        return True

    def _drain(self, services: Services) -> None:
        grace_end = time.monotonic() + self.settings.drain_grace_seconds
        try:
            # Calls are retried within the grace only: after it, the heartbeat and the shutdown
            # call are made once each. No shutdown call to a server no pull ever reached (a
            # bootstrap that kept failing): it has no worker of ours to stop, and the call
            # would only bootstrap one first.
            with time_limit(lambda: grace_end - time.monotonic()):
                drain(services, grace_seconds=self.settings.drain_grace_seconds, poll_seconds=0.2,
                      sleep=self._sleep_unless_hurried, shutdown=self._reached_server)
        except ServerlessWorkerError as err:
            log.warning("drain did not complete: %s", err)

    def _tick_loop(self) -> None:
        """Ticks back to back; a failed tick is followed by the next one, as a schedule would.
        Once a stop is requested, the tick's calls are no longer retried (nor waited for on a
        server's Retry-After): the drain waits for this tick before it starts."""
        with time_limit(lambda: 0.0 if self._stop_requested.is_set() else math.inf):
            self._ticks()

    def _ticks(self) -> None:
        failures = 0
        while not self._stop_requested.is_set():
            started = time.monotonic()
            context = LocalContext("scheduler", timeout_seconds=self._tick_timeout)
            try:
                report = self._scheduler.tick(context)
            except Exception as err:
                if _is_fatal(type(err)):
                    self._refused(type(err), str(err))
                    return
                failures += 1
                self._server_errors += 1
                self._last_trouble = f"{type(err).__name__}: {err}"
                log.warning("scheduler tick failed (%s: %s): nothing is lost (what it recorded is settled by the next "
                            "tick's reaper; what it pulled and did not record the server hands out again); next "
                            "tick in %.0f s", type(err).__name__, err,
                            min(10.0, 0.5 * 2 ** failures))
                self._stop_requested.wait(min(10.0, 0.5 * 2 ** failures))
                continue
            for reason in report.unusable:
                self._observer.unusable_answer(reason)
            for unasked in report.not_asked_for:
                self._observer.not_asked_for(unasked["kind"])
                if not unasked["given_back"]:
                    self._observer.unsettled(unasked["job_id"], f"not asked for ({unasked['why']}); giving it "
                                             "back failed")
            if self._reached(report):
                self._reached_server, failures, self._last_warning = True, 0, ""
            self._first_tick_done.set()
            if not self._after_tick(report):
                return
            if report.stopped is not None or time.monotonic() - started < 1.0:
                failures += report.stopped is not None
                self._stop_requested.wait(min(10.0, max(0.5, 0.5 * 2 ** failures)))

    def _after_tick(self, report: TickReport) -> bool:
        """Act on why a tick stopped early; ``False`` ends the tick loop."""
        stopped = report.stopped
        if stopped is None:
            return True
        if stopped == "draining":
            self._request_stop("drain requested")
            return False
        if stopped == "stopped":
            reason = self._services.store.get_control(self._services.protocol_name,
                                                      self._services.instance).get("stopped")
            self._request_stop(f"worker stopped: {reason}", exit_status=EXIT_CONFIGURATION)
            return False
        cause = getattr(errors, stopped.rpartition(": ")[2], None)  # the report names the error's class
        if isinstance(cause, type) and _is_fatal(cause):
            self._refused(cause, "; ".join(report.errors) or stopped)
            return False
        self._last_trouble = _unique("; ".join(report.errors)) or stopped
        warning = f"tick ended early ({stopped}): {'; '.join(report.errors)}"
        if warning != self._last_warning:  # once while the cause stays the same, not every tick
            log.warning("%s", warning)
            self._last_warning = warning
        return True

    def _refused(self, cause: type[BaseException], detail: str) -> None:
        """The server refused the configuration: before it was ever reached, that is the
        first contact's one-line error (no drain, no summary); later, a stop with exit 2."""
        if not self._reached_server:
            names = list(self.settings.handlers) or self._services.handler_names()
            self._request_stop(str(refusal(self.settings, cause, _unique(detail), names)),
                               exit_status=EXIT_CONFIGURATION, never_reached=True)
        elif issubclass(cause, errors.UnsupportedServerError):
            # The server was reached (empty pulls first), then handed out only deliveries
            # this worker cannot address: its protocol version, not a setting, is the cause.
            self._request_stop(f"the job server cannot be worked: {unsupported_detail(_unique(detail))}",
                               exit_status=EXIT_CONFIGURATION)
        else:
            self._request_stop(f"configuration refused: {detail}", exit_status=EXIT_CONFIGURATION)

    def _reached(self, report: TickReport) -> bool:
        """The tick's pulls reached the job server (one went through); notes trouble when not."""
        pull_errors = sum(1 for error in report.errors if error.startswith("pull:"))
        self._server_errors += pull_errors + (report.stopped is not None and report.stopped != "draining")
        return report.pulls > pull_errors

    def _status(self) -> Status:
        """Jobs, as the summary counts them, from what the runtime told the observer in this
        process: the status line, four times a second, costs no DynamoDB read."""
        jobs = self._observer.jobs()
        return Status(taken=jobs.taken, running=jobs.running, done=jobs.done, failed=jobs.failed,
                      handed_back=jobs.handed_back, discarded=jobs.discarded,
                      progress=tuple(self._observer.running_progress(PROGRESS_SHOWN)))

    def _refresh(self, progress: Progress) -> None:
        """The status line redrawn, and each ``job.progress`` reported since the last
        refresh logged once (its last value per job), at INFO beside the job's log lines."""
        progress.update(self._status())
        for entry in self._observer.progress_after(self._progress_logged):
            _JOB_LOG.info("progress %s", progress_text(entry.value),
                          extra={"job_id": entry.job_id, "handler": entry.handler})
            self._progress_logged = max(self._progress_logged, entry.seq)

    def _deliveries_running(self) -> int:
        """Deliveries something in this run still works on: what idleness waits for. The least
        of two counts, each blind where the other sees: those dispatched and not settled (an
        executor that failed every retry counted as settled: nothing will settle it in this
        run), and the ledger's in flight less those a server told to wait longer than the
        worker can (a 429 the client gave up on: left to the reaper and the next run, the drain
        tries each once more). An outcome whose report met an outage still counts: the
        reaper tries it again at each tick, and may well get it through before the run ends
        (idleness still ends the run once quiet for the idle time plus the drain's grace)."""
        counters = self._services.counters.totals()
        settled = sum(counters.get(name, 0) for name in ("processed", "handed_back", "discarded"))
        dispatched = max(0, self._observer.arrivals - settled - self._observer.executor_errors)
        if dispatched == 0:
            return 0
        services = self._services
        try:
            items = services.store.in_flight(services.protocol_name, services.instance)
        except ServerlessWorkerError:
            return dispatched
        return min(dispatched, sum(1 for item in items if not _told_to_wait(item)))

    def _request_stop(self, reason: str, exit_status: int | None = None, never_reached: bool = False) -> None:
        with self._stop_lock:
            if self._stop is None:
                self._stop = _Stop(reason, exit_status, never_reached)
        if self._dispatcher is not None:
            self._dispatcher.stop_starting()  # from now on, a delivery pulled is handed back unstarted
        end_waits_by(time.monotonic() + STOP_WAIT_SECONDS)  # no wait on the server's word outlasts the stop
        if self._scheduler_ready.is_set():
            self._scheduler.halt()  # no pull after this: the tick's sleeps end at once from now on
        self._stop_requested.set()
        self._observer.capacity.set()

    def _sleep(self, seconds: float) -> None:
        """The scheduler's sleeps end early once a stop is requested."""
        self._stop_requested.wait(seconds)

    def _wait_for_capacity(self, seconds: float) -> None:
        """A full tick waits until an executor finishes (or a stop), not a fixed second."""
        self._observer.capacity.wait(seconds)
        self._observer.capacity.clear()

    def _sleep_unless_hurried(self, seconds: float) -> None:
        if self._hurry.wait(seconds):
            raise ServerlessWorkerError("drain cut short by a second signal")

    # -- signals -------------------------------------------------------------------------
    def _install_signals(self) -> dict[int, Any]:
        def on_signal(signum: int, frame: FrameType | None) -> None:
            # Only note it: a handler runs between two bytecodes of the main thread, which may
            # hold any lock (an Event's included); the controller acts on it within _POLL.
            self._signals.append(signum)

        return {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

    def _check_signals(self) -> None:
        """The first signal drains; a second one stops waiting."""
        if self._signals:
            self._request_stop(signal.Signals(self._signals[0]).name)
        if len(self._signals) > 1:
            self._hurry.set()

    @staticmethod
    def _restore_signals(previous: dict[int, Any]) -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    # -- the end ---------------------------------------------------------------------------
    def _summary(self, services: Services, sandbox: OwnSandbox | None, seconds: float) -> RunSummary:
        admin_created: dict[str, float] | None = None
        server_calls: dict[str, int] | None = None
        if sandbox is not None:
            try:
                admin_created, server_calls = sandbox.server_view()
            except Exception as err:  # the summary still stands on the ledger
                log.warning("sandbox admin API not readable: %s", type(err).__name__)
        try:
            client_calls = dict(services.protocol.calls)  # type: ignore[attr-defined]
        except (AttributeError, ServerlessWorkerError):
            client_calls = {}
        observer = self._observer
        # This run's share of the file: what is in flight, and what it wrote (a kept file also
        # holds earlier runs' settled deliveries until their retention ends).
        records = ledger_records(self._state.store.ledger_documents(updated_since=self._started_at))
        return summarize(records, protocol=self.settings.protocol,
                         seconds=seconds, handler_starts=dict(observer.handler_starts),
                         handler_runs=observer.handler_runs, executor_errors=observer.executor_errors,
                         admin_created=admin_created, client_calls=client_calls, server_calls=server_calls,
                         store_ops=dict(services.store.ops), unsettled=observer.unsettled_deliveries(),
                         unusable=observer.unusable_answers(), not_asked_for=observer.not_asked_for_counts(),
                         deliberate=sandbox.deliberate if sandbox is not None else None)

    def _verdict(self, summary: RunSummary, forced: bool) -> tuple[int, str | None]:
        """The exit status, and the line that says why when it is not 0."""
        stop = self._stop
        if forced:
            return EXIT_FORCED, "stopped without draining (second signal)"
        if stop is not None and stop.exit_status is not None:
            return stop.exit_status, f"{ERROR_PREFIX}{stop.reason}"
        if not summary.definite:
            count = len(summary.unsettled)
            return EXIT_INCOMPLETE, (f"{ERROR_PREFIX}{count} deliver{'y' if count == 1 else 'ies'} left without a "
                                     "definite outcome on the server (listed above)")
        if summary.unusable:
            return EXIT_INCOMPLETE, (f"{ERROR_PREFIX}the server sent {sum(summary.unusable.values())} answers "
                                     "the worker could not use (listed above)")
        if summary.not_asked_for:
            return EXIT_INCOMPLETE, (f"{ERROR_PREFIX}the server sent {sum(summary.not_asked_for.values())} "
                                     "deliveries the worker did not ask for, each given back untouched (see the log)")
        # Deliveries an earlier run left and this one settled without running are not "ran none".
        if summary.taken > self._recovered.stranded and not summary.handler_runs:
            return EXIT_INCOMPLETE, (f"{ERROR_PREFIX}took {summary.taken} job(s) and ran none of them (see the "
                                     "log for why each went back)")
        if not self._reached_server and self._server_errors:
            return EXIT_INCOMPLETE, f"{ERROR_PREFIX}the job server was never reached (see the log)"
        return 0, None
