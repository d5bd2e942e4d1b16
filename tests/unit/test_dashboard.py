"""The CloudWatch dashboard in template.yaml shows only metrics that exist: every custom
metric it (or an alarm) names is one the runtime publishes (runtime/metrics.py's
METRIC_NAMES), with the namespace and dimension the stack gives Powertools, and every AWS
metric names one of the stack's own functions or its queue. The catalogue itself is held
to the code: every ``metrics.add`` in the runtime and every executor action is in it.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest

from serverless_worker.runtime.metrics import DIMENSION, EXECUTOR_ACTIONS, METRIC_NAMES
from support.template import load_template

RUNTIME = Path(__file__).resolve().parents[2] / "layers/runtime/serverless_worker/runtime"
_SUB = re.compile(r"\$\{([^}]+)\}")
# Lambda's own metrics by function name (AWS/Lambda), the ones a dashboard may chart.
LAMBDA_METRICS = {"Invocations", "Errors", "Throttles", "Duration", "ConcurrentExecutions", "AsyncEventAge",
                  "AsyncEventsReceived", "AsyncEventsDropped", "DestinationDeliveryFailures"}


def dashboard_body(template: dict[str, Any]) -> str:
    dashboards = [r for r in template["Resources"].values() if r["Type"] == "AWS::CloudWatch::Dashboard"]
    assert len(dashboards) == 1
    body = dashboards[0]["Properties"]["DashboardBody"]
    assert set(body) == {"Fn::Sub"} and isinstance(body["Fn::Sub"], str)
    return str(body["Fn::Sub"])


def charted(body: str) -> list[tuple[str, str, dict[str, str]]]:
    """(namespace, metric, dimensions) of every metric line, ``${X}`` kept as ``${X}``."""
    decoded = json.loads(_SUB.sub(lambda m: "<" + m.group(1) + ">", body))
    lines = []
    for widget in decoded["widgets"]:
        for line in widget["properties"]["metrics"]:
            fields = [f for f in line if not isinstance(f, dict)]
            assert "." not in fields, f"write metric lines out in full: {line}"
            namespace, name, *pairs = fields
            lines.append((namespace, name, dict(zip(pairs[::2], pairs[1::2], strict=True))))
    return lines


def problems(template: dict[str, Any], body: str) -> list[str]:
    """Every metric line that names something the runtime or the stack does not have."""
    resources = template["Resources"]
    namespace = template["Globals"]["Function"]["Environment"]["Variables"]["POWERTOOLS_METRICS_NAMESPACE"]
    found = []
    for ns, name, dims in charted(body):
        if ns == namespace:
            if name not in METRIC_NAMES:
                found.append(f"{name}: not published by the runtime")
            if dims != {DIMENSION: "<AWS::StackName>"}:
                found.append(f"{name}: dimensions {dims}, the runtime publishes {DIMENSION}=<stack name>")
        elif ns == "AWS/Lambda":
            function = dims.get("FunctionName", "").strip("<>")
            if name not in LAMBDA_METRICS:
                found.append(f"AWS/Lambda {name}: not a Lambda metric")
            if resources.get(function, {}).get("Type") != "AWS::Serverless::Function" or len(dims) != 1:
                found.append(f"AWS/Lambda {name}: {dims} is not one of the stack's functions")
        elif ns == "AWS/SQS":
            queue = dims.get("QueueName", "")
            logical, _, attribute = queue.strip("<>").partition(".")
            if resources.get(logical, {}).get("Type") != "AWS::SQS::Queue" or attribute != "QueueName":
                found.append(f"AWS/SQS {name}: {dims} is not one of the stack's queues")
        else:
            found.append(f"{ns} {name}: namespace neither the runtime's nor the stack's")
    for ref in _SUB.findall(body):
        logical = ref.partition(".")[0]
        if logical not in resources and ref not in ("AWS::Region", "AWS::StackName"):
            found.append(f"${{{ref}}}: not a resource of the stack")
    return found


def test_every_metric_on_the_dashboard_is_one_that_exists() -> None:
    template = load_template()

    assert problems(template, dashboard_body(template)) == []


def test_the_dashboard_shows_what_an_operator_looks_for() -> None:
    lines = charted(dashboard_body(load_template()))
    shown = {(ns, name) for ns, name, _ in lines}

    for needed in [("ServerlessWorker", "Jobs_reported"), ("ServerlessWorker", "Jobs_handed_back"),
                   ("ServerlessWorker", "LeasesLost"), ("ServerlessWorker", "DispatchFailed"),
                   ("ServerlessWorker", "SuccessfulPolls"), ("AWS/Lambda", "AsyncEventAge"),
                   ("ServerlessWorker", "SelfPulled"), ("ServerlessWorker", "PullersStarted"),
                   ("ServerlessWorker", "PullersLate"),
                   ("AWS/Lambda", "Duration"), ("AWS/Lambda", "Throttles"), ("AWS/Lambda", "Errors"),
                   ("AWS/SQS", "ApproximateNumberOfMessagesVisible")]:
        assert needed in shown, needed
    assert ("AWS/Lambda", "Invocations", {"FunctionName": "<SchedulerFunction>"}) in lines  # ticks run


@pytest.mark.parametrize(("line", "expected"), [
    ('["ServerlessWorker", "Jobs_finished", "service", "${AWS::StackName}"]', "Jobs_finished: not published"),
    ('["ServerlessWorker", "LeasesLost", "FunctionName", "${AWS::StackName}"]', "LeasesLost: dimensions"),
    ('["AWS/Lambda", "Errors", "FunctionName", "${NoSuchFunction}"]', "not one of the stack's functions"),
    ('["AWS/SQS", "ApproximateNumberOfMessagesVisible", "QueueName", "${StateTable.Arn}"]', "not one of the stack's"),
])
def test_a_metric_that_does_not_exist_is_found(line: str, expected: str) -> None:
    # given the dashboard with one metric line that names something that does not exist
    template = load_template()
    body = json.dumps({"widgets": [{"type": "metric", "properties": {"metrics": ["LINE"]}}]})
    body = body.replace('"LINE"', line)

    # then the check names it
    found = problems(template, body)
    assert any(expected in problem for problem in found), found


def test_every_alarm_on_a_runtime_metric_names_one_it_publishes() -> None:
    template = load_template()
    alarms = [r["Properties"] for r in template["Resources"].values()
              if r["Type"] == "AWS::CloudWatch::Alarm" and r["Properties"].get("Namespace") == "ServerlessWorker"]

    assert alarms
    for alarm in alarms:
        assert alarm["MetricName"] in METRIC_NAMES, alarm["MetricName"]
        assert [d["Name"] for d in alarm["Dimensions"]] == [DIMENSION]


def test_the_catalogue_holds_every_metric_the_runtime_code_adds() -> None:
    # every metrics.add("Name") / m.add("Name") with a literal name, and Jobs_<action>
    added, prefixed = set(), set()
    for path in RUNTIME.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add" \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id in ("metrics", "m") \
                    and node.args:
                name = node.args[0]
                if isinstance(name, ast.Constant):
                    added.add(name.value)
                elif isinstance(name, ast.JoinedStr):
                    prefixed.add(next(v.value for v in name.values if isinstance(v, ast.Constant)))
    assert added and added <= METRIC_NAMES, added - METRIC_NAMES
    assert prefixed == {"Jobs_"}


def test_the_catalogue_holds_every_action_the_executor_returns() -> None:
    actions = set()
    for name in ("executor.py", "settle.py"):
        for node in ast.walk(ast.parse((RUNTIME / name).read_text())):
            if isinstance(node, ast.Dict):  # {"ledger_key": ..., "action": "superseded"}
                for key, value in zip(node.keys, node.values, strict=True):
                    if isinstance(key, ast.Constant) and key.value == "action" and isinstance(value, ast.Constant):
                        actions.add(value.value)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Settlement" \
                    and node.args and isinstance(node.args[0], ast.Constant):
                actions.add(node.args[0].value)
    assert {"reported", "handed_back", "discarded", "superseded"} <= actions
    assert actions <= set(EXECUTOR_ACTIONS), actions - set(EXECUTOR_ACTIONS)
