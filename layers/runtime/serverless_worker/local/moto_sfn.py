"""Workarounds for moto's Step Functions interpreter (docs/moto-notes.md sections 2 and 3):
definite JSONPaths evaluated as AWS does, and stopping executions whose threads a plain
``stop_execution`` would leave running.
"""

from __future__ import annotations

import datetime
import re
import sys
import time
from contextlib import ExitStack
from typing import Any
from unittest import mock

__all__ = ["abort_running_executions", "patch_definite_jsonpaths"]

_DEFINITE_PATH = re.compile(r"\$(?:\.[A-Za-z_][\w-]*|\[\d+\]|\['[^']*'\])*")


def patch_definite_jsonpaths(stack: ExitStack) -> None:
    """moto 5.2.5 returns ``[v]`` for ``$.a[0].b`` (AWS returns ``v``): evaluate definite paths plainly.

    The patches live as long as ``stack``; they are process-wide while they do.
    """
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
