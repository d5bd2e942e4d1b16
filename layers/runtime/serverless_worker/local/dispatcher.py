"""Fan-out for the local runner: the executor runs in a bounded thread pool, with a
Lambda-like context (a real deadline and a request id), instead of an async ``Invoke``;
long-running jobs start an execution of the real state machine in the embedded Step
Functions, exactly as in AWS.

An executor invocation that raises is retried with the same request id, as Lambda
retries an async invocation (``MaximumRetryAttempts`` in template.yaml), so the
executor's "never run a handler twice" path runs locally too; not once the dispatcher
is closed (the run is ending: what is left stays in the ledger for the next run).

The threads are daemon threads (``local/daemon_pool.py``): one stuck in a handler or a
report cannot keep the process alive after the run gave up on it.

Once the run is stopping (:meth:`LocalDispatcher.stop_starting`) nothing new starts: a
delivery pulled after that is refused (``DispatchError``: the scheduler hands it back
unstarted), and one queued but not yet started is left for the drain to hand back.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

from ..awsclients import StepFunctionsClient
from ..errors import DispatchError
from ..runtime.context import LambdaContextLike, LocalContext
from ..runtime.dispatch import AwsDispatcher, Dispatcher
from .daemon_pool import DaemonPool
from .observe import RunObserver

__all__ = ["ExecutorEntry", "LocalDispatcher"]

log = logging.getLogger("serverless_worker.local")

ExecutorEntry = Callable[[str, LambdaContextLike], dict[str, Any]]


class LocalDispatcher(Dispatcher):
    """Executors in ``concurrency`` threads; executions and callback tasks through
    ``sfn_client`` (the embedded Step Functions), as :class:`AwsDispatcher` does in AWS.

    ``attach(entry)`` gives it the executor entry (``execute`` bound to the shared
    Services), which is built after the dispatcher it contains.
    """

    def __init__(self, *, concurrency: int, executor_timeout: float, observer: RunObserver,
                 state_machine_arn: str | None = None, sfn_client: StepFunctionsClient | None = None,
                 retries: int = 2, retry_delay: float = 1.0) -> None:
        self._pool = DaemonPool(concurrency, name="executor")
        self._timeout = executor_timeout
        self._observer = observer
        self._retries = retries
        self._retry_delay = retry_delay
        self._entry: ExecutorEntry | None = None
        self._closed = threading.Event()
        self._stopping = threading.Event()  # the run is stopping: no new job starts
        self._executions = AwsDispatcher(executor_function=None, state_machine_arn=state_machine_arn,
                                         sfn_client=sfn_client) if state_machine_arn else None
        self.concurrency = concurrency

    def attach(self, entry: ExecutorEntry) -> None:
        self._entry = entry

    # -- Dispatcher ----------------------------------------------------------------------
    def invoke_executor(self, ledger_key: str, *, pull: bool = False) -> None:
        # ``pull`` is ignored: the local runner's executors never keep pulling (and it starts
        # no pullers: ``invoke_puller`` refuses, as the base class does).
        if self._entry is None:
            raise DispatchError("the local dispatcher has no executor attached")
        if self._closed.is_set():
            raise DispatchError("the local executor pool is shut down")
        if self._stopping.is_set():
            raise DispatchError("the worker is stopping: no new job starts")
        try:
            self._pool.submit(lambda: self._invoke(ledger_key))
        except RuntimeError as err:  # shut down between the check and the submit
            raise DispatchError("the local executor pool is shut down") from err
        self._observer.arrived()

    def start_execution(self, ledger_key: str, handover_epoch: str | None = None) -> None:
        if handover_epoch is None and self._stopping.is_set():  # a continue-as-new goes on
            raise DispatchError("the worker is stopping: no new job starts")
        self._state_machine().start_execution(ledger_key, handover_epoch)
        if handover_epoch is None:  # a continue-as-new is the same job, not a new arrival
            self._observer.arrived()

    def fail_task(self, task_token: str, *, error: str, cause: str) -> bool:
        return self._state_machine().fail_task(task_token, error=error, cause=cause)

    def heartbeat_task(self, task_token: str) -> bool:
        return self._state_machine().heartbeat_task(task_token)

    def _state_machine(self) -> AwsDispatcher:
        if self._executions is None:
            raise DispatchError("no state machine: the local runner found no long-running handler")
        return self._executions

    # -- the pool ------------------------------------------------------------------------
    def stop_starting(self) -> None:
        """The run is stopping: from now on no new job starts (see the module docstring)."""
        self._stopping.set()

    def _invoke(self, ledger_key: str) -> None:
        assert self._entry is not None
        if self._stopping.is_set():
            # Queued before the stop, not started: still RECORDED/DISPATCHED in the ledger,
            # which the drain hands back unstarted.
            log.info("executor for %s not started: the worker is stopping", ledger_key)
            return
        self._observer.executor_started()
        failed = False
        request_id = str(uuid.uuid4())  # kept across retries, as Lambda keeps it
        try:
            for attempt in range(1 + self._retries):
                context = LocalContext("executor", timeout_seconds=self._timeout, aws_request_id=request_id)
                try:
                    self._entry(ledger_key, context)
                    return
                except Exception as err:
                    # Messages of the project's errors never carry secrets; a handler's own
                    # exception never reaches here (it becomes the job's outcome).
                    if self._closed.is_set():
                        log.info("executor for %s ended by the shutdown (%s: %s); the delivery stays "
                                 "in the state file for the next run", ledger_key, type(err).__name__, err)
                        failed = True
                        return
                    left = self._retries - attempt
                    log.warning("executor for %s failed (%s: %s)%s", ledger_key, type(err).__name__, err,
                                f"; retrying ({left} left)" if left else "; giving up")
                    if not left:
                        failed = True
                        return
                    if self._closed.wait(self._retry_delay * (attempt + 1)):
                        failed = True  # closed meanwhile: not retried (see above)
                        return
        finally:
            self._observer.executor_finished(failed)

    def close(self, wait: bool = True) -> None:
        """Refuse new invocations; with ``wait``, let the queued and running ones finish."""
        self._closed.set()
        self._pool.shutdown(wait=wait)
