"""The typed step events and answers (``runtime/step_events.py``) are the ones the state
machine really passes and reads: every Lambda Task of worker.asl.json is held against them.

A Task's ``Parameters`` (or, for ``lambda:invoke``, its ``Payload``) is its step's event:
it passes no field the type lacks and every field the type requires, with the constants
(``step``, ``phase``) the type allows. Whatever a state reads under a Task's
``ResultPath`` is a field of that step's answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import pytest

from serverless_worker.runtime.step_events import STEP_EVENTS, STEP_RESULTS
from serverless_worker.runtime.steps import STEPS

ASL_PATH = Path(__file__).resolve().parents[2] / "functions" / "statemachine" / "worker.asl.json"
STEPS_ARN = "${StepsFunctionArn}"


def _states(machine: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, state in machine["States"].items():
        yield name, state
        for branch in state.get("Branches", []):
            yield from _states(branch)


def _step_tasks() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(state name, the event it passes, the state) for every Task that invokes the steps function."""
    asl = json.loads(ASL_PATH.read_text())
    tasks = []
    for name, state in _states(asl):
        if state.get("Type") != "Task":
            continue
        params = state.get("Parameters", {})
        if state["Resource"] == STEPS_ARN:
            tasks.append((name, params, state))
        elif params.get("FunctionName") == STEPS_ARN:
            tasks.append((name, params["Payload"], state))
    return tasks


TASKS = _step_tasks()


def _fields(event: dict[str, Any]) -> dict[str, Any]:
    """Field name -> the constant passed, or ``...`` for a value taken from a path."""
    return {key.removesuffix(".$"): (... if key.endswith(".$") else value) for key, value in event.items()}


def _allowed(hint: Any) -> tuple[Any, ...] | None:
    """The constants a Literal (possibly optional) allows, or ``None`` for any value."""
    if get_origin(hint) is Literal:
        return get_args(hint)
    if get_origin(hint) is Union:
        literals = [arg for arg in get_args(hint) if get_origin(arg) is Literal]
        return tuple(value for arg in literals for value in get_args(arg)) or None
    return None


def test_every_step_has_a_typed_event_and_answer_and_every_task_names_a_step() -> None:
    assert set(STEP_EVENTS) == set(STEPS) == set(STEP_RESULTS)
    assert {_fields(event)["step"] for _, event, _ in TASKS} == set(STEPS)


@pytest.mark.parametrize(("state", "event"), [(name, event) for name, event, _ in TASKS],
                         ids=[name for name, _, _ in TASKS])
def test_each_task_passes_its_steps_typed_event(state: str, event: dict[str, Any]) -> None:
    fields = _fields(event)
    typed = STEP_EVENTS[fields["step"]]
    hints = get_type_hints(typed)
    assert set(fields) <= set(hints), f"{state} passes fields the event type lacks"
    assert typed.__required_keys__ <= set(fields), f"{state} leaves out fields the event type requires"  # type: ignore[attr-defined]
    for name, value in fields.items():
        allowed = _allowed(hints[name])
        if value is not ...:
            assert allowed is not None and value in allowed, f"{state} passes {name}={value!r}"


def test_every_field_of_an_event_type_is_passed_by_some_task() -> None:
    """No field the steps could read but no Task passes (an optional one is passed by one of its Tasks)."""
    passed: dict[str, set[str]] = {}
    for _, event, _ in TASKS:
        fields = _fields(event)
        passed.setdefault(fields["step"], set()).update(fields)
    for step, typed in STEP_EVENTS.items():
        assert set(get_type_hints(typed)) == passed[step], step


def _reads(asl_text: str, result_path: str) -> set[str]:
    """Fields read under ``result_path`` anywhere in the machine (``$.run.mode`` -> ``mode``)."""
    return set(re.findall(re.escape(result_path) + r"\.([A-Za-z_]+)", asl_text))


@pytest.mark.parametrize(("state", "event", "task"), TASKS, ids=[name for name, _, _ in TASKS])
def test_what_the_machine_reads_of_an_answer_is_in_its_steps_typed_answer(
        state: str, event: dict[str, Any], task: dict[str, Any]) -> None:
    if "waitForTaskToken" in task["Resource"]:
        return  # its result is the callback's output (SendTaskSuccess), not the step's answer
    step = _fields(event)["step"]
    fields = {name for typed in STEP_RESULTS[step] for name in get_type_hints(typed)}
    result_path = task["ResultPath"]
    assert result_path.startswith("$.")
    read = _reads(ASL_PATH.read_text(), result_path)
    assert read <= fields, f"{state}: the machine reads {sorted(read - fields)} of {result_path}"


def _choice_reads(state: dict[str, Any], result_path: str) -> set[str]:
    return {rule["Variable"].removeprefix(result_path + ".") for choice in state["Choices"]
            for rule in [choice, *choice.get("And", [])] if rule.get("Variable", "").startswith(result_path + ".")}


@pytest.mark.parametrize(("state", "event", "task"), TASKS, ids=[name for name, _, _ in TASKS])
def test_the_fields_a_choice_reads_of_an_answer_are_always_there(
        state: str, event: dict[str, Any], task: dict[str, Any]) -> None:
    """A Choice on a missing path fails the execution. The Choice right after a Task reads
    only fields that every answer of its step has; a later Choice (reached on one kind of
    answer: ``Mode?`` once acquire said ``run``) reads fields that one kind always has."""
    if "waitForTaskToken" in task["Resource"]:
        return
    answers = STEP_RESULTS[_fields(event)["step"]]
    in_every = set.intersection(*(set(a.__required_keys__) for a in answers))  # type: ignore[attr-defined]
    in_some = set.union(*(set(a.__required_keys__) for a in answers))  # type: ignore[attr-defined]
    states = dict(_states(json.loads(ASL_PATH.read_text())))
    path = task["ResultPath"]
    following = states[task["Next"]]
    first = _choice_reads(following, path) if following["Type"] == "Choice" else set()
    later = {field for name, other in states.items() if other["Type"] == "Choice" and other is not following
             for field in _choice_reads(other, path)}
    assert first <= in_every, f"{state}: {sorted(first - in_every)} may be absent at {task['Next']}"
    assert later <= in_some, f"{state}: {sorted(later - in_some)} may be absent"
