"""The AWS side of a local run, embedded: moto's server on loopback holding the state
table (built from template.yaml's ``StateTable``) and, when a handler is long-running,
the real state machine (``functions/statemachine/*.asl.json``) run by moto's Step
Functions interpreter, whose Task states call the project's steps in this process. The
runner's own DynamoDB client reaches the same table through moto's handler in-process
(``call_in_process``); the server answers everything else (the interpreter, ``aws`` CLI).

Quirks handled here are in docs/moto-notes.md (sections 1, 2 and 6): ``MOTO_PORT`` for
the interpreter's own calls, the in-process ``invoke`` patch, substitutions applied
before ``create_state_machine``, definite JSONPaths, and DynamoDB requests made atomic
(moto checks a condition and writes without a lock in between; DynamoDB never lets two
conditional writes both pass, and the ledger relies on that).

Example::

    aws = EmbeddedAws.start(pool_size=16)
    store = DynamoStateStore(aws.table_name, client=aws.dynamodb)
    arn = aws.install_state_machine({"StepsFunction": steps_entry})
    ...
    aws.close()
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from unittest import mock

from ..errors import ConfigurationError
from .moto_lambda import Handler, InProcessLambda, dummy_zip
from .table import create_state_table
from .template import function_reference, load_template, param_default, state_machine_definition, template_path

__all__ = ["REGION", "EmbeddedAws", "call_in_process", "serialize_dynamodb"]

log = logging.getLogger("serverless_worker.local")

REGION = "us-east-1"
STATE_MACHINE = "WorkerStateMachine"  # the logical id in template.yaml
_LOOPBACK = "127.0.0.1"
_INTERNAL_FAILURE = '{"__type": "InternalFailure", "message": "embedded DynamoDB error"}'
# Any value works with moto; explicit ones keep a developer's real AWS profile out of it.
_CREDENTIALS = {"aws_access_key_id": "local", "aws_secret_access_key": "local", "region_name": REGION}


def serialize_dynamodb(stack: ExitStack) -> None:
    """Make each moto DynamoDB request atomic, as DynamoDB makes each conditional write."""
    from moto.dynamodb.responses import DynamoHandler

    lock = threading.RLock()
    original = DynamoHandler.call_action

    def call_action(self: DynamoHandler) -> Any:
        with lock:
            return original(self)

    stack.enter_context(mock.patch.object(DynamoHandler, "call_action", call_action))


def call_in_process(client: Any) -> None:
    """Send ``client``'s DynamoDB requests straight to moto's DynamoDB handler in this process.

    Same backend, same table as the server holds, same request and answer bytes, but no
    loopback HTTP, werkzeug thread or URL routing per call: about 40% less CPU and a
    third of the latency per ledger write, which is most of the local runner's cost per job.
    """
    from botocore.awsrequest import AWSPreparedRequest, AWSResponse
    from moto.core.botocore_stubber import MockRawResponse
    from moto.core.exceptions import HTTPException
    from moto.core.request import normalize_request
    from moto.dynamodb.responses import DynamoHandler

    url = f"https://dynamodb.{REGION}.amazonaws.com/"  # what moto's handler expects to have been called

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


def _cache_module_list(stack: ExitStack) -> None:
    """moto's server lists its own package directory (a stat per service) on every request,
    under a global lock; the listing never changes while it runs, so compute it once."""
    from moto import backends

    modules = tuple(backends.list_of_moto_modules())
    stack.enter_context(mock.patch.object(backends, "list_of_moto_modules", lambda: modules))


def _unsorted_scan_in_queries(stack: ExitStack) -> None:
    """moto answers a query by sorting every item of the table, then sorting its matches
    again; the first sort is wasted, and it grows with the ledger (every settled delivery
    stays for its TTL), so the scheduler's in-flight count got slower with every job. Within
    a query, take the items unsorted: the matches are still sorted before they are returned."""
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
    several ``Item`` copies per request (the stored item, deep copies for conditions, scans
    and old values), so every request was kept for good: most of the local runner's
    ~26 KB per job. Items are not tracked in this process while the embedded server runs."""
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


def _moto_config(stack: ExitStack) -> None:
    """Lambda without Docker (the invoke patch runs the code) and a real ASL interpreter."""
    from moto.core.config import default_user_config

    stack.enter_context(mock.patch.dict(default_user_config, {
        "lambda": {**default_user_config.get("lambda", {}), "use_docker": False},
        "stepfunctions": {**default_user_config.get("stepfunctions", {}), "execute_state_machine": True},
    }))


def _environment(stack: ExitStack, port: int) -> None:
    """The interpreter calls Lambda at localhost:$MOTO_PORT; loopback must never go through a proxy."""
    no_proxy = ",".join(p for p in (os.environ.get("NO_PROXY", ""), _LOOPBACK, "localhost") if p)
    stack.enter_context(mock.patch.dict(os.environ, {"MOTO_PORT": str(port), "NO_PROXY": no_proxy,
                                                     "no_proxy": no_proxy}))


