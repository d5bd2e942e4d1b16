"""The two ways a delivery reaches an executor, for the fault suites that run on both.

``scheduler``: the scheduler pulls, records and invokes one executor per delivery
(``self_pull`` pinned off, whatever the template's default). ``self-pull``: an executor
that finished a short job pulls its handler's next one itself while pulls come back full,
and a full pull makes the scheduler start more executors (docs/limits.md). Only a handler
with a declared timeout is pulled that way, so a scenario names its handler per path.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from serverless_worker.local.moto_lambda import FakeLambdaContext

__all__ = ["PATHS", "PATH_SETTINGS", "SELF_PULL_CLAIM_LEASE_SECONDS", "claim_lease", "on_path", "retry_invocation",
           "scenario", "settings", "watch_record_running"]

PATHS = ("scheduler", "self-pull")
PATH_SETTINGS: dict[str, dict[str, Any]] = {"scheduler": {"self_pull": False}, "self-pull": {"self_pull": True}}
# The self-pull path's handlers declare a timeout (2.5 s), and on the claim queue a delivery
# starts only if that whole timeout fits what the unrenewable lease has left after the claim,
# the record and the 2 s margin (runtime/budget.py). On a loaded 2-core machine those steps
# take seconds, so a 5 s lease hands every job back as "cannot fit" and no executor ever
# pulls; 12 s leaves room and still brings a lapsed claim back within the run.
SELF_PULL_CLAIM_LEASE_SECONDS = 12


def settings(path: str, **extra: Any) -> dict[str, Any]:
    """The stack's settings for ``path`` (``SW_*`` without the prefix), plus ``extra``."""
    return {**PATH_SETTINGS[path], **extra}


def claim_lease(path: str, seconds: float) -> float:
    """The claim queue's lease for a scenario on ``path``: ``seconds`` on the scheduler's path,
    at least ``SELF_PULL_CLAIM_LEASE_SECONDS`` on the self-pull path."""
    return seconds if path == "scheduler" else max(seconds, SELF_PULL_CLAIM_LEASE_SECONDS)


def on_path(path: str, handler: str) -> str:
    """The handler a scenario runs on ``path``: on the self-pull path its ``-timed`` twin."""
    return handler if path == "scheduler" else f"{handler}-timed"


def scenario(name: str, path: str) -> str:
    """The matrix row's scenario: the self-pull path's rows are marked, the scheduler's are as before."""
    return name if path == "scheduler" else f"{name} [self-pull]"


def watch_record_running(monkeypatch: pytest.MonkeyPatch, env: Any,
                         after: Callable[[Any, Any, bool], None] | None = None) -> dict[str, list[str]]:
    """Wrap the executors' ``store.record_running`` (the services' store is shared with the
    test): every job id it admits is noted, split by whether its invocation had already
    stored an outcome (a hand-over: the next job pulled before the last one's final write)
    or not (a puller's first pull). ``after(delivery, item, handover)`` runs after each real
    write, e.g. to kill the invocation there."""
    store = env.stack.store()
    real = store.record_running
    finished: set[int] = set()  # invocation threads that stored an outcome
    noted: dict[str, list[str]] = {"handover": [], "first": []}
    lock = threading.Lock()
    real_store_outcome = store.store_outcome

    def store_outcome(*args: Any, **kwargs: Any) -> Any:
        result = real_store_outcome(*args, **kwargs)
        with lock:
            finished.add(threading.get_ident())
        return result

    def record_running(delivery: Any, *args: Any, **kwargs: Any) -> Any:
        item = real(delivery, *args, **kwargs)
        with lock:
            handover = threading.get_ident() in finished
            if item is not None:
                noted["handover" if handover else "first"].append(str(delivery.job_id))
        if after is not None and item is not None:
            after(delivery, item, handover)
        return item

    monkeypatch.setattr(store, "record_running", record_running)
    monkeypatch.setattr(store, "store_outcome", store_outcome)
    return noted


def retry_invocation(env: Any, request_id: str) -> dict[str, Any]:
    """Lambda's retry of the Event invocation ``request_id`` that ended in an unhandled error:
    the same event again, under the same request id (the harness gives every API invoke a
    new one, so the retry calls the registered entry point directly, as Lambda would)."""
    name = env.stack.function_names["ExecutorFunction"]
    (first,) = [i for i in list(env.stack.lambdas.invocations)
                if i.function_name == name and i.context.aws_request_id == request_id]
    was = first.context
    context = FakeLambdaContext(function_name=was.function_name, invoked_function_arn=was.invoked_function_arn,
                                memory_limit_in_mb=was.memory_limit_in_mb, aws_request_id=was.aws_request_id,
                                timeout_seconds=was.timeout_seconds)
    entry = env.stack.lambdas._handlers[name]
    return dict(entry(dict(first.event), context))
