"""Every alarm notifies someone once asked to: the ``AlarmTopicArn`` parameter (an SNS topic,
empty by default) is each alarm's ``AlarmActions`` and ``OKActions`` through the
``HasAlarmTopic`` condition, in template.yaml and in the template ``serverless-worker init``
writes, which also has the drain function and the dashboard.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from support.template import TEMPLATE_PATH, load_template

INIT_TEMPLATE = (Path(__file__).resolve().parents[2]
                 / "layers/runtime/serverless_worker/cli/project/template.yaml")
WIRED = {"Fn::If": ["HasAlarmTopic", [{"Ref": "AlarmTopicArn"}], {"Ref": "AWS::NoValue"}]}


@pytest.fixture(params=[TEMPLATE_PATH, INIT_TEMPLATE], ids=["template.yaml", "init"])
def template(request: pytest.FixtureRequest) -> dict[str, Any]:
    return load_template(request.param)


def test_every_alarm_notifies_the_topic_when_one_is_given(template: dict[str, Any]) -> None:
    alarms = {name: r["Properties"] for name, r in template["Resources"].items()
              if r["Type"] == "AWS::CloudWatch::Alarm"}

    assert len(alarms) >= 7
    unwired = [name for name, props in alarms.items()
               if props.get("AlarmActions") != WIRED or props.get("OKActions") != WIRED]
    assert not unwired


def test_the_topic_is_optional_and_must_be_an_sns_arn(template: dict[str, Any]) -> None:
    parameter = template["Parameters"]["AlarmTopicArn"]
    condition = template["Conditions"]["HasAlarmTopic"]

    assert parameter["Default"] == ""
    assert condition == {"Fn::Not": [{"Fn::Equals": [{"Ref": "AlarmTopicArn"}, ""]}]}
    pattern = re.compile(parameter["AllowedPattern"])
    assert pattern.fullmatch("") and pattern.fullmatch("arn:aws:sns:eu-west-1:111122223333:worker-alarms")
    assert not pattern.fullmatch("ops@example.com") and not pattern.fullmatch("arn:aws:sqs:eu-west-1:111122223333:q")


def test_the_init_stack_has_the_drain_function_and_the_dashboard() -> None:
    resources = load_template(INIT_TEMPLATE)["Resources"]

    drain = resources["DrainFunction"]["Properties"]
    assert drain["Handler"] == "app.drain" and drain["ReservedConcurrentExecutions"] == 1
    assert [r["Type"] for r in resources.values()].count("AWS::CloudWatch::Dashboard") == 1
    app = (INIT_TEMPLATE.parent / "functions" / "app.py.tmpl").read_text()
    assert "def drain(event, context):" in app
