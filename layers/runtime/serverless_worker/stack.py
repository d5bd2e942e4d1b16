"""The stack as ``sam local invoke`` sees it: template.yaml with parameters fixed and
intrinsics resolved, for running functions in-process.

The template is decoded by the shared loader (``serverless_worker.local.template``);
this module resolves what a local run can know: ``!Ref`` of a parameter is its
override or default, ``!Ref``/``!GetAtt`` of a resource is a local placeholder (the
logical id as its name, an ARN built from it), pseudo parameters take SAM's local
values (stack ``local``, account ``123456789012``), and ``!Sub``, ``!If`` (conditions
evaluated), ``!Join``, ``!Select`` and ``!Split`` are applied. A function's environment
follows SAM's rules: Globals merged with the function's own variables, then for each
declared variable the ``--env-vars`` file beats the shell, which beats the template;
an unresolvable value becomes ``""``.

Nothing here runs in Lambda.

Example::

    stack = ResolvedTemplate.load("template.yaml", overrides=parse_parameter_overrides(["BaseUrl=https://x"]))
    fn = stack.function("SchedulerFunction")
    fn.variables["SW_TABLE_NAME"]     # 'StateTable'
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigurationError

__all__ = [
    "LOCAL_ACCOUNT_ID",
    "LOCAL_STACK_NAME",
    "FunctionConfig",
    "ResolvedTemplate",
    "function_environment",
    "load_env_vars_file",
    "parse_parameter_overrides",
]

# The values ``sam local`` gives the pseudo parameters.
LOCAL_STACK_NAME = "local"
LOCAL_ACCOUNT_ID = "123456789012"
_DEFAULT_REGION = "us-east-1"
# Lambda's defaults when neither the function nor Globals set them.
_DEFAULT_TIMEOUT = 3
_DEFAULT_MEMORY = 128

_FUNCTION_TYPE = "AWS::Serverless::Function"
_SUB_VARIABLE = re.compile(r"\$\{([^}]*)\}")
_OVERRIDE_PAIR = re.compile(r"^ParameterKey=([^,]+),ParameterValue=(.*)$", re.DOTALL)


class _Unresolved:
    """A value a local run cannot know (a parameter with no default, an import...)."""

    def __repr__(self) -> str:
        return "<unresolved>"


UNRESOLVED: Any = _Unresolved()
_NO_VALUE: Any = object()  # AWS::NoValue: the property disappears


@dataclass(frozen=True)
class FunctionConfig:
    """What a local run needs from one ``AWS::Serverless::Function``."""

    logical_id: str
    handler: str                      # "scheduler/app.lambda_handler"
    code_dir: Path                    # CodeUri, resolved against the template's directory
    timeout: int
    memory_size: int
    function_name: str                # the placeholder name (FunctionName, else the logical id)
    arn: str
    variables: dict[str, str] = field(default_factory=dict)   # template values, stringified as SAM does

    @property
    def module(self) -> str:
        """The handler's module as Lambda imports it (``scheduler/app`` -> ``scheduler.app``)."""
        return self.handler.rpartition(".")[0].replace("/", ".")

    @property
    def attribute(self) -> str:
        return self.handler.rpartition(".")[2]

    @property
    def source(self) -> Path:
        return self.code_dir / (self.module.replace(".", "/") + ".py")


