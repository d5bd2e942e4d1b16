"""Job content a ledger cannot hold, shared by the tiers that poison a batch with it."""

from __future__ import annotations

import base64
import os
from typing import Any

__all__ = ["incompressible", "nested"]


def nested(levels: int) -> dict[str, Any]:
    """A dict nested ``levels`` deep (past pydantic's serialisation depth at 255)."""
    value: dict[str, Any] = {"leaf": True}
    for _ in range(levels):
        value = {"a": value}
    return value


def incompressible(size: int) -> str:
    """``size`` characters that deflate hardly shrinks (the DynamoDB ledger stores deliveries deflated)."""
    return base64.b64encode(os.urandom(size * 3 // 4)).decode()
