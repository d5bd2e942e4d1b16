"""One owner per retry (docs/retries.md), held against the state machine: no ``Retry``
retries what the client or botocore retried inside the step, and the table names every
task and error. (What the client retries: tests/protocol/test_retry_owner_client.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from serverless_worker.protocols.http_client import DEFAULT_RETRY
from serverless_worker.runtime.retry_owners import RETRIED_INSIDE_NAMES

ROOT = Path(__file__).resolve().parents[2]
ASL = json.loads((ROOT / "functions" / "statemachine" / "worker.asl.json").read_text(encoding="utf-8"))
TABLE = (ROOT / "docs" / "retries.md").read_text(encoding="utf-8")
# Names that match every error a Lambda function raises.
WILDCARDS = {"States.ALL", "States.TaskFailed"}


def _tasks(machine: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every Task state, those inside Parallel branches included."""
    found: dict[str, dict[str, Any]] = {}
    for name, state in machine["States"].items():
        if state["Type"] == "Task":
            found[name] = state
        for branch in state.get("Branches", []):
            found.update(_tasks(branch))
    return found


def _retrier_for(state: dict[str, Any], error: str) -> dict[str, Any] | None:
    """The retrier Step Functions applies to ``error``: the first whose ErrorEquals matches."""
    for retrier in state.get("Retry", []):
        if error in retrier["ErrorEquals"] or WILDCARDS & set(retrier["ErrorEquals"]):
            return retrier
    return None


def test_no_state_machine_retry_repeats_what_a_layer_inside_the_step_retried() -> None:
    assert {"ServerUnavailableError", "RateLimitedError", "StateStoreError", "DispatchError"} <= RETRIED_INSIDE_NAMES
    tasks = _tasks(ASL)
    assert {"Report", "Ack", "GiveBack", "HandBack", "Acquire", "Renew"} <= set(tasks)
    stacked = []
    for name, state in tasks.items():
        for error in sorted(RETRIED_INSIDE_NAMES):
            retrier = _retrier_for(state, error)
            if retrier is not None and retrier.get("MaxAttempts", 3) != 0:
                stacked.append(f"{name} retries {error} (by {retrier['ErrorEquals']})")
    assert stacked == []


def test_the_give_back_steps_still_retry_a_failed_invocation() -> None:
    """What only the state machine sees, a Lambda invocation that failed or crashed, is still
    retried by the last-resort steps: the rule above takes out only the stacked errors."""
    tasks = _tasks(ASL)
    for name in ("GiveBack", "HandBack"):
        for error in ("Lambda.ServiceException", "Lambda.Unknown", "Sandbox.Timedout"):
            retrier = _retrier_for(tasks[name], error)
            assert retrier is not None and retrier["MaxAttempts"] > 0, (name, error)


def test_the_table_names_every_task_and_every_error_retried_inside() -> None:
    for name in _tasks(ASL):
        assert f"`{name}`" in TABLE, f"docs/retries.md does not say who retries the {name} task"
    for error in RETRIED_INSIDE_NAMES:
        assert f"`{error}`" in TABLE, f"docs/retries.md does not name {error}"
    assert f"{DEFAULT_RETRY.attempts} attempts within {DEFAULT_RETRY.timeout:g} s" in TABLE

