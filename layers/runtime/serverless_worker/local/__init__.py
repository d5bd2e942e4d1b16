"""Running the stack's code on one machine: ``serverless-worker local``.

The scheduler, executor and state-machine steps are the runtime's own; this package
supplies what AWS supplies in a deployment, embedded in the process: moto's DynamoDB
(the table from template.yaml) and Step Functions (the real ASL file), a thread-pool
dispatcher with Lambda-like contexts, and a built-in sandbox with demo jobs. It also
holds the template loader and the moto helpers the AWS test tier shares.

Needs the ``local`` extra (moto, rich, the sandboxes' server); nothing in the Lambda
layer imports it. Public names load on first use, so importing the package is cheap.

Example::

    from serverless_worker.local import LocalRunner
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "EmbeddedAws",
    "LocalDispatcher",
    "LocalRunner",
    "RunObserver",
    "create_state_table",
    "find_project_root",
    "load_template",
    "resource",
    "state_machine_definition",
]

_HOME = {
    "EmbeddedAws": "aws",
    "LocalDispatcher": "dispatcher",
    "LocalRunner": "worker",
    "RunObserver": "observe",
    "create_state_table": "table",
    "find_project_root": "project",
    "load_template": "template",
    "resource": "template",
    "state_machine_definition": "template",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
