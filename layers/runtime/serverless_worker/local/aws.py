"""The AWS side of a local run, embedded: moto's server on loopback holding the state
table (built from template.yaml's ``StateTable``) and, when a handler is long-running,
the real state machine (``functions/statemachine/*.asl.json``) run by moto's Step
Functions interpreter, whose Task states call the project's steps in this process. The
runner's own DynamoDB client reaches the same table through moto's handler in-process
(``call_in_process``); the server answers everything else (the interpreter, ``aws`` CLI).

Quirks handled here are in docs/contributing/moto-notes.md (sections 1, 2 and 6): ``MOTO_PORT`` for
the interpreter's own calls and substitutions applied before ``create_state_machine``;
every patch on moto's internals (the in-process ``invoke``, definite JSONPaths, DynamoDB
requests made atomic) comes from ``moto_adapter``, which checks moto's version first.

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
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from unittest import mock

from ..errors import ConfigurationError
from . import moto_adapter
from .moto_lambda import Handler, InProcessLambda, dummy_zip
from .table import create_state_table
from .template import function_reference, load_template, param_default, state_machine_definition, template_path

__all__ = ["REGION", "EmbeddedAws"]

log = logging.getLogger("serverless_worker.local")

REGION = "us-east-1"
STATE_MACHINE = "WorkerStateMachine"  # the logical id in template.yaml
_LOOPBACK = "127.0.0.1"
# Any value works with moto; explicit ones keep a developer's real AWS profile out of it.
_CREDENTIALS = {"aws_access_key_id": "local", "aws_secret_access_key": "local", "region_name": REGION}


def _environment(stack: ExitStack, port: int) -> None:
    """The interpreter calls Lambda at localhost:$MOTO_PORT; loopback must never go through a proxy."""
    no_proxy = ",".join(p for p in (os.environ.get("NO_PROXY", ""), _LOOPBACK, "localhost") if p)
    stack.enter_context(mock.patch.dict(os.environ, {"MOTO_PORT": str(port), "NO_PROXY": no_proxy,
                                                     "no_proxy": no_proxy}))


class EmbeddedAws:
    """moto's server in a thread, with the stack's table and (on request) state machine."""

    def __init__(self, *, server: Any, stack: ExitStack, template: Path, pool_size: int,
                 state_table: bool = True) -> None:
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
        self.dynamodb: Any = None
        if state_table:
            self.dynamodb = session.client("dynamodb", endpoint_url=self.endpoint, config=config)
            moto_adapter.call_in_process(self.dynamodb, REGION)
        self.sfn = session.client("stepfunctions", endpoint_url=self.endpoint, config=config)
        self._lambda = session.client("lambda", endpoint_url=self.endpoint, config=config)
        self._iam = session.client("iam", endpoint_url=self.endpoint, config=config)
        self.lambdas = InProcessLambda(record=False)
        self.table_name = ""
        self.state_machine_arn: str | None = None

    @classmethod
    def start(cls, *, pool_size: int = 32, template: Path | None = None, state_table: bool = True) -> EmbeddedAws:
        """Serve moto on a free loopback port and create the state table, unless ``state_table``
        is false: the local runner keeps its ledger in SQLite and needs moto only for Step
        Functions (leaving out the table, its client and its patches saves 0.2 s of start)."""
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
            moto_adapter.lambda_in_process_and_real_asl(stack)
            if state_table:
                moto_adapter.tune_dynamodb(stack)
                moto_adapter.serialize_dynamodb(stack)
            aws = cls(server=server, stack=stack, template=path, pool_size=pool_size, state_table=state_table)
            moto_adapter.route_lambda_invoke(stack, aws.lambdas.backend_invoke)
            if state_table:
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
        moto_adapter.patch_definite_jsonpaths(self._stack)
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
            moto_adapter.abort_running_executions(timeout=2.0)
        if self.table_name:  # moto's backends are process-wide: the next run in this process starts empty
            try:
                self.dynamodb.delete_table(TableName=self.table_name)
            except Exception as err:  # closing goes on; only memory is at stake
                log.warning("embedded table not deleted: %s", type(err).__name__)
        self._stack.close()
