"""serverless_worker.stack: template.yaml resolved the way ``sam local invoke`` resolves it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serverless_worker.errors import ConfigurationError
from serverless_worker.stack import (
    ResolvedTemplate,
    function_environment,
    load_env_vars_file,
    parse_parameter_overrides,
)
from support.template import TEMPLATE_PATH

ROOT = TEMPLATE_PATH.parent
REQUIRED = {"BaseUrl": "https://jobs.example.com",
            "ApiKeySecretArn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:sw-key"}


@pytest.fixture
def stack() -> ResolvedTemplate:
    return ResolvedTemplate.load(TEMPLATE_PATH, overrides=REQUIRED, region="us-east-1")


def test_functions_are_the_templates_functions(stack: ResolvedTemplate) -> None:
    assert set(stack.function_ids()) == {"SchedulerFunction", "ExecutorFunction", "StepsFunction",
                                         "DrainFunction"}


def test_function_takes_globals_and_its_own_properties(stack: ResolvedTemplate) -> None:
    scheduler = stack.function("SchedulerFunction")
    executor = stack.function("ExecutorFunction")

    assert scheduler.handler == "scheduler/app.lambda_handler"
    assert (scheduler.module, scheduler.attribute) == ("scheduler.app", "lambda_handler")
    assert scheduler.code_dir == ROOT / "functions"          # Globals CodeUri
    assert scheduler.source == ROOT / "functions" / "scheduler" / "app.py"
    assert scheduler.source.is_file()
    assert scheduler.timeout == 120                           # its own Timeout
    assert scheduler.memory_size == 128                       # !Ref SchedulerMemorySize (default)
    assert stack.function("DrainFunction").memory_size == 256  # Globals MemorySize
    assert executor.timeout == 900                            # !Ref ExecutorTimeoutSeconds (default)
    assert executor.memory_size == 512                        # !Ref ExecutorMemorySize (default)


def test_environment_merges_globals_and_resolves_intrinsics(stack: ResolvedTemplate) -> None:
    scheduler = stack.function("SchedulerFunction").variables
    steps = stack.function("StepsFunction").variables

    # parameters: overrides and defaults
    assert scheduler["SW_BASE_URL"] == REQUIRED["BaseUrl"]
    assert scheduler["SW_PROTOCOL"] == "pipelogiq"
    assert scheduler["SW_BATCH_SIZE"] == "10"
    # !If [HasInstanceId, ...] with InstanceId empty: the stack name, which is "local" in SAM
    assert scheduler["SW_INSTANCE_ID"] == "local"
    # the stack's name is every metric's service dimension and every log line's service
    assert scheduler["POWERTOOLS_SERVICE_NAME"] == "local"
    # !Ref of resources: placeholders; the state machine's Ref and the steps' !Sub agree
    assert scheduler["SW_TABLE_NAME"] == "StateTable"
    # the scheduler fans out to the executor's live alias (AutoPublishAlias), as deployed
    assert scheduler["SW_EXECUTOR_FUNCTION_NAME"] == \
        "arn:aws:lambda:us-east-1:123456789012:function:ExecutorFunction:live"
    machine = "arn:aws:states:us-east-1:123456789012:stateMachine:local-worker"
    assert scheduler["SW_STATE_MACHINE_ARN"] == machine
    assert steps["SW_STATE_MACHINE_ARN"] == scheduler["SW_STATE_MACHINE_ARN"]
    # a function's own variables stay its own
    assert "SW_EXECUTOR_FUNCTION_NAME" not in stack.function("DrainFunction").variables
    assert scheduler["SW_LIVENESS"] == "continuous"           # !Ref Liveness (default), the scheduler's only
    assert "SW_LIVENESS" not in stack.function("ExecutorFunction").variables


def test_overrides_change_parameters_and_conditions() -> None:
    stack = ResolvedTemplate.load(TEMPLATE_PATH, overrides={**REQUIRED, "InstanceId": "blue",
                                                            "ExecutorTimeoutSeconds": "60"})

    assert stack.function("SchedulerFunction").variables["SW_INSTANCE_ID"] == "blue"
    assert stack.function("ExecutorFunction").timeout == 60


def test_the_key_may_come_from_an_ssm_parameter_instead_of_a_secret() -> None:
    stack = ResolvedTemplate.load(TEMPLATE_PATH, overrides={"BaseUrl": "https://jobs.example.com",
                                                            "ApiKeyParameterName": "/sw/api-key"})

    variables = stack.function("SchedulerFunction").variables
    # An empty variable counts as unset (Settings: env_ignore_empty): the parameter is the one source.
    assert (variables["SW_API_KEY_PARAMETER"], variables["SW_API_KEY_SECRET_ARN"]) == ("/sw/api-key", "")


def test_parameter_without_default_or_override_is_blank_as_in_sam() -> None:
    stack = ResolvedTemplate.load(TEMPLATE_PATH)

    assert stack.function("DrainFunction").variables["SW_BASE_URL"] == ""


def test_unknown_parameter_and_function_are_clear_errors(stack: ResolvedTemplate) -> None:
    with pytest.raises(ConfigurationError, match=r"unknown parameter.*BaseURL.*declares: .*BaseUrl"):
        ResolvedTemplate.load(TEMPLATE_PATH, overrides={"BaseURL": "https://x"})
    with pytest.raises(ConfigurationError, match=r"no function 'Scheduler'.*SchedulerFunction"):
        stack.function("Scheduler")
    with pytest.raises(ConfigurationError, match="no function 'StateTable'"):
        stack.function("StateTable")


def test_missing_template_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read"):
        ResolvedTemplate.load(tmp_path / "template.yaml")


INTRINSICS = """
Parameters:
  Stage: {Type: String, Default: dev}
  Names: {Type: String, Default: "a,b,c"}
