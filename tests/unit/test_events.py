"""The sample events in events/ stay true to what really invokes each function.

``events/<handler dir>[-<variant>].json`` feeds the function whose Handler lives in that
directory (``steps-acquire.json`` -> ``steps/app.lambda_handler`` -> StepsFunction);
``make sam-local-invoke`` and ``serverless-worker invoke`` use the same rule. The state
machine's step events must have exactly the keys (and constant values) the ASL's Task
Parameters pass, so a changed state machine cannot leave a stale sample behind.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from serverless_worker.runtime.steps import STEPS
from serverless_worker.state.keys import parse_ledger_key
from support.template import TEMPLATE_PATH, load_template

ROOT = TEMPLATE_PATH.parent
EVENTS = ROOT / "events"
STEPS_ARN = "${StepsFunctionArn}"
LAMBDA_INVOKE = "arn:aws:states:::lambda:invoke"


def _functions() -> dict[str, str]:
    """Logical id -> the directory its handler lives in."""
    resources = load_template()["Resources"]
    return {name: res["Properties"]["Handler"].split("/", 1)[0] for name, res in resources.items()
            if res["Type"] == "AWS::Serverless::Function"}


def _event_files() -> list[Path]:
    return sorted(EVENTS.glob("*.json"))


def _function_for(path: Path) -> str | None:
    prefix = path.stem.split("-", 1)[0]
    return next((name for name, directory in _functions().items() if directory == prefix), None)


def _load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _definition() -> dict[str, Any]:
    machine = load_template()["Resources"]["WorkerStateMachine"]["Properties"]
    return json.loads((ROOT / machine["DefinitionUri"]).read_text(encoding="utf-8"))


def _step_tasks(states: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(state name, the payload the steps function receives) for every Task calling it."""
    for name, state in states.items():
        if state.get("Type") == "Parallel":
            for branch in state["Branches"]:
                yield from _step_tasks(branch["States"])
        if state.get("Type") == "Map":
            processor = state.get("ItemProcessor") or state.get("Iterator")
            yield from _step_tasks(processor["States"])
        if state.get("Type") != "Task":
            continue
        if state["Resource"] == STEPS_ARN:
            yield name, state["Parameters"]
        elif state["Resource"].startswith(LAMBDA_INVOKE) and \
                state["Parameters"].get("FunctionName") == STEPS_ARN:
            yield name, state["Parameters"]["Payload"]


def _shape(parameters: dict[str, Any]) -> tuple[set[str], dict[str, Any]]:
    """The event keys a Task's Parameters produce, and the constants among them."""
    keys = {key.removesuffix(".$") for key in parameters}
    constants = {key: value for key, value in parameters.items() if not key.endswith(".$")}
    return keys, constants


def _matches(event: dict[str, Any], parameters: dict[str, Any]) -> bool:
    keys, constants = _shape(parameters)
    return set(event) == keys and all(event.get(key) == value for key, value in constants.items())


STEP_SAMPLES = [path for path in _event_files() if path.stem.startswith("steps-")]
TASKS = list(_step_tasks(_definition()["States"]))


def test_every_function_has_a_sample_event_and_every_event_a_function() -> None:
    # given the functions of template.yaml and the files in events/
    functions = _functions()
    files = _event_files()

    # then each function has at least one event, and no event file is orphaned
    covered = {_function_for(path) for path in files}
    assert set(functions) <= covered, f"functions without a sample event: {set(functions) - covered}"
    orphans = [path.name for path in files if _function_for(path) is None]
    assert not orphans, f"events/ files matching no function's handler directory: {orphans}"


@pytest.mark.parametrize("path", _event_files(), ids=lambda p: p.name)
def test_every_event_is_a_json_object(path: Path) -> None:
    assert isinstance(_load(path), dict)


@pytest.mark.parametrize(("state", "parameters"), TASKS, ids=[name for name, _ in TASKS])
def test_every_asl_task_has_a_sample_event_of_its_shape(state: str, parameters: dict[str, Any]) -> None:
    # given a Task of the state machine that invokes the steps function
    step = parameters["step"]
    samples = [path for path in STEP_SAMPLES if _load(path).get("step") == step]

    # then a sample event of that step has exactly its keys and constants
    assert samples, f"{state}: no events/steps-{step}*.json"
    assert any(_matches(_load(path), parameters) for path in samples), (
        f"{state} passes keys {sorted(_shape(parameters)[0])} with constants {_shape(parameters)[1]}; "
        f"samples have {[sorted(_load(p)) for p in samples]}")


@pytest.mark.parametrize("path", STEP_SAMPLES, ids=lambda p: p.name)
def test_every_step_sample_is_a_shape_the_asl_passes(path: Path) -> None:
    event = _load(path)

    assert path.stem == f"steps-{event['step']}" or path.stem.startswith(f"steps-{event['step']}-"), \
        f"{path.name} holds step {event['step']!r}"
    assert event["step"] in STEPS
    assert any(_matches(event, parameters) for _, parameters in TASKS), \
        f"{path.name} matches no Task of the state machine (stale sample?)"


def test_steps_named_in_the_brief_all_have_samples() -> None:
    named = {path.stem.removeprefix("steps-") for path in STEP_SAMPLES}

    # one file per runtime step, with exactly the step's name
    assert set(STEPS) <= named, f"steps without events/steps-<step>.json: {set(STEPS) - named}"


KEYED = [path for path in _event_files() if "ledger_key" in _load(path)]


@pytest.mark.parametrize("path", KEYED, ids=lambda p: p.name)
def test_ledger_keys_in_samples_are_real_ledger_keys(path: Path) -> None:
    protocol, ledger_id = parse_ledger_key(_load(path)["ledger_key"])

    assert protocol in ("pipelogiq", "priostack", "claimqueue")
    assert ledger_id


def test_scheduler_sample_is_what_its_schedule_sends() -> None:
    # given the scheduler's event source in the template
    events = load_template()["Resources"]["SchedulerFunction"]["Properties"]["Events"]
    assert any(source["Type"] == "Schedule" for source in events.values())

    # then the sample is an EventBridge scheduled event
    event = _load(EVENTS / "scheduler.json")
    assert event["source"] == "aws.events"
    assert event["detail-type"] == "Scheduled Event"
    assert event["detail"] == {}


def test_executor_sample_is_what_the_dispatcher_sends() -> None:
    from serverless_worker.runtime.dispatch import executor_event

    event = _load(EVENTS / "executor.json")

    assert event == executor_event(event["ledger_key"])


def test_drain_samples_drain_and_resume() -> None:
    drain = _load(EVENTS / "drain.json")
    resume = _load(EVENTS / "drain-resume.json")

    assert set(drain) == {"grace_seconds"} and drain["grace_seconds"] > 0
    assert resume == {"resume": True}
