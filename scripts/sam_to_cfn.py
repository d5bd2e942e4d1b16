"""Expand template.yaml (AWS SAM) into the plain CloudFormation that AWS deploys, offline.

The IAM policy scanner (``make iam-scan``) reads the output: SAM policy templates
(``DynamoDBCrudPolicy`` and the like), ``Tracing: Active``, event sources and
destinations only become IAM statements after the transform, so scanning the SAM
source alone would never see the permissions the functions really get.

Run with the SAM CLI's virtualenv, which has ``samtranslator`` and SAM's YAML loader::

    .venv-sam/bin/python scripts/sam_to_cfn.py template.yaml .aws-sam/iam-scan/template.json

Local code paths (``CodeUri``, ``ContentUri``) become placeholder S3 URIs, as
``sam validate`` does; the state machine's ``DefinitionUri`` is inlined so the
definition is part of what gets scanned.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from samcli.yamlhelper import yaml_parse
from samtranslator.translator.managed_policy_translator import ManagedPolicyLoader
from samtranslator.translator.transform import transform

__all__ = ["translate"]

_PLACEHOLDER = "s3://iam-scan-placeholder/{}"


class _NoManagedPolicies(ManagedPolicyLoader):
    """The template attaches no managed policy by name, so there is nothing to look up in IAM."""

    def __init__(self) -> None:  # no IAM client: the scan runs offline
        pass

    def load(self) -> dict[str, str]:
        return {}


def _localize(template: dict[str, Any], root: Path) -> None:
    for name, resource in template.get("Resources", {}).items():
        props = resource.get("Properties") or {}
        kind = resource.get("Type")
        if kind == "AWS::Serverless::Function" and isinstance(props.get("CodeUri"), str):
            props["CodeUri"] = _PLACEHOLDER.format(name)
        elif kind == "AWS::Serverless::LayerVersion" and isinstance(props.get("ContentUri"), str):
            props["ContentUri"] = _PLACEHOLDER.format(name)
        elif kind == "AWS::Serverless::StateMachine" and isinstance(props.get("DefinitionUri"), str):
            props["Definition"] = json.loads((root / props.pop("DefinitionUri")).read_text())
    function_globals = template.get("Globals", {}).get("Function", {})
    if isinstance(function_globals.get("CodeUri"), str):
        function_globals["CodeUri"] = _PLACEHOLDER.format("Globals")


def translate(path: Path, overrides: dict[str, str] | None = None) -> dict[str, Any]:
    """The CloudFormation template ``path`` deploys as (parameter defaults unless
    ``overrides`` names them, us-east-1)."""
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")  # pseudo parameters need a region
    template = yaml_parse(path.read_text())
    _localize(template, path.parent)
    parameters = {"AWS::Region": "us-east-1", "AWS::Partition": "aws", "AWS::AccountId": "123456789012",
                  "AWS::StackName": "iam-scan", **(overrides or {})}
    return transform(template, parameters, _NoManagedPolicies(), passthrough_metadata=True)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(f"usage: {argv[0]} TEMPLATE.yaml OUTPUT.json", file=sys.stderr)
        return 2
    output = Path(argv[2])
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(translate(Path(argv[1])), indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