Conditions:
  IsProd: !Equals [!Ref Stage, prod]
  IsDevOrTest: !Or [!Equals [!Ref Stage, dev], !Equals [!Ref Stage, test]]
  Both: !And [!Condition IsDevOrTest, !Not [!Condition IsProd]]
Resources:
  Queue: {Type: AWS::SQS::Queue}
  Fn:
    Type: AWS::Serverless::Function
    Properties:
      Handler: fn/app.handler
      CodeUri: src/
      Environment:
        Variables:
          SUB: !Sub "${AWS::StackName}-${Stage}-${!Literal}"
          SUB_LIST: !Sub ["${Prefix}/${AWS::Region}", {Prefix: !Ref Stage}]
          JOIN: !Join ["-", [!Ref Stage, x]]
          SELECT: !Select [1, !Split [",", !Ref Names]]
          IF_PROD: !If [IsProd, prod-only, !Ref AWS::NoValue]
          BOTH: !If [Both, "yes", "no"]
          QUEUE_URL: !Ref Queue
          QUEUE_ARN: !GetAtt Queue.Arn
          IMPORTED: !ImportValue shared-thing
          FLAG: true
"""


def test_intrinsics_resolve_like_sam(tmp_path: Path) -> None:
    path = tmp_path / "template.yaml"
    path.write_text(INTRINSICS)

    variables = ResolvedTemplate.load(path, region="eu-west-1").function("Fn").variables

    assert variables["SUB"] == "local-dev-${Literal}"
    assert variables["SUB_LIST"] == "dev/eu-west-1"
    assert variables["JOIN"] == "dev-x"
    assert variables["SELECT"] == "b"
    assert "IF_PROD" not in variables                     # AWS::NoValue drops the variable
    assert variables["BOTH"] == "yes"
    assert variables["QUEUE_URL"] == "https://sqs.eu-west-1.amazonaws.com/123456789012/Queue"
    assert variables["QUEUE_ARN"] == "arn:aws:sqs:eu-west-1:123456789012:Queue"
    assert variables["IMPORTED"] == ""                    # not knowable locally: blank, as SAM does
    assert variables["FLAG"] == "true"


def test_conditions_follow_overrides(tmp_path: Path) -> None:
    path = tmp_path / "template.yaml"
    path.write_text(INTRINSICS)

    variables = ResolvedTemplate.load(path, overrides={"Stage": "prod"}).function("Fn").variables

    assert variables["IF_PROD"] == "prod-only"
    assert variables["BOTH"] == "no"


@pytest.mark.parametrize(("args", "expected"), [
    (["BaseUrl=https://x"], {"BaseUrl": "https://x"}),
    (["A=1 B=2", "C=3"], {"A": "1", "B": "2", "C": "3"}),
    (['ParameterKey=A,ParameterValue="one two"'], {"A": "one two"}),
    (["BaseUrl=https://x/?a=b"], {"BaseUrl": "https://x/?a=b"}),
    (["Empty="], {"Empty": ""}),
])
def test_parameter_overrides_as_sam_spells_them(args: list[str], expected: dict[str, str]) -> None:
    assert parse_parameter_overrides(args) == expected


# An unquoted value with a space splits into a second, malformed pair ("two"), as in sam.
@pytest.mark.parametrize("bad", ["NoEquals", "=value", "'unterminated",
                                 "ParameterKey=A,ParameterValue=one two"])
def test_bad_parameter_overrides_are_clear_errors(bad: str) -> None:
    with pytest.raises(ConfigurationError, match="--parameter-overrides"):
        parse_parameter_overrides([bad])


def test_env_vars_priority_is_function_then_parameters_then_shell_then_template(
        stack: ResolvedTemplate, tmp_path: Path) -> None:
    # given an env-vars file with a global and a function-specific value, and a shell value
    path = tmp_path / "env.json"
    path.write_text(json.dumps({
        "Parameters": {"SW_INSTANCE_ID": "from-parameters", "SW_BATCH_SIZE": 3},
        "SchedulerFunction": {"SW_INSTANCE_ID": "from-function", "SW_API_KEY": "undeclared"},
    }))
    shell = {"SW_BATCH_SIZE": "7", "SW_MAX_IN_FLIGHT": "9", "SW_ALLOW_INSECURE_HTTP": "true"}
    env_vars = load_env_vars_file(path)

    scheduler, ignored = function_environment(stack.function("SchedulerFunction"), env_vars, shell)
    drain, _ = function_environment(stack.function("DrainFunction"), env_vars, shell)

    assert scheduler["SW_INSTANCE_ID"] == "from-function"     # the function's entry wins
    assert drain["SW_INSTANCE_ID"] == "from-parameters"       # Parameters apply to every function
    assert scheduler["SW_BATCH_SIZE"] == "3"                  # the file beats the shell
    assert scheduler["SW_MAX_IN_FLIGHT"] == "9"               # the shell beats the template
    assert scheduler["SW_PROTOCOL"] == "pipelogiq"            # the template, untouched
    assert "SW_ALLOW_INSECURE_HTTP" not in scheduler          # only declared variables
    assert ignored == ["SW_API_KEY"]                          # reported, as sam ignores it


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "not valid JSON"),
    ('{"SchedulerFunction": "x"}', "expected"),
    ("[1, 2]", "expected"),
])
def test_bad_env_vars_files_are_clear_errors(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "env.json"
    path.write_text(content)

    with pytest.raises(ConfigurationError, match=message):
        load_env_vars_file(path)
    with pytest.raises(ConfigurationError, match="cannot read"):
        load_env_vars_file(tmp_path / "missing.json")


def test_each_stack_alarms_on_its_own_metrics_only() -> None:
    """Shards are separate stacks in one account: a custom metric's alarm must select the
    stack's own series (the ``service`` dimension Powertools sets from POWERTOOLS_SERVICE_NAME),
    or one stack's polls would silence another's silent-poller alarm."""
    from support.template import load_template

    template = load_template()
    service = template["Globals"]["Function"]["Environment"]["Variables"]["POWERTOOLS_SERVICE_NAME"]
    assert service == {"Ref": "AWS::StackName"}
    custom = {rid: r["Properties"] for rid, r in template["Resources"].items()
              if r["Type"] == "AWS::CloudWatch::Alarm" and r["Properties"].get("Namespace") == "ServerlessWorker"}
    assert set(custom) == {"LeasesLostAlarm", "StrandedDeliveriesAlarm", "SilentPollerAlarm",
                           "HandlerCannotFitAlarm", "SettleAbandonedAlarm"}
    for props in custom.values():
        assert props["Dimensions"] == [{"Name": "service", "Value": service}]
