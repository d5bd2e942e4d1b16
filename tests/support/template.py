"""Load template.yaml the way CloudFormation reads it, so fixtures use the real definitions.

The short intrinsic tags (``!Ref``, ``!Sub``, ``!GetAtt`` ...) are decoded by cfn-lint's
own loader into their long forms (``{"Ref": ...}``), and the result is converted to
plain dicts, lists and strings.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from cfnlint.decode import decode

__all__ = ["TEMPLATE_PATH", "load_template", "resource"]

TEMPLATE_PATH = Path(__file__).resolve().parents[2] / "template.yaml"


def _plain(node: Any) -> Any:
    if isinstance(node, dict):
        return {str(key): _plain(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_plain(value) for value in node]
    if isinstance(node, str):
        return str(node)
    return node


@cache
def _load(path: Path) -> dict[str, Any]:
    template, matches = decode(str(path))
    if template is None or matches:
        problems = "; ".join(str(match) for match in matches) or "empty template"
        raise ValueError(f"{path} could not be decoded: {problems}")
    return _plain(template)


def load_template(path: Path = TEMPLATE_PATH) -> dict[str, Any]:
    """The decoded template (cached per path; callers get a fresh copy to mutate freely)."""
    return _plain(_load(path))


def resource(logical_id: str, path: Path = TEMPLATE_PATH) -> dict[str, Any]:
    """One resource's definition: ``{"Type": ..., "Properties": ..., ...}``."""
    resources = load_template(path).get("Resources", {})
    if logical_id not in resources:
        raise KeyError(f"{path.name} has no resource {logical_id!r} (has: {', '.join(sorted(resources))})")
    return resources[logical_id]