class ResolvedTemplate:
    """A loaded template with parameter values fixed; resolves intrinsics on demand."""

    def __init__(self, document: dict[str, Any], *, path: Path, overrides: Mapping[str, str] | None = None,
                 region: str | None = None) -> None:
        self.document = document
        self.path = path
        self.region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") \
            or _DEFAULT_REGION
        declared = document.get("Parameters") or {}
        unknown = sorted(set(overrides or {}) - set(declared))
        if unknown:
            raise ConfigurationError(
                f"unknown parameter(s) {', '.join(unknown)} in --parameter-overrides; "
                f"{path.name} declares: {', '.join(sorted(declared)) or 'none'}")
        self.parameters: dict[str, Any] = {}
        for name, spec in declared.items():
            if overrides and name in overrides:
                self.parameters[name] = overrides[name]
            elif isinstance(spec, dict) and "Default" in spec:
                self.parameters[name] = spec["Default"]
            else:
                self.parameters[name] = UNRESOLVED
        self._conditions: dict[str, bool] = {}

    # -- loading -----------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path = "template.yaml", *, overrides: Mapping[str, str] | None = None,
             region: str | None = None) -> ResolvedTemplate:
        """Decode ``path``; a missing or malformed file is a ConfigurationError naming it."""
        from .local.template import load_template

        path = Path(path)
        document = load_template(path)
        if not isinstance(document, dict) or not isinstance(document.get("Resources"), dict):
            raise ConfigurationError(f"{path} is not a SAM/CloudFormation template (no Resources)")
        return cls(document, path=path.resolve(), overrides=overrides, region=region)

    @property
    def resources(self) -> dict[str, Any]:
        return dict(self.document.get("Resources") or {})

    @property
    def function_globals(self) -> dict[str, Any]:
        """``Globals.Function``: what every function inherits unless it sets its own."""
        return dict((self.document.get("Globals") or {}).get("Function") or {})

    def function_ids(self) -> list[str]:
        return [name for name, res in self.resources.items()
                if isinstance(res, dict) and res.get("Type") == _FUNCTION_TYPE]

    # -- functions -----------------------------------------------------------------
    def function(self, logical_id: str) -> FunctionConfig:
        """The function's handler, code directory, timeout, memory and environment."""
        resource = self.resources.get(logical_id)
        if not isinstance(resource, dict) or resource.get("Type") != _FUNCTION_TYPE:
            raise ConfigurationError(
                f"{self.path.name} has no function {logical_id!r}; its functions are: "
                f"{', '.join(self.function_ids()) or 'none'}")
        globals_ = self.function_globals
        props = {**globals_, **(resource.get("Properties") or {})}
        handler = self.resolve(props.get("Handler"))
        code_uri = self.resolve(props.get("CodeUri"))
        if not isinstance(handler, str) or "." not in handler:
            raise ConfigurationError(f"{logical_id}: Handler must look like 'dir/module.function'")
        if not isinstance(code_uri, str):
            raise ConfigurationError(f"{logical_id}: CodeUri must be a local directory for a local run")
        variables: dict[str, Any] = {}
        for source in (globals_, resource.get("Properties") or {}):
            declared = ((source.get("Environment") or {}).get("Variables") or {})
            variables.update(declared)
        name = self._name_of(logical_id, resource)
        return FunctionConfig(
            logical_id=logical_id, handler=handler, code_dir=self.path.parent / code_uri,
            timeout=_as_int(self.resolve(props.get("Timeout", _DEFAULT_TIMEOUT)), f"{logical_id} Timeout"),
            memory_size=_as_int(self.resolve(props.get("MemorySize", _DEFAULT_MEMORY)),
                                f"{logical_id} MemorySize"),
            function_name=name, arn=self._arn("lambda", f"function:{name}"),
            variables={key: _stringify(resolved) for key, resolved in
                       ((k, self.resolve(v)) for k, v in variables.items()) if resolved is not _NO_VALUE},
        )

    # -- intrinsics ------------------------------------------------------------------
    def resolve(self, value: Any) -> Any:
        """``value`` with every intrinsic this module knows applied; unknown ones stay UNRESOLVED."""
        if isinstance(value, list):
            items = [self.resolve(v) for v in value]
            return [v for v in items if v is not _NO_VALUE]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            (key, arg), = value.items()
            if key == "Ref":
                return self._ref(arg)
            if key == "Condition" and isinstance(arg, str):
                return self.condition(arg)
            if key.startswith("Fn::"):
                return self._function(key, arg)
        resolved = {k: self.resolve(v) for k, v in value.items()}
        return {k: v for k, v in resolved.items() if v is not _NO_VALUE}

    def condition(self, name: str) -> bool:
        """Evaluate a named condition (memoised)."""
        if name not in self._conditions:
            conditions = self.document.get("Conditions") or {}
            if name not in conditions:
                raise ConfigurationError(f"{self.path.name} has no condition {name!r}")
            self._conditions[name] = self._truth(conditions[name], name)
        return self._conditions[name]

    def _truth(self, value: Any, where: str) -> bool:
        result = self.resolve(value)
        if isinstance(result, bool):
            return result
        if isinstance(result, str) and result.lower() in ("true", "false"):
            return result.lower() == "true"
        raise ConfigurationError(f"condition {where} does not evaluate to true or false locally")

    def _function(self, key: str, arg: Any) -> Any:
        if key == "Fn::Sub":
            return self._sub(arg)
        if key == "Fn::GetAtt":
            parts = arg.split(".", 1) if isinstance(arg, str) else list(arg)
            if len(parts) != 2:
                return UNRESOLVED
            return self._get_att(str(parts[0]), str(self.resolve(parts[1])))
        if key == "Fn::If":
            name, when_true, when_false = arg
            return self.resolve(when_true if self.condition(name) else when_false)
        if key == "Fn::Equals":
            left, right = (self.resolve(v) for v in arg)
            if UNRESOLVED in (left, right):
                return UNRESOLVED
            return _stringify(left) == _stringify(right)
        if key == "Fn::Not":
            return not self._truth(arg[0], "Fn::Not")
        if key == "Fn::And":
            return all(self._truth(v, "Fn::And") for v in arg)
        if key == "Fn::Or":
            return any(self._truth(v, "Fn::Or") for v in arg)
        if key == "Fn::Join":
            delimiter, items = arg[0], self.resolve(arg[1])
            if not isinstance(items, list) or any(v is UNRESOLVED for v in items):
                return UNRESOLVED
            return str(delimiter).join(_stringify(v) for v in items)
        if key == "Fn::Select":
            index, items = self.resolve(arg[0]), self.resolve(arg[1])
            try:
                return items[int(index)]
            except (TypeError, ValueError, IndexError):
                return UNRESOLVED
        if key == "Fn::Split":
            delimiter, text = arg[0], self.resolve(arg[1])
            return text.split(delimiter) if isinstance(text, str) else UNRESOLVED
        return UNRESOLVED  # Fn::ImportValue, Fn::FindInMap, ...: not knowable locally

    def _sub(self, arg: Any) -> Any:
        text, local = (arg, {}) if isinstance(arg, str) else (arg[0], arg[1])
        local = {k: self.resolve(v) for k, v in dict(local).items()}
        missing = False

        def replace(match: re.Match[str]) -> str:
            nonlocal missing
            name = match.group(1)
            if name.startswith("!"):
                return "${" + name[1:] + "}"  # ${!Literal} is the escape for a literal ${Literal}
            if name in local:
                value = local[name]
            elif "." in name and not name.startswith("AWS::"):
                value = self._get_att(*name.split(".", 1))
            else:
                value = self._ref(name)
            if value is UNRESOLVED:
                missing = True
                return ""
            return _stringify(value)

        result = _SUB_VARIABLE.sub(replace, str(text))
        return UNRESOLVED if missing else result

    def _ref(self, name: Any) -> Any:
        if not isinstance(name, str):
            return UNRESOLVED
        if name in self.parameters:
            return self.parameters[name]
        pseudo = {
            "AWS::StackName": LOCAL_STACK_NAME,
            "AWS::AccountId": LOCAL_ACCOUNT_ID,
            "AWS::Region": self.region,
            "AWS::Partition": "aws",
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::StackId": self._arn("cloudformation", f"stack/{LOCAL_STACK_NAME}/local"),
        }
        if name in pseudo:
            return pseudo[name]
        if name == "AWS::NoValue":
            return _NO_VALUE
        if name.endswith(".Alias") and name.count(".") == 1:
            return self._alias_arn(name.removesuffix(".Alias"))
        resource = self.resources.get(name)
        if not isinstance(resource, dict):
            return UNRESOLVED
        kind = resource.get("Type", "")
        resource_name = self._name_of(name, resource)
        # What Ref returns differs by type: an ARN for state machines and layers, a URL for queues.
        if kind in ("AWS::Serverless::StateMachine", "AWS::StepFunctions::StateMachine"):
            return self._arn("states", f"stateMachine:{resource_name}")
        if kind in ("AWS::Serverless::LayerVersion", "AWS::Lambda::LayerVersion"):
            return self._arn("lambda", f"layer:{resource_name}:1")
        if kind == "AWS::SQS::Queue":
            return f"https://sqs.{self.region}.amazonaws.com/{LOCAL_ACCOUNT_ID}/{resource_name}"
        return resource_name

    def _get_att(self, logical_id: str, attribute: str) -> Any:
        resource = self.resources.get(logical_id)
        if not isinstance(resource, dict):
            return UNRESOLVED
        kind = resource.get("Type", "")
        name = self._name_of(logical_id, resource)
        if attribute in ("Name", "QueueName", "FunctionName", "TableName"):
            return name
        if attribute == "Arn":
            service_and_path = {
                _FUNCTION_TYPE: ("lambda", f"function:{name}"),
                "AWS::Lambda::Function": ("lambda", f"function:{name}"),
                "AWS::Serverless::StateMachine": ("states", f"stateMachine:{name}"),
                "AWS::StepFunctions::StateMachine": ("states", f"stateMachine:{name}"),
                "AWS::SQS::Queue": ("sqs", name),
                "AWS::DynamoDB::Table": ("dynamodb", f"table/{name}"),
            }.get(kind)
            if service_and_path is not None:
                return self._arn(*service_and_path)
        return f"{logical_id}.{attribute}"

    def _alias_arn(self, logical_id: str) -> Any:
        """``!Ref Function.Alias``: SAM's AutoPublishAlias, as a qualified function ARN."""
        resource = self.resources.get(logical_id)
        if not isinstance(resource, dict) or resource.get("Type") != _FUNCTION_TYPE:
            return UNRESOLVED
        props = {**self.function_globals, **(resource.get("Properties") or {})}
        alias = self.resolve(props.get("AutoPublishAlias"))
        if not isinstance(alias, str) or not alias:
            return UNRESOLVED
        return self._arn("lambda", f"function:{self._name_of(logical_id, resource)}:{alias}")

    def _name_of(self, logical_id: str, resource: dict[str, Any]) -> str:
        """The physical name a local run uses: the resource's own name property, else its logical id."""
        props = resource.get("Properties") or {}
        for key in ("FunctionName", "Name", "StateMachineName", "TableName", "QueueName", "LayerName"):
            if key in props:
                value = self.resolve(props[key])
                if isinstance(value, str) and value:
                    return value
        return logical_id

    def _arn(self, service: str, resource: str) -> str:
        return f"arn:aws:{service}:{self.region}:{LOCAL_ACCOUNT_ID}:{resource}"


