"""``scripts/iam_proof.py`` without LocalStack or Node: how a recorded call becomes an IAM
request (its action and resource ARN), how the built template's roles resolve with a
stack's physical names, and how grants are listed. The evaluation itself is
``@cloud-copilot/iam-simulate``'s (run by ``make iam-proof`` after the deployed tier)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("iam_proof", ROOT / "scripts" / "iam_proof.py")
assert _spec is not None and _spec.loader is not None
iam_proof = importlib.util.module_from_spec(_spec)
sys.modules["iam_proof"] = iam_proof
_spec.loader.exec_module(iam_proof)

R, A = "us-east-1", "000000000000"


@pytest.mark.parametrize(("call", "action", "resources"), [
    ({"service": "dynamodb", "operation": "GetItem", "params": {"TableName": "T"}},
     "dynamodb:GetItem", [f"arn:aws:dynamodb:{R}:{A}:table/T"]),
    ({"service": "dynamodb", "operation": "Query", "params": {"TableName": "T", "IndexName": "in-flight"}},
     "dynamodb:Query", [f"arn:aws:dynamodb:{R}:{A}:table/T/index/in-flight"]),
    ({"service": "dynamodb", "operation": "BatchGetItem", "params": {"RequestItems": ["T", "U"]}},
     "dynamodb:BatchGetItem", [f"arn:aws:dynamodb:{R}:{A}:table/T", f"arn:aws:dynamodb:{R}:{A}:table/U"]),
    ({"service": "lambda", "operation": "Invoke", "params": {"FunctionName": "fn:live"}},
     "lambda:InvokeFunction", [f"arn:aws:lambda:{R}:{A}:function:fn:live"]),
    ({"service": "lambda", "operation": "Invoke", "params": {"FunctionName": "fn", "Qualifier": "live"}},
     "lambda:InvokeFunction", [f"arn:aws:lambda:{R}:{A}:function:fn:live"]),
    ({"service": "states", "operation": "SendTaskHeartbeat", "params": {}}, "states:SendTaskHeartbeat", ["*"]),
    ({"service": "ssm", "operation": "GetParameter", "params": {"Name": "/a/b"}},
     "ssm:GetParameter", [f"arn:aws:ssm:{R}:{A}:parameter/a/b"]),
    ({"service": "sqs", "operation": "SendMessage", "params": {"QueueUrl": "http://q.local/000000000000/dlq"}},
     "sqs:SendMessage", [f"arn:aws:sqs:{R}:{A}:dlq"]),
])
def test_a_recorded_call_becomes_its_iam_action_and_resource(call: dict[str, Any], action: str,
                                                             resources: list[str]) -> None:
    assert iam_proof.action_of(call) == action
    assert iam_proof.resources_of(call, R, A) == resources


def test_a_call_of_a_service_without_a_resource_rule_is_refused_not_guessed() -> None:
    with pytest.raises(ValueError, match="no resource ARN rule for s3:GetObject"):
        iam_proof.resources_of({"service": "s3", "operation": "GetObject", "params": {}}, R, A)


def _stack(parameters: dict[str, str]) -> Any:
    template = {
        "Parameters": {"Secret": {"Default": ""}},
        "Conditions": {"HasSecret": {"Fn::Not": [{"Fn::Equals": [{"Ref": "Secret"}, ""]}]}},
        "Resources": {
            "Table": {"Type": "AWS::DynamoDB::Table"},
            "Fn": {"Type": "AWS::Lambda::Function", "Properties": {"Role": {"Fn::GetAtt": ["Role", "Arn"]}}},
            "Role": {"Type": "AWS::IAM::Role", "Properties": {
                "ManagedPolicyArns": [{"Ref": "Common"}],
                "Policies": [{"PolicyName": "own", "PolicyDocument": {"Statement": [
                    {"Sid": "Index", "Effect": "Allow", "Action": "dynamodb:Query",
                     "Resource": {"Fn::Sub": "${Table.Arn}/index/in-flight"}}]}}]}},
            "Common": {"Type": "AWS::IAM::ManagedPolicy", "Properties": {"PolicyDocument": {"Statement": [
                {"Sid": "Items", "Effect": "Allow", "Action": ["dynamodb:GetItem", "dynamodb:PutItem"],
                 "Resource": {"Fn::GetAtt": ["Table", "Arn"]}},
                {"Fn::If": ["HasSecret", {"Sid": "Key", "Effect": "Allow", "Action": "secretsmanager:GetSecretValue",
                                          "Resource": {"Ref": "Secret"}}, {"Ref": "AWS::NoValue"}]}]}}},
        }}
    physical = {"Table": ("st-Table-1", "AWS::DynamoDB::Table"), "Role": ("st-Role-1", "AWS::IAM::Role"),
                "Fn": ("st-Fn-1", "AWS::Lambda::Function"), "Common": ("arn:aws:iam::0:policy/c", "x")}
    return iam_proof.Stack(name="st", region=R, account=A, parameters=parameters, template=template,
                           physical=physical)


def test_a_function_s_role_resolves_with_the_stack_s_physical_names_and_conditions() -> None:
    role = iam_proof.function_role(_stack({}), "Fn")
    assert role.arn == f"arn:aws:iam::{A}:role/st-Role-1"
    grants = iam_proof.grants_of("Fn", role)
    assert [(g.sid, g.action, g.resource) for g in grants] == [
        ("Index", "dynamodb:Query", f"arn:aws:dynamodb:{R}:{A}:table/st-Table-1/index/in-flight"),
        ("Items", "dynamodb:GetItem", f"arn:aws:dynamodb:{R}:{A}:table/st-Table-1"),
        ("Items", "dynamodb:PutItem", f"arn:aws:dynamodb:{R}:{A}:table/st-Table-1"),
    ]  # the secret's statement is AWS::NoValue without a secret


def test_a_condition_that_holds_brings_its_statement_in() -> None:
    role = iam_proof.function_role(_stack({"Secret": "arn:aws:secretsmanager:x"}), "Fn")
    assert ("Key", "secretsmanager:GetSecretValue", "arn:aws:secretsmanager:x") in \
        [(g.sid, g.action, g.resource) for g in iam_proof.grants_of("Fn", role)]


def test_a_grant_no_code_calls_is_kept_only_with_a_named_reason() -> None:
    logs = iam_proof.Grant("StepsFunction", "p", "Logs", "logs:PutLogEvents", "*")
    assert iam_proof.kept_reason(logs) is not None
    assert iam_proof.kept_reason(iam_proof.Grant("StepsFunction", "p", "Items", "dynamodb:Scan", "*")) is None
