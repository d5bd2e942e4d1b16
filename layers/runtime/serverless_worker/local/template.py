"""Read ``template.yaml`` the way CloudFormation does, so local runs and tests use the
stack's own definitions (the state table, the state machine, the functions' settings)
instead of hand copies that drift.

The short intrinsic tags (``!Ref X``, ``!Sub ...``, ``!GetAtt A.B``, ``!If [...]``) are
decoded to their long forms (``{"Ref": "X"}``, ``{"Fn::Sub": ...}``,
``{"Fn::GetAtt": ["A", "B"]}``, ``{"Fn::If": [...]}``), as cfn-lint and CloudFormation
read them. PyYAML comes with the ``local`` extra (through moto).

Example::

    table = resource("StateTable")["Properties"]
    definition = state_machine_definition("WorkerStateMachine", {"StepsFunctionArn": arn})
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigurationError
from .project import TEMPLATE_NAME, find_project_root

__all__ = [
    "EnvironmentSource",
    "environment_sources",
    "function_timeout",
    "load_template",
    "param_default",
    "resource",
    "state_machine_definition",
    "template_path",
]


# libyaml's parser where PyYAML was built with it: the template loads in a tenth of the time.
_SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _CfnLoader(_SafeLoader):  # type: ignore[valid-type,misc]
    """SafeLoader plus CloudFormation's tags; timestamps stay strings, as CloudFormation keeps them."""