# -- command-line inputs (SAM's spellings) --------------------------------------------
def parse_parameter_overrides(values: Iterable[str]) -> dict[str, str]:
    """``Key=Value`` pairs and ``ParameterKey=K,ParameterValue=V``, as ``sam`` accepts them.

    Each argument may hold several space-separated pairs (``"A=1 B=2"``), quoted as in
    a shell when a value has spaces.
    """
    result: dict[str, str] = {}
    for value in values:
        try:
            tokens = shlex.split(value)
        except ValueError as err:
            raise ConfigurationError(f"--parameter-overrides {value!r}: {err}") from None
        for token in tokens:
            pair = _OVERRIDE_PAIR.match(token)
            if pair:
                key, text = pair.group(1), pair.group(2)
            else:
                key, sep, text = token.partition("=")
                if not sep:
                    raise ConfigurationError(
                        f"--parameter-overrides {token!r}: expected Key=Value or "
                        "ParameterKey=Key,ParameterValue=Value")
            if not key.strip():
                raise ConfigurationError(f"--parameter-overrides {token!r}: empty parameter name")
            result[key.strip()] = text
    return result


def load_env_vars_file(path: str | Path) -> dict[str, dict[str, str]]:
    """An ``--env-vars`` file: ``{"FunctionLogicalId": {"VAR": "value"}, "Parameters": {...}}``."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigurationError(f"cannot read --env-vars {path}: {err.strerror or err}") from err
    except json.JSONDecodeError as err:
        raise ConfigurationError(f"--env-vars {path} is not valid JSON: {err}") from err
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ConfigurationError(
            f"--env-vars {path}: expected {{\"FunctionLogicalId\": {{\"VAR\": \"value\"}}, "
            "\"Parameters\": {\"VAR\": \"value\"}}")
    return {str(k): {str(n): _stringify(v) for n, v in vars_.items()} for k, vars_ in data.items()}


def function_environment(function: FunctionConfig, env_vars: Mapping[str, Mapping[str, str]] | None = None,
                         shell: Mapping[str, str] | None = None) -> tuple[dict[str, str], list[str]]:
    """The declared variables' values by SAM's priority, and the ``--env-vars`` names it ignored.

    Priority, highest first: the file's entry for this function, the file's
    ``Parameters`` (every function), the shell, the template. Like ``sam local invoke``,
    only variables the template declares are set; the rest of the file is ignored.
    """
    shell = os.environ if shell is None else shell
    overrides: dict[str, str] = {}
    if env_vars:
        overrides.update(env_vars.get("Parameters", {}))
        overrides.update(env_vars.get(function.logical_id, {}) or env_vars.get(function.function_name, {}))
    result: dict[str, str] = {}
    for name, value in function.variables.items():
        result[name] = overrides.get(name, shell.get(name, value))
    ignored = sorted(set(overrides) - set(function.variables))
    return result, ignored


# -- helpers ------------------------------------------------------------------------
def _stringify(value: Any) -> str:
    """Lambda's environment holds strings; SAM blanks what it could not resolve."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None or value is UNRESOLVED or value is _NO_VALUE or isinstance(value, dict | list | tuple):
        return ""
    return str(value)


def _as_int(value: Any, what: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"{what} is {value!r}, not a number (set it with --parameter-overrides)") \
            from None
