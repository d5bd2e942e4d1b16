"""Every patch on moto's private internals, in one place, for the moto versions it was written against.

The local runner, the AWS test tier and the benchmarks run the project's Lambda code and
ASL inside moto. That needs a few changes to how moto behaves (docs/contributing/moto-notes.md says why
each one exists): Lambda invoked in this process, Step Functions retries that need not
sleep, definite JSONPaths evaluated as AWS does, DynamoDB requests made atomic and cheaper,
executions stopped for good. Each reaches into a module moto does not promise to keep, so
importing this module checks moto's version first and refuses an untested one with one
line that says what is installed and what is supported, rather than failing later with an
``AttributeError`` deep inside a run.

Every patch lives as long as the ``ExitStack`` it is given and is process-wide meanwhile
(``defer_batch_backend``, which only delays an import, stays).
"""

from __future__ import annotations

import datetime
import logging
import re
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from importlib import metadata
from types import SimpleNamespace
from typing import Any
from unittest import mock

from ..errors import ConfigurationError

__all__ = [
    "MOTO_REQUIREMENT",
    "MOTO_VERSION",
    "SUPPORTED_MOTO",
    "UnsupportedMotoError",
    "abort_running_executions",
    "call_in_process",
    "check_moto_version",
    "count_secret_reads",
    "lambda_in_process_and_real_asl",
    "patch_definite_jsonpaths",
    "record_retry_sleeps",
    "route_lambda_invoke",
    "serialize_dynamodb",
    "time_dynamodb_requests",
    "tune_dynamodb",
]

log = logging.getLogger("serverless_worker.local")

# The releases whose internals the patches below were read from and tested on, as
# [lowest, first unsupported) (major, minor, patch): moto changes its internals between
# patch releases (5.2.6 moved its errors from AWSError to ServiceException), so the range
# is one release wide until another is tested. pyproject.toml pins the same range (a unit
# test keeps the two in step).
SUPPORTED_MOTO = ((5, 2, 6), (5, 2, 7))
MOTO_REQUIREMENT = "moto>={},<{}".format(*(".".join(map(str, bound)) for bound in SUPPORTED_MOTO))
_INTERNAL_FAILURE = '{"__type": "InternalFailure", "message": "embedded DynamoDB error"}'
_DEFINITE_PATH = re.compile(r"\$(?:\.[A-Za-z_][\w-]*|\[\d+\]|\['[^']*'\])*")


class UnsupportedMotoError(ConfigurationError):
    """The installed moto is not one whose internals this module patches."""


def check_moto_version(installed: str | None = None) -> str:
    """Return the installed moto version, or raise :class:`UnsupportedMotoError`."""
    if installed is None:
        try:
            installed = metadata.version("moto")
        except metadata.PackageNotFoundError:
            raise UnsupportedMotoError(
                f"moto is not installed; the local runner and the AWS tests need {MOTO_REQUIREMENT!r}: "
                f"pip install '{MOTO_REQUIREMENT}'") from None
    release = tuple(int(part) for part in re.findall(r"\d+", installed)[:3])
    lowest, unsupported = SUPPORTED_MOTO
    if not lowest <= release < unsupported:
        raise UnsupportedMotoError(
            f"moto {installed} is installed, and serverless-worker patches moto's internals as they are "
            f"in {MOTO_REQUIREMENT!r} only: pip install '{MOTO_REQUIREMENT}'")
    return installed


MOTO_VERSION = check_moto_version()


# -- Lambda and Step Functions -------------------------------------------------------------

def lambda_in_process_and_real_asl(stack: ExitStack) -> None:
    """Lambda without Docker (``route_lambda_invoke`` runs the code) and the real ASL interpreter."""
    from moto.core.config import default_user_config

    stack.enter_context(mock.patch.dict(default_user_config, {
        "lambda": {**default_user_config.get("lambda", {}), "use_docker": False},
        "stepfunctions": {**default_user_config.get("stepfunctions", {}), "execute_state_machine": True},
    }))


def route_lambda_invoke(stack: ExitStack, invoke: Callable[..., bytes]) -> None:
    """Every Lambda Invoke calls ``invoke(backend, function_name, qualifier, body, headers,
    response_headers)`` (see ``moto_lambda.InProcessLambda.backend_invoke``)."""
    from moto.awslambda_simple.models import LambdaSimpleBackend

    def patched(backend: LambdaSimpleBackend, *args: Any) -> bytes:
        return invoke(backend, *args)

    stack.enter_context(mock.patch.object(LambdaSimpleBackend, "invoke", patched))


def record_retry_sleeps(stack: ExitStack, sleep: Callable[[float], None]) -> None:
    """A Retrier's ``IntervalSeconds`` is a real sleep in moto: hand each one to ``sleep`` instead."""
    from moto.stepfunctions.parser.asl.component.common.retry import retrier_decl

    stack.enter_context(mock.patch.object(retrier_decl, "time", SimpleNamespace(sleep=sleep)))


