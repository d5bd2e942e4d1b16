"""Running the stack's code on one machine: ``serverless-worker local``.

The scheduler, executor and state-machine steps are the runtime's own; this package
supplies what AWS supplies in a deployment: the state in a SQLite file (``state_file``,
the same store contract as the stack's table) with recovery of a killed run's
deliveries (``recovery``), moto's Step Functions for the real ASL file when a handler is
long-running (``aws``), a thread-pool dispatcher with Lambda-like contexts, and a
built-in sandbox with demo jobs. It also holds the template loader and the moto helpers
(``EmbeddedAws`` with the stack's DynamoDB table) the AWS test tier and the benchmarks
share.

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
