"""Create DynamoDB tables from template.yaml's own definitions, never from a hand copy.

The builder is the package's (``serverless_worker.local.table``, which the local runner
uses too); this module pins it to this repository's template.
"""

from __future__ import annotations

from typing import Any

from serverless_worker.local.table import STATE_TABLE, CreatedTable, create_request
from serverless_worker.local.table import create_state_table as _create_state_table

from .template import TEMPLATE_PATH

__all__ = ["CreatedTable", "create_request", "create_state_table"]


def create_state_table(client: Any, table_name: str | None = None, *,
                       logical_id: str = STATE_TABLE) -> CreatedTable:
    """Create the template's table (under a unique name unless given) and wait until it is active."""
    return _create_state_table(client, table_name, logical_id=logical_id, template=TEMPLATE_PATH)