def defer_batch_backend() -> None:
    """Load ``moto.batch`` without running its package ``__init__`` until something uses it.

    The ASL interpreter imports its AWS Batch task, which needs ``moto.batch.utils.JobStatus``
    only; importing that runs ``moto/batch/__init__.py``, which loads moto's Batch and EC2
    models: 0.67 s of the local runner's 1.7 s start with a long-running handler
    (``python -m benchmarks.first_pull --path long``). The package is put in place
    unexecuted, so ``moto.batch.utils`` loads alone; the first attribute anything reads
    from the package itself (moto's backend lookup reads ``batch_backends``) runs its
    ``__init__`` then, in place, so a state machine that does use Batch still works.

    Unlike the patches below it takes no ``ExitStack`` and is not undone: it changes when
    moto's own code runs, not what it does, and the package is the real one once loaded.
    """
    if "moto.batch" in sys.modules:
        return
    import importlib
    import importlib.util

    spec = importlib.util.find_spec("moto.batch")
    if spec is None or spec.loader is None:  # not this moto's layout: load it as it comes
        return
    package = importlib.util.module_from_spec(spec)
    loader = spec.loader
    loading = threading.Lock()

    def load_package(name: str) -> Any:
        with loading:
            if "__getattr__" in package.__dict__:
                del package.__dict__["__getattr__"]
                loader.exec_module(package)
        try:
            return package.__dict__[name]
        except KeyError:
            raise AttributeError(f"module 'moto.batch' has no attribute {name!r}") from None

    package.__dict__["__getattr__"] = load_package
    sys.modules["moto.batch"] = package
    import moto

    moto.batch = package  # type: ignore[attr-defined]  # as an import of the package would set it


def patch_definite_jsonpaths(stack: ExitStack) -> None:
    """moto 5.2.5 returns ``[v]`` for ``$.a[0].b`` (AWS returns ``v``): evaluate definite paths plainly."""
    defer_batch_backend()
    import moto.stepfunctions.parser.asl.parse.preprocessor  # noqa: F401  (loads every component)
    from moto.stepfunctions.parser.asl.utils import json_path

    original = json_path.extract_json

    def extract_json(path: str, data: Any) -> Any:
        if _DEFINITE_PATH.fullmatch(path):
            matches = json_path.parse(path).find(data)
            if len(matches) == 1:
                return matches[0].value
        return original(path, data)

    for name, module in list(sys.modules.items()):
        patchable = name.startswith("moto.stepfunctions.parser.") and module is not json_path
        if patchable and getattr(module, "extract_json", None) is original:
            stack.enter_context(mock.patch.object(module, "extract_json", extract_json))


def abort_running_executions(timeout: float = 5.0) -> None:
    """Stop every RUNNING execution. ``stop_execution`` alone does not wake a Task that waits
    for a task token (or a Lambda call), so its threads would outlive the caller."""
    from moto.stepfunctions.parser.models import stepfunctions_parser_backends

    stopping = []
    for _account, regions in stepfunctions_parser_backends.items():
        for _region, backend in regions.items():
            for machine in backend.state_machines:
                for execution in machine.executions:
                    worker = execution.exec_worker  # type: ignore[attr-defined]
                    env = worker.env if worker else None
                    if execution.status != "RUNNING" or env is None:
                        continue
                    env.set_stop(stop_date=datetime.datetime.now(datetime.UTC), cause=None, error=None)
                    for endpoint in list(env.callback_pool_manager._pool.values()):
                        endpoint.interrupt_all()
                    stopping.append(execution)
    deadline = time.monotonic() + timeout
    while any(e.status == "RUNNING" for e in stopping) and time.monotonic() < deadline:
        time.sleep(0.02)


# -- DynamoDB ------------------------------------------------------------------------------

def serialize_dynamodb(stack: ExitStack) -> None:
    """Make each moto DynamoDB request atomic, as DynamoDB makes each conditional write (moto
    checks a condition and writes without a lock in between; the ledger relies on the first)."""
    from moto.dynamodb.responses import DynamoHandler

    lock = threading.RLock()
    original = DynamoHandler.call_action

    def call_action(self: DynamoHandler) -> Any:
        with lock:
            return original(self)

    stack.enter_context(mock.patch.object(DynamoHandler, "call_action", call_action))


def call_in_process(client: Any, region: str) -> None:
    """Send ``client``'s DynamoDB requests straight to moto's DynamoDB handler in this process.

    Same backend, same table as the server holds, same request and answer bytes, but no
    loopback HTTP, werkzeug thread or URL routing per call: about 40% less CPU and a
    third of the latency per ledger write.
    """
    from botocore.awsrequest import AWSPreparedRequest, AWSResponse
    from moto.core.botocore_stubber import MockRawResponse
    from moto.core.exceptions import HTTPException
    from moto.core.request import normalize_request
    from moto.dynamodb.responses import DynamoHandler

    url = f"https://dynamodb.{region}.amazonaws.com/"  # what moto's handler expects to have been called

    def handle(request: Any, **_: Any) -> Any:
        routed = normalize_request(AWSPreparedRequest(method=request.method, url=url, headers=request.headers,
                                                      body=request.body, stream_output=False))
        try:
            status, headers, body = DynamoHandler.dispatch(routed, routed.raw_url, routed.headers)
        except HTTPException as err:
            status, headers, body = err.code, err.get_headers(), err.get_body()
        except Exception as err:  # a moto bug: answer as its server would, a retryable 500
            log.warning("embedded DynamoDB failed on a request: %s", type(err).__name__)
            status, headers, body = 500, {}, _INTERNAL_FAILURE
        return AWSResponse(request.url, status, headers, MockRawResponse(body))

    client.meta.events.register_first("before-send.dynamodb", handle)


