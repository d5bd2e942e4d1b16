"""Custom checkov check CKV_SW_1: no wildcard IAM actions, and ``Resource: "*"`` only for
actions that AWS offers no resource-level permission for.

checkov's CloudFormation IAM checks (CKV_AWS_107..111) flag dangerous actions on "*";
this one holds the template to a stricter least-privilege rule: every action is named in
full, every resource is narrowed wherever AWS allows, and the only AWS managed policy a
role may carry is the X-Ray one SAM attaches for state-machine tracing.

Loaded by ``make iam-scan`` with ``--external-checks-dir scripts/checkov``.
"""

from __future__ import annotations

from typing import Any

from checkov.cloudformation.checks.resource.base_resource_check import BaseResourceCheck
from checkov.common.models.enums import CheckCategories, CheckResult

# Actions the IAM service authorization reference lists with no resource type: "*" is
# the only resource they accept.
STAR_RESOURCE_ONLY = frozenset({
    "xray:puttracesegments",
    "xray:puttelemetryrecords",
    "xray:getsamplingrules",
    "xray:getsamplingtargets",
    "xray:getsamplingstatisticsummaries",
    "states:sendtaskheartbeat",
    "states:sendtaskfailure",
    "states:sendtasksuccess",
})

# AWS managed policies a role may carry, all actions of which are in STAR_RESOURCE_ONLY.
ALLOWED_MANAGED_POLICIES = ("policy/AWSXrayWriteOnlyAccess",)


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _statements(conf: dict[str, Any]) -> list[dict[str, Any]]:
    props = conf.get("Properties") or {}
    documents = [props.get("PolicyDocument")]
    policies = _as_list(props.get("Policies") or [])
    documents += [p.get("PolicyDocument") for p in policies if isinstance(p, dict)]
    found: list[dict[str, Any]] = []
    for document in documents:
        if isinstance(document, dict):
            found += [s for s in _as_list(document.get("Statement") or []) if isinstance(s, dict)]
    return found


def _pattern(resource: Any) -> str | None:
    """The ARN text of a resource: a literal, or the template string of an ``Fn::Sub``."""
    if isinstance(resource, str):
        return resource
    if isinstance(resource, dict) and "Fn::Sub" in resource:
        sub = resource["Fn::Sub"]
        text = sub[0] if isinstance(sub, list) and sub else sub
        return text if isinstance(text, str) else None
    return None


def _managed_arns(conf: dict[str, Any]) -> list[str]:
    arns = (conf.get("Properties") or {}).get("ManagedPolicyArns") or []
    return [arn for arn in _as_list(arns) if isinstance(arn, str)]


class NoIamWildcards(BaseResourceCheck):
    def __init__(self) -> None:
        super().__init__(
            name="IAM statements name every action and use Resource \"*\" only where AWS requires it",
            id="CKV_SW_1",
            categories=[CheckCategories.IAM],
            supported_resources=["AWS::IAM::Role", "AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"],
        )

    def scan_resource_conf(self, conf: dict[str, Any]) -> CheckResult:
        for arn in _managed_arns(conf):
            if ":iam::aws:policy/" in arn and not arn.endswith(ALLOWED_MANAGED_POLICIES):
                self.details.append(f"AWS managed policy {arn} is broader than the function needs")
        for statement in _statements(conf):
            if statement.get("Effect") != "Allow":
                continue
            if "NotAction" in statement or "NotResource" in statement:
                self.details.append("NotAction/NotResource grants everything not listed")
                continue
            actions = [a for a in _as_list(statement.get("Action")) if isinstance(a, str)]
            wild = [a for a in actions if "*" in a]
            if wild:
                self.details.append(f"wildcard action(s) {wild}")
            resources = _as_list(statement.get("Resource"))
            if any("*" in (_pattern(r) or "") for r in resources):
                restrictable = [a for a in actions if a.lower() not in STAR_RESOURCE_ONLY]
                if restrictable:
                    self.details.append(f"Resource \"*\" for {restrictable}, which AWS lets you narrow")
        return CheckResult.FAILED if self.details else CheckResult.PASSED


check = NoIamWildcards()
