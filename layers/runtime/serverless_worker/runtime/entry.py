"""What the Lambda entry points call: build the runtime once per container from the
environment, run one tick / delivery / step, publish metrics.

Configuration is loaded on the first invocation, not at import, so a misconfigured
stack fails with one clear ``ConfigurationError`` naming each bad setting instead of an
import crash. Likewise an AWS setup problem that escapes the runtime (no credentials, no
region, an endpoint it cannot reach, a table or state machine that does not exist) ends
an invocation as one ``ConfigurationError`` saying what to fix, not a botocore traceback;
the project's own errors pass through unchanged.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..awsclients import aws_setup_error, check_region
from ..errors import ConfigurationError, ServerlessWorkerError
from .context import WAIT_MARGIN_SECONDS, LambdaContextLike, invocation_time_limit

if TYPE_CHECKING:
    from .metrics import Metrics
    from .scheduler import Scheduler
    from .services import Services

__all__ = ["WAIT_MARGIN_SECONDS", "aws_setup_error", "drain_worker", "execute_delivery", "reset_services",
           "scheduler_tick", "services_from_environment", "state_machine_step", "tick_trigger"]

log = logging.getLogger("serverless_worker.entry")


@functools.cache
def services_from_environment() -> Services:
    """Settings, handlers, state store and dispatcher, built once per container.

    No AWS client is built here: each one is built on its first call (``awsclients``), so
    a function pays only for the clients it uses.
    """
    from ..registry import default_registry, load_handlers
    from ..settings import load_settings
    from ..state import DynamoStateStore
    from .dispatch import AwsDispatcher
    from .services import Services

    settings = load_settings()
    _package_log_level(settings.log_level)
    if settings.handler_module:
        load_handlers(settings.handler_module)
    check_region()
    store = DynamoStateStore(settings.table_name or "")  # an unset name is refused there, clearly
    dispatcher = AwsDispatcher(executor_function=settings.executor_function_name,
                               state_machine_arn=settings.state_machine_arn)
    return Services(settings=settings, store=store, registry=default_registry, dispatcher=dispatcher)


def _package_log_level(level: str) -> None:
    """Let the package's own records through at ``SW_LOG_LEVEL``.

    In Lambda its loggers inherit the runtime's root level, WARNING, so every INFO line
    ("tick done", each settled delivery) was dropped where it was made. This only ever
    lowers the level, and only in Lambda: elsewhere (the local runner, tests) whoever set up
    logging decides.
    """
    if not os.environ.get("AWS_LAMBDA_FUNCTION_NAME"):
        return
    package = logging.getLogger("serverless_worker")
    wanted = logging.getLevelName(level.upper())
    if isinstance(wanted, int) and package.getEffectiveLevel() > wanted:
        package.setLevel(wanted)


@functools.cache
def _scheduler() -> Scheduler:
    from .scheduler import Scheduler

    return Scheduler(services_from_environment())


def reset_services() -> None:
    """Forget the cached runtime (tests and the local runner switch environments)."""
    services_from_environment.cache_clear()
    _scheduler.cache_clear()


def _metrics() -> Metrics:
    from .metrics import metrics

    return metrics


Entry = Callable[[dict[str, Any], LambdaContextLike], dict[str, Any]]

def _clear_errors(entry: Entry) -> Entry:
    """Let the project's errors through; turn AWS setup errors into one ConfigurationError.
    No retry wait outlasts the invocation (``waits.time_limit``): a server's Retry-After
    ends ``WAIT_MARGIN_SECONDS`` before Lambda's timeout would, so the failed call is
    recorded instead of the invocation being killed mid-wait."""

    @functools.wraps(entry)
    def wrapper(event: dict[str, Any], context: LambdaContextLike) -> dict[str, Any]:
        try:
            with invocation_time_limit(context):
                return entry(event, context)
        except ServerlessWorkerError:
            raise
        except Exception as err:
            clear = aws_setup_error(err)
            if clear is None:
                raise
            raise clear from err

    return wrapper


def tick_trigger(event: Any) -> dict[str, str]:
    """What started a tick, for the scheduler function's first log line: ``schedule`` (an
    EventBridge scheduled event, with its rule's name) or ``direct`` (an operator's or a
    test's invoke). Only these fixed words and the rule name are logged, never the event."""
    if isinstance(event, dict) and event.get("source") == "aws.events" \
            and event.get("detail-type") == "Scheduled Event":
        resources = event.get("resources") or [""]
        rule = str(resources[0]).rpartition("/")[2] if isinstance(resources, list) and resources else ""
        return {"trigger": "schedule", "rule": rule}
    return {"trigger": "direct"}


