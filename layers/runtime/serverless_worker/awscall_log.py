"""Test-only: one structured log line per AWS API call, for the IAM proof (docs/operating.md).

With ``SW_RECORD_AWS_CALLS=true`` (the stack's ``RecordAwsCalls`` parameter, which only the
deployed tier sets) the shared botocore session gets one event hook, installed before any
client is built, that prints a JSON line per call before it is sent::

    {"aws_call": {"service": "dynamodb", "operation": "GetItem", "params": {"TableName": "..."}}}

``make iam-proof`` reads these lines from each function's log group and evaluates every
call against that function's role. Only what names the resource and the few values IAM
conditions read are kept (a table, an index, a function and its qualifier, a state
machine, a secret's or parameter's name, a queue, ``ReturnValues``, ``Select``): never a
key, an item, a payload, a task token or a secret value. Without the variable nothing here
is imported: production runs no hook.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any

__all__ = ["ENABLED_BY", "enabled", "install"]

ENABLED_BY = "SW_RECORD_AWS_CALLS"

# Request parameters that name the resource a call acts on, or that an IAM condition key
# reads (dynamodb:ReturnValues, dynamodb:Select); nothing else of a request is logged.
_KEPT = ("TableName", "IndexName", "FunctionName", "Qualifier", "InvocationType", "stateMachineArn", "SecretId",
         "Name", "QueueUrl", "ReturnValues", "Select")


_WRITE = threading.Lock()  # one whole line at a time: the scheduler's dispatch threads call at once


def enabled() -> bool:
    return os.environ.get(ENABLED_BY, "").lower() == "true"


def install(botocore_session: Any) -> None:
    """Hook every call of clients built on ``botocore_session`` from now on."""
    botocore_session.register("before-parameter-build", _record, unique_id="serverless-worker-awscall-log")


def _record(params: dict[str, Any], model: Any, **_: Any) -> None:
    kept: dict[str, Any] = {name: params[name] for name in _KEPT if isinstance(params.get(name), str)}
    items = params.get("RequestItems")
    if isinstance(items, dict):  # BatchGetItem / BatchWriteItem: the tables, not their keys
        kept["RequestItems"] = sorted(str(table) for table in items)
    service = model.service_model
    line = {"aws_call": {"service": service.signing_name or service.endpoint_prefix,
                         "operation": model.name, "params": kept}}
    text = json.dumps(line, separators=(",", ":"), sort_keys=True) + "\n"
    with _WRITE:
        sys.stdout.write(text)
        sys.stdout.flush()
