"""template.yaml's IAM is least privilege and still enough: each function's role grants the
AWS calls its code makes, on the resources it touches, and nothing else.

``make iam-scan`` (checkov, with CKV_SW_1 from scripts/checkov) scans the same template
in CI; these tests tie the permissions to the code: the DynamoDB calls the state store
makes are read from its source, so a new call without a permission (an AccessDenied in
production that moto would never show) fails here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from support.template import load_template

FUNCTIONS = ("SchedulerFunction", "ExecutorFunction", "StepsFunction", "DrainFunction")
STORE = Path(__file__).resolve().parents[2] / "layers/runtime/serverless_worker/state/store.py"
# Actions AWS offers no resource-level permission for: "*" is their only resource.
STAR_ONLY = {"xray:PutTraceSegments", "xray:PutTelemetryRecords", "states:SendTaskHeartbeat",
             "states:SendTaskFailure"}
TABLE = {"Fn::GetAtt": ["StateTable", "Arn"]}
INDEX = {"Fn::Sub": "${StateTable.Arn}/index/in-flight"}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _statements(document: dict[str, Any]) -> list[dict[str, Any]]:
    """A policy's statements, each branch of an ``!If`` included (a grant either way)."""
    found = []
    for statement in _list(document.get("Statement", [])):
        if isinstance(statement, dict) and "Fn::If" in statement:
            found += [s for s in statement["Fn::If"][1:] if isinstance(s, dict) and "Effect" in s]
        else:
            found.append(statement)
    return found


def _grants(template: dict[str, Any], function: str) -> list[tuple[str, Any]]:
    """(action, resource) pairs the function's role allows, managed policies included."""
    resources = template["Resources"]
    role_ref = resources[function]["Properties"]["Role"]
    assert role_ref == {"Fn::GetAtt": [f"{function}Role", "Arn"]}, "each function has its own role"
    role = resources[f"{function}Role"]["Properties"]
    documents = [p["PolicyDocument"] for p in role.get("Policies", [])]
    for arn in role.get("ManagedPolicyArns", []):
        assert isinstance(arn, dict) and "Ref" in arn, f"{function}: only the stack's own managed policies"
        documents.append(resources[arn["Ref"]]["Properties"]["PolicyDocument"])
    pairs = []
    for document in documents:
        for statement in _statements(document):
            assert statement["Effect"] == "Allow" and "NotAction" not in statement
            pairs += [(a, r) for a in _list(statement["Action"]) for r in _list(statement["Resource"])]
    return pairs


def _store_operations() -> set[str]:
    """The DynamoDB operations the state store calls, in IAM spelling (GetItem, Query, ...)."""
    text = STORE.read_text()
    calls = set(re.findall(r'_call\("(?:read|write)", "(\w+)"', text))
    assert {"get_item", "put_item", "update_item"} <= calls, calls
    # `serverless-worker ledger` scans the table with the operator's own credentials
    # (ledger_documents, outside the store's contract); no function calls it.
    operator = text.split("def ledger_documents", 1)[1].split("\n    def ", 1)[0]
    assert set(re.findall(r'_call\("(?:read|write)", "(\w+)"', operator)) == {"scan"}
    assert len(re.findall(r'_call\("(?:read|write)", "scan"', text)) == 1, "a function path scans the table"
    calls.discard("scan")
    return {"dynamodb:" + "".join(part.title() for part in call.split("_")) for call in calls}


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return load_template()


def test_the_functions_together_get_exactly_the_store_operations(template: dict[str, Any]) -> None:
    granted = {action for fn in FUNCTIONS for action, _ in _grants(template, fn)
               if action.startswith("dynamodb:")}
    assert granted == _store_operations()