def _intrinsic(loader: _CfnLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
    name = suffix.lstrip("!")
    key = name if name in ("Ref", "Condition") else f"Fn::{name}"
    value: Any
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
        if name == "GetAtt":  # !GetAtt Resource.Attribute.Path -> [Resource, Attribute.Path]
            value = str(value).split(".", 1)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
    return {key: value}


def _string_timestamp(loader: _CfnLoader, node: yaml.Node) -> str:
    return str(loader.construct_scalar(node))  # type: ignore[arg-type]


_CfnLoader.add_multi_constructor("!", _intrinsic)
_CfnLoader.add_constructor("tag:yaml.org,2002:timestamp", _string_timestamp)


def template_path(path: Path | None = None) -> Path:
    """``path``, or the project's ``template.yaml``."""
    return path if path is not None else find_project_root() / TEMPLATE_NAME


@cache
def _load(path: Path, mtime_ns: int) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigurationError(f"cannot read {path}: {err.strerror or err}") from err
    try:
        data = yaml.load(text, Loader=_CfnLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.YAMLError as err:
        raise ConfigurationError(f"{path} is not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ConfigurationError(f"{path} is not a CloudFormation template (no top-level mapping)")
    return data


def load_template(path: Path | None = None) -> dict[str, Any]:
    """The decoded template; cached per file version, and a fresh copy for each caller to mutate."""
    resolved = template_path(path).resolve()
    try:
        mtime = resolved.stat().st_mtime_ns
    except OSError as err:
        raise ConfigurationError(f"cannot read {resolved}: {err.strerror or err}") from err
    return copy.deepcopy(_load(resolved, mtime))


def resource(logical_id: str, path: Path | None = None) -> dict[str, Any]:
    """One resource's definition: ``{"Type": ..., "Properties": ..., ...}``."""
    resources = load_template(path).get("Resources", {})
    if logical_id not in resources:
        raise KeyError(f"{template_path(path).name} has no resource {logical_id!r} "
                       f"(has: {', '.join(sorted(resources))})")
    return dict(resources[logical_id])


def param_default(template: dict[str, Any], value: Any) -> Any:
    """``value`` with a ``{"Ref": Parameter}`` replaced by the parameter's default."""
    if isinstance(value, dict) and "Ref" in value:
        parameter = template.get("Parameters", {}).get(value["Ref"])
        if parameter is None or "Default" not in parameter:
            raise ConfigurationError(f"template value {value} names no parameter with a default")
        return parameter["Default"]
    return value


def function_timeout(logical_id: str, path: Path | None = None) -> float:
    """A function's ``Timeout`` (Globals merged, a Ref resolved to its parameter's default):
    the local runner's executor and tick budgets, known without starting any AWS emulation."""
    template = load_template(path)
    props = template["Resources"][logical_id]["Properties"]
    globals_ = template.get("Globals", {}).get("Function", {})
    return float(param_default(template, props.get("Timeout", globals_.get("Timeout", 3))))


def state_machine_definition(logical_id: str, values: dict[str, str], path: Path | None = None) -> str:
    """The state machine's ASL text with its ``DefinitionSubstitutions`` applied.

    ``values`` maps each substitution key to its deployed value (an ARN). Step Functions
    emulators do not apply substitutions, so this does, and refuses a key it has no value for.
    """
    file = template_path(path)
    properties = resource(logical_id, file)["Properties"]
    definition_file = file.parent / properties["DefinitionUri"]
    try:
        definition = definition_file.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigurationError(f"cannot read {definition_file}: {err.strerror or err}") from err
    for key in properties.get("DefinitionSubstitutions", {}):
        if key not in values:
            raise ConfigurationError(f"{logical_id}: no value for the substitution ${{{key}}}")
        definition = definition.replace("${" + key + "}", values[key])
    return definition


def function_reference(value: Any) -> str | None:
    """The logical id behind ``!GetAtt F.Arn``, ``!Ref F.Alias`` or ``!Sub "${F.Arn}:live"``
    (how the stack names a function it invokes), else None."""
    if not isinstance(value, dict):
        return None
    target = value.get("Fn::GetAtt")
    if isinstance(target, list) and len(target) == 2 and target[1] == "Arn":
        return str(target[0])
    ref = value.get("Ref")
    if isinstance(ref, str) and ref.endswith(".Alias"):
        return ref.removesuffix(".Alias")
    alias = re.fullmatch(r"\$\{([A-Za-z0-9]+)\.Arn\}:[A-Za-z0-9_-]+", str(value.get("Fn::Sub", "")))
    if alias:  # !Sub "${F.Arn}:live": an alias's ARN, written out
        return alias.group(1)
    return None


@dataclass(frozen=True)
class EnvironmentSource:
    """Where the stack takes one function environment variable from."""

    parameters: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()
    literal: str | None = None
    functions: tuple[str, ...] = field(default=())  # empty: every function (Globals)


def _refs(value: Any) -> list[str]:
    if isinstance(value, dict):
        # `!Ref Function.Alias` (SAM's AutoPublishAlias) refers to the function itself
        found = [value["Ref"].split(".", 1)[0]] if isinstance(value.get("Ref"), str) else []
        if "Fn::Sub" in value:
            text = value["Fn::Sub"] if isinstance(value["Fn::Sub"], str) else value["Fn::Sub"][0]
            found += re.findall(r"\$\{([A-Za-z0-9]+)(?:\.[A-Za-z0-9.]+)?\}", text)  # ${X} and ${X.Attr}
        if "Fn::GetAtt" in value:
            found.append(value["Fn::GetAtt"][0])
        for inner in value.values():
            found += _refs(inner)
        return found
    if isinstance(value, list):
        return [ref for inner in value for ref in _refs(inner)]
    return []


def _source(template: dict[str, Any], value: Any, functions: tuple[str, ...]) -> EnvironmentSource:
    if not isinstance(value, dict | list):
        return EnvironmentSource(literal=str(value), functions=functions)
    refs = list(dict.fromkeys(_refs(value)))
    parameters = tuple(r for r in refs if r in template.get("Parameters", {}))
    resources = tuple(r for r in refs if r in template.get("Resources", {}))
    return EnvironmentSource(parameters=parameters, resources=resources, functions=functions)


def environment_sources(template: dict[str, Any]) -> dict[str, EnvironmentSource]:
    """Each environment variable the functions get, with the parameters or resources behind it."""
    sources: dict[str, EnvironmentSource] = {}
    variables = template.get("Globals", {}).get("Function", {}).get("Environment", {}).get("Variables", {})
    for name, value in variables.items():
        sources[name] = _source(template, value, ())
    for logical, definition in template.get("Resources", {}).items():
        if definition.get("Type") != "AWS::Serverless::Function":
            continue
        own = definition.get("Properties", {}).get("Environment", {}).get("Variables", {})
        for name, value in own.items():
            found = _source(template, value, (logical,))
            previous = sources.get(name)
            if previous is not None and previous.functions:  # set per function: merge what they use
                found = EnvironmentSource(
                    parameters=tuple(dict.fromkeys(previous.parameters + found.parameters)),
                    resources=tuple(dict.fromkeys(previous.resources + found.resources)),
                    literal=found.literal if found.literal == previous.literal else None,
                    functions=previous.functions + found.functions)
            sources[name] = found
    return sources