@_clear_errors
def scheduler_tick(event: dict[str, Any], context: LambdaContextLike) -> dict[str, Any]:
    report = _scheduler().tick(context, window=event.get("poll_window_seconds") if event else None)
    m = _metrics()
    m.add("DeliveriesPulled", report.pulled)
    m.add("DeliveriesDispatched", report.dispatched)
    m.add("DuplicatesDiscarded", report.duplicates)
    m.add("DispatchFailed", report.dispatch_failed)
    m.add("StrandedReaped", report.reaped)
    m.add("PullersStarted", report.pullers)
    m.add("DeliveriesNotAskedFor", len(report.not_asked_for))
    if not any(e.startswith("pull:") for e in report.errors) and report.pulls:
        m.add("SuccessfulPolls", 1)
    m.flush()
    return report.as_dict()


@_clear_errors
def execute_delivery(event: dict[str, Any], context: LambdaContextLike) -> dict[str, Any]:
    """One delivery (``{"ledger_key": k}``), then more pulled for its handler where the
    event says the scheduler's pull came back full (``"pull": true``); or a puller
    (``{"pull": {"handler": h, "by": t}}``). With ``self_pull`` off, only the ledger key counts."""
    from .executor import execute_or_defer, pull_for

    key, pull, puller = _executor_event(event)
    services = services_from_environment()
    m = _metrics()
    if puller is not None:
        handler, by = puller
        if not services.settings.self_pull:
            log.warning("puller event for %s ignored: self_pull is off", handler)
            return {"handler": handler, "action": "skipped", "stopped": "off"}
        result = pull_for(services, handler, by, context)
        if result.get("action") == "late":
            m.add("PullersLate", 1)
    else:
        result = execute_or_defer(services, key, context, pull=pull and services.settings.self_pull)
        m.add(f"Jobs_{result.get('action', 'unknown')}", 1)
    if result.get("not_asked_for"):
        m.add("DeliveriesNotAskedFor", result["not_asked_for"])
    for pulled in result.get("self_pulled") or ():  # Jobs_<action> once per delivery, not per invocation
        m.add(f"Jobs_{pulled['action']}", 1)
        m.add("SelfPulled", 1)
    m.flush()
    return result


def _executor_event(event: Any) -> tuple[str, bool, tuple[str, float] | None]:
    """``(ledger key, pull flag, None)`` for a delivery, ``("", False, (handler, by))`` for a
    puller (runtime/dispatch.py); a ConfigurationError naming the shapes for anything else."""
    body = event if isinstance(event, dict) else {}
    key, pull = body.get("ledger_key"), body.get("pull")
    if isinstance(key, str) and key:
        return key, pull is True, None
    if key is None and isinstance(pull, dict):
        handler, by = pull.get("handler"), pull.get("by")
        if isinstance(handler, str) and handler and isinstance(by, int | float) and not isinstance(by, bool):
            return "", False, (handler, float(by))
    raise ConfigurationError('executor event must be {"ledger_key": "..."} (with "pull": true after a full '
                             'pull) or {"pull": {"handler": "...", "by": <epoch seconds>}}')


@_clear_errors
def state_machine_step(event: dict[str, Any], context: LambdaContextLike) -> dict[str, Any]:
    from .steps import run_step

    return run_step(services_from_environment(), event, context)


@_clear_errors
def drain_worker(event: dict[str, Any], context: LambdaContextLike) -> dict[str, Any]:
    from .control import pull_quiet_seconds
    from .drain import drain, resume_pulling

    services = services_from_environment()
    if event.get("resume"):
        resume_pulling(services)
        return {"resumed": True}
    # The scheduler runs in other invocations: wait out a tick that read the flag just before it was set.
    quiet = pull_quiet_seconds(services.settings, long_poll=services.protocol.long_poll)
    report = drain(services, grace_seconds=float(event.get("grace_seconds", 60)), quiet_seconds=quiet)
    return dict(report.__dict__)