@pytest.mark.parametrize("function", FUNCTIONS)
def test_each_function_reaches_only_its_own_resources(function: str, template: dict[str, Any]) -> None:
    grants = _grants(template, function)
    by_action: dict[str, list[Any]] = {}
    for action, resource in grants:
        by_action.setdefault(action, []).append(resource)
    for action in ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem"):
        assert by_action.pop(action) == [TABLE]
    assert by_action.pop("secretsmanager:GetSecretValue") == [{"Ref": "ApiKeySecretArn"}]
    assert by_action.pop("ssm:GetParameter") == [{"Fn::Sub": "arn:${AWS::Partition}:ssm:${AWS::Region}:"
                                                            "${AWS::AccountId}:parameter${ApiKeyParameterName}"}]
    log_group = template["Resources"][function]["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]
    for action in ("logs:CreateLogStream", "logs:PutLogEvents"):
        assert by_action.pop(action) == [{"Fn::GetAtt": [log_group, "Arn"]}]
    for action in ("xray:PutTraceSegments", "xray:PutTelemetryRecords"):
        assert by_action.pop(action) == ["*"]
    # What only some functions do: counting and listing in-flight deliveries (scheduler,
    # drain; the executor counts only), fan-out (scheduler), continue-as-new and task tokens
    # (steps), the DLQ (executor).
    expected: dict[str, dict[str, list[Any]]] = {
        "SchedulerFunction": {
            "dynamodb:Query": [INDEX], "dynamodb:BatchGetItem": [TABLE],
            "lambda:InvokeFunction": [{"Fn::Sub": "${ExecutorFunction.Arn}:live"}],  # the live alias only
            "states:StartExecution": [{"Ref": "WorkerStateMachine"}],
        },
        "DrainFunction": {"dynamodb:Query": [INDEX], "dynamodb:BatchGetItem": [TABLE]},
        # counting in flight before pulling for itself (SelfPull): the index only, no fan-out
        "ExecutorFunction": {"sqs:SendMessage": [{"Fn::GetAtt": ["DeadLetterQueue", "Arn"]}],
                             "dynamodb:Query": [INDEX]},
        "StepsFunction": {
            "states:StartExecution": [{"Fn::Sub": "arn:${AWS::Partition}:states:${AWS::Region}:"
                                                  "${AWS::AccountId}:stateMachine:${AWS::StackName}-worker"}],
            "states:SendTaskHeartbeat": ["*"], "states:SendTaskFailure": ["*"],
        },
    }
    assert by_action == expected[function]


def test_the_executor_dead_letter_queue_is_the_one_it_may_write(template: dict[str, Any]) -> None:
    config = template["Resources"]["ExecutorFunction"]["Properties"]["EventInvokeConfig"]
    destination = config["DestinationConfig"]["OnFailure"]["Destination"]
    assert destination == {"Fn::GetAtt": ["DeadLetterQueue", "Arn"]}


def test_no_wildcard_action_and_star_only_where_aws_requires_it(template: dict[str, Any]) -> None:
    statements = []
    for name, resource in template["Resources"].items():
        props = resource.get("Properties", {})
        if resource["Type"] == "AWS::Serverless::Function":
            assert "Policies" not in props, f"{name}: SAM policies would add a role with AWS managed policies"
        policies = props.get("Policies", [])
        documents = [props.get("PolicyDocument")] + [p.get("PolicyDocument", p) for p in _list(policies)]
        statements += [(name, s) for d in documents if isinstance(d, dict) for s in _statements(d)]
    assert len(statements) > 10
    for name, statement in statements:
        actions = _list(statement["Action"])
        assert not any("*" in action for action in actions), (name, actions)
        if "*" in _list(statement["Resource"]):
            assert set(actions) <= STAR_ONLY, (name, actions)


def test_the_key_is_readable_only_from_the_source_the_stack_was_given(template: dict[str, Any]) -> None:
    """ApiKeySecretArn or ApiKeyParameterName: each grant exists only with its parameter set,
    and the template's rules refuse neither or both."""
    document = template["Resources"]["WorkerCommonPolicy"]["Properties"]["PolicyDocument"]
    conditional = {s["Fn::If"][0]: s["Fn::If"] for s in document["Statement"] if "Fn::If" in s}
    assert conditional["HasApiKeySecret"][1]["Action"] == "secretsmanager:GetSecretValue"
    assert conditional["HasApiKeyParameter"][1]["Action"] == "ssm:GetParameter"
    assert all(branches[2] == {"Ref": "AWS::NoValue"} for branches in conditional.values())
    conditions = template["Conditions"]
    assert conditions["HasApiKeySecret"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": "ApiKeySecretArn"}, ""]}]}
    assert conditions["HasApiKeyParameter"] == {"Fn::Not": [{"Fn::Equals": [{"Ref": "ApiKeyParameterName"}, ""]}]}
    assertions = template["Rules"]["OneApiKeySource"]["Assertions"]
    assert [a["AssertDescription"].split()[0:2] for a in assertions] == [["Set", "ApiKeySecretArn"], ["Set", "only"]]


INIT_TEMPLATE = Path(__file__).resolve().parents[2] / "layers/runtime/serverless_worker/cli/project/template.yaml"


@pytest.mark.parametrize("function", ("SchedulerFunction", "ExecutorFunction", "DrainFunction"))
def test_an_init_project_grants_each_function_the_same_dynamodb_calls(function: str,
                                                                      template: dict[str, Any]) -> None:
    """``serverless-worker init``'s own template runs the same runtime: a call its roles lack
    (an executor that keeps pulling counts in flight with a Query) is an AccessDenied in
    AWS that LocalStack, which does not enforce IAM, would never show."""
    project = load_template(INIT_TEMPLATE)
    ours = {(a, str(r)) for a, r in _grants(template, function) if a.startswith("dynamodb:")}
    theirs = {(a, str(r)) for a, r in _grants(project, function) if a.startswith("dynamodb:")}
    assert theirs == ours


def test_an_init_project_keeps_pulling_as_the_stack_does(template: dict[str, Any]) -> None:
    project = load_template(INIT_TEMPLATE)
    assert project["Parameters"]["SelfPull"] == template["Parameters"]["SelfPull"] | {
        "Description": project["Parameters"]["SelfPull"]["Description"]}
    variables = project["Globals"]["Function"]["Environment"]["Variables"]
    assert variables["SW_SELF_PULL"] == {"Ref": "SelfPull"}