class EmbeddedAws:
    """moto's server in a thread, with the stack's table and (on request) state machine."""

    def __init__(self, *, server: Any, stack: ExitStack, template: Path, pool_size: int) -> None:
        import boto3
        from botocore.config import Config

        self._server = server
        self._stack = stack
        self._template = template
        host, port = server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        session = boto3.session.Session(**_CREDENTIALS)  # one session: creating clients is not thread-safe
        config = Config(max_pool_connections=pool_size, connect_timeout=3, read_timeout=30,
                        retries={"mode": "standard", "max_attempts": 3})
        self.dynamodb = session.client("dynamodb", endpoint_url=self.endpoint, config=config)
        call_in_process(self.dynamodb)
        self.sfn = session.client("stepfunctions", endpoint_url=self.endpoint, config=config)
        self._lambda = session.client("lambda", endpoint_url=self.endpoint, config=config)
        self._iam = session.client("iam", endpoint_url=self.endpoint, config=config)
        self.lambdas = InProcessLambda(record=False)
        self.table_name = ""
        self.state_machine_arn: str | None = None

    @classmethod
    def start(cls, *, pool_size: int = 32, template: Path | None = None) -> EmbeddedAws:
        """Serve moto on a free loopback port and create the state table."""
        from moto.awslambda_simple.models import LambdaSimpleBackend
        from moto.server import ThreadedMotoServer

        path = template_path(template)
        for name in ("werkzeug", "moto"):  # a line per request; ERROR lines for every caught ASL failure
            logging.getLogger(name).setLevel(logging.CRITICAL)
        stack = ExitStack()
        try:
            server = ThreadedMotoServer(ip_address=_LOOPBACK, port=0, verbose=False)
            server.start()
            stack.callback(server.stop)
            _environment(stack, server.get_host_and_port()[1])
            _moto_config(stack)
            _cache_module_list(stack)
            _unsorted_scan_in_queries(stack)
            _untracked_items(stack)
            _drop_empty_partitions(stack)
            serialize_dynamodb(stack)
            aws = cls(server=server, stack=stack, template=path, pool_size=pool_size)

            def invoke(backend: LambdaSimpleBackend, *args: Any) -> bytes:
                return aws.lambdas.backend_invoke(backend, *args)

            stack.enter_context(mock.patch.object(LambdaSimpleBackend, "invoke", invoke))
            name = f"serverless-worker-local-{uuid.uuid4().hex[:8]}"
            aws.table_name = create_state_table(aws.dynamodb, name, template=path).name
            return aws
        except BaseException:
            stack.close()
            raise

    def install_state_machine(self, functions: dict[str, Handler]) -> str:
        """Create the template's state machine, its substitutions pointing at in-process functions.

        ``functions`` maps a function's logical id (``StepsFunction``) to the code it runs.
        """
        from .moto_sfn import patch_definite_jsonpaths

        patch_definite_jsonpaths(self._stack)
        template = load_template(self._template)
        resources = template.get("Resources", {})
        substitutions = resources[STATE_MACHINE]["Properties"].get("DefinitionSubstitutions", {})
        role = self._iam.create_role(RoleName=f"serverless-worker-local-{uuid.uuid4().hex[:6]}",
                                     AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        values: dict[str, str] = {}
        for key, value in substitutions.items():
            target = function_reference(value)
            if target not in functions:
                raise ConfigurationError(
                    f"{STATE_MACHINE} substitution {key} = {value} is not a function the local runner runs "
                    f"({', '.join(functions)})")
            values[key] = self._create_function(template, target, functions[target], role)
        definition = state_machine_definition(STATE_MACHINE, values, self._template)
        self.state_machine_arn = self.sfn.create_state_machine(
            name=f"serverless-worker-local-{uuid.uuid4().hex[:6]}", definition=definition, roleArn=role,
            type="STANDARD")["stateMachineArn"]
        return self.state_machine_arn

    def _create_function(self, template: dict[str, Any], logical: str, handler: Handler, role: str) -> str:
        props = template["Resources"][logical]["Properties"]
        globals_ = template.get("Globals", {}).get("Function", {})
        name = f"{logical}-{uuid.uuid4().hex[:6]}"
        self.lambdas.register(name, handler)
        created = self._lambda.create_function(
            FunctionName=name, Runtime=props.get("Runtime", globals_.get("Runtime", "python3.13")),
            Role=role,
            Handler=props["Handler"], Code={"ZipFile": dummy_zip()},
            Timeout=int(param_default(template, props.get("Timeout", globals_.get("Timeout", 3)))),
            MemorySize=int(param_default(template, props.get("MemorySize", globals_.get("MemorySize", 128)))))
        return str(created["FunctionArn"])

    def function_timeout(self, logical: str) -> float:
        """The template's ``Timeout`` of a function (its parameter's default when it is a Ref)."""
        template = load_template(self._template)
        props = template["Resources"][logical]["Properties"]
        globals_ = template.get("Globals", {}).get("Function", {})
        return float(param_default(template, props.get("Timeout", globals_.get("Timeout", 3))))

    def close(self) -> None:
        """Stop what still runs in the interpreter, then the server; undo every patch."""
        if self.state_machine_arn is not None:
            from .moto_sfn import abort_running_executions

            abort_running_executions(timeout=2.0)
        if self.table_name:  # moto's backends are process-wide: the next run in this process starts empty
            try:
                self.dynamodb.delete_table(TableName=self.table_name)
            except Exception as err:  # closing goes on; only memory is at stake
                log.warning("embedded table not deleted: %s", type(err).__name__)
        self._stack.close()