def time_dynamodb_requests(stack: ExitStack, on_request: Callable[[float], None]) -> None:
    """Call ``on_request`` with the CPU seconds (this thread's) moto spent on each DynamoDB
    request: what DynamoDB, remote in AWS, would not cost the caller."""
    from moto.dynamodb.responses import DynamoHandler

    original = DynamoHandler.dispatch

    def dispatch(*args: Any, **kwargs: Any) -> Any:
        started = time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            on_request(time.thread_time() - started)

    stack.enter_context(mock.patch.object(DynamoHandler, "dispatch", dispatch))


def tune_dynamodb(stack: ExitStack, *, long_lived: bool = True) -> None:
    """Make moto's DynamoDB cost what DynamoDB's would per request, whatever the table's age.

    ``long_lived`` adds the two that only matter to a run that writes for minutes or hours
    (instances and empty partitions kept for good)."""
    _cache_module_list(stack)
    _unsorted_scan_in_queries(stack)
    if long_lived:
        _untracked_items(stack)
        _drop_empty_partitions(stack)


def _cache_module_list(stack: ExitStack) -> None:
    """moto's server lists its own package directory (a stat per service) on every request,
    under a global lock; the listing never changes while it runs, so compute it once."""
    from moto import backends

    modules = tuple(backends.list_of_moto_modules())
    stack.enter_context(mock.patch.object(backends, "list_of_moto_modules", lambda: modules))


def _unsorted_scan_in_queries(stack: ExitStack) -> None:
    """moto answers a query by sorting every item of the table, then sorting its matches
    again; the first sort is wasted, and it grows with the ledger (every settled delivery
    stays for its TTL). Within a query, take the items unsorted: the matches are still
    sorted before they are returned."""
    from moto.dynamodb.models.table import Table

    in_query = threading.local()
    all_items, query = Table.all_items, Table.query

    def unsorted_items(self: Table) -> Any:
        if not getattr(in_query, "active", False):
            return all_items(self)
        if self.range_key_attr:
            return [item for hash_set in self.items.values() for item in hash_set.values()]
        return list(self.items.values())

    def plain_query(self: Table, *args: Any, **kwargs: Any) -> Any:
        in_query.active = True
        try:
            return query(self, *args, **kwargs)
        finally:
            in_query.active = False

    stack.enter_context(mock.patch.object(Table, "all_items", unsorted_items))
    stack.enter_context(mock.patch.object(Table, "query", plain_query))


class _Untracked(list):  # type: ignore[type-arg]
    """A model's ``instances_tracked`` that keeps nothing."""

    def append(self, _: Any) -> None:
        return None


def _untracked_items(stack: ExitStack) -> None:
    """moto's ``BaseModel.__new__`` appends every model instance to a class-level list that
    only its ``/moto-api/data.json`` view reads, and never empties it. DynamoDB builds
    several ``Item`` copies per request, so every request was kept for good (~26 KB per job)."""
    from moto.dynamodb.models.dynamo_type import Item

    stack.enter_context(mock.patch.object(Item, "instances_tracked", _Untracked()))


def _drop_empty_partitions(stack: ExitStack) -> None:
    """moto keeps a table's items as ``{hash key: {range key: item}}`` and leaves the empty
    inner dict behind when the last item of a partition is deleted; every ledger item has a
    partition of its own, so each swept item would leave its key behind."""
    from moto.dynamodb.models.table import Table

    delete_item = Table.delete_item

    def delete_dropping_empty(self: Table, hash_key: Any, range_key: Any) -> Any:
        item = delete_item(self, hash_key, range_key)
        if range_key and not self.items.get(hash_key, True):
            self.items.pop(hash_key, None)
        return item

    stack.enter_context(mock.patch.object(Table, "delete_item", delete_dropping_empty))


# -- Secrets Manager -----------------------------------------------------------------------

def count_secret_reads(stack: ExitStack, on_read: Callable[[], None]) -> None:
    """Call ``on_read`` for every GetSecretValue that reaches moto's Secrets Manager (so a
    test can tell a cache hit from a read)."""
    from moto.secretsmanager.models import SecretsManagerBackend

    original = SecretsManagerBackend.get_secret_value

    def counted(backend: SecretsManagerBackend, *args: Any, **kwargs: Any) -> Any:
        on_read()
        return original(backend, *args, **kwargs)

    stack.enter_context(mock.patch.object(SecretsManagerBackend, "get_secret_value", counted))
