"""template.yaml, decoded the way CloudFormation reads it, for fixtures built from the real
definitions. The loader is the package's own (``serverless_worker.local.template``), the
one the local runner uses; this module only pins the path to this repository's template.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from serverless_worker.local import template as _template

__all__ = ["TEMPLATE_PATH", "load_template", "resource"]

TEMPLATE_PATH = Path(__file__).resolve().parents[2] / "template.yaml"


def load_template(path: Path = TEMPLATE_PATH) -> dict[str, Any]:
    """The decoded template (a fresh copy to mutate freely)."""
    return _template.load_template(path)


def resource(logical_id: str, path: Path = TEMPLATE_PATH) -> dict[str, Any]:
    """One resource's definition: ``{"Type": ..., "Properties": ..., ...}``."""
    return _template.resource(logical_id, path)
