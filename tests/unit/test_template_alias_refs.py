"""The stack names its functions' live aliases as ``!Sub "${F.Arn}:live"``: LocalStack's
CloudFormation resolves references before the SAM transform and refuses ``!Ref F.Alias``,
which only the transform knows (found by the deployed tier, tests/deployed)."""

from __future__ import annotations

from typing import Any

from serverless_worker.local.template import function_reference, load_template


def _refs(value: Any) -> list[str]:
    if isinstance(value, dict):
        found = [value["Ref"]] if isinstance(value.get("Ref"), str) else []
        return found + [r for inner in value.values() for r in _refs(inner)]
    if isinstance(value, list):
        return [r for inner in value for r in _refs(inner)]
    return []


def test_no_reference_to_a_sam_alias_attribute() -> None:
    template = load_template()
    refs = _refs({"Resources": template["Resources"], "Outputs": template.get("Outputs", {})})
    assert refs and not [r for r in refs if "." in r], [r for r in refs if "." in r]


def test_the_alias_arn_spelling_names_its_function() -> None:
    assert function_reference({"Fn::Sub": "${StepsFunction.Arn}:live"}) == "StepsFunction"
    assert function_reference({"Ref": "StepsFunction.Alias"}) == "StepsFunction"
    assert function_reference({"Fn::GetAtt": ["StepsFunction", "Arn"]}) == "StepsFunction"
    assert function_reference({"Fn::Sub": "${StepsFunction.Arn}"}) is None
    substitution = load_template()["Resources"]["WorkerStateMachine"]["Properties"]["DefinitionSubstitutions"]
    assert function_reference(substitution["StepsFunctionArn"]) == "StepsFunction"
