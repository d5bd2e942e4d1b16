"""Create the state table from template.yaml's own ``StateTable`` definition, never from a
hand copy, so the local runner and the tests use the deployed schema.

``create_state_table(client)`` reads the resource's Properties and turns them into the
CreateTable request (key schema, attribute definitions, indexes, billing mode,
encryption), then applies what CreateTable cannot take: TTL, and point-in-time recovery
where the backend implements it (moto does; DynamoDB Local does not). A property this
module does not know fails loudly, so the template cannot grow a setting that local
tables silently ignore.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from .template import resource

__all__ = ["STATE_TABLE", "CreatedTable", "create_request", "create_state_table"]

STATE_TABLE = "StateTable"  # the logical id in template.yaml
# Applied after CreateTable; the rest map onto the CreateTable request.
_AFTER_CREATE = {"TimeToLiveSpecification", "PointInTimeRecoverySpecification"}
_IGNORED = {"TableName"}  # local tables are named by the caller
_INDEX_KEYS = {"IndexName", "KeySchema", "Projection", "ProvisionedThroughput"}
_AS_IS = ("AttributeDefinitions", "KeySchema", "BillingMode", "ProvisionedThroughput", "Tags", "TableClass",
          "DeletionProtectionEnabled")


@dataclass(frozen=True)
class CreatedTable:
    name: str
    ttl_attribute: str | None
    point_in_time_recovery: bool  # False where the backend has no PITR API (DynamoDB Local)


def _reject_intrinsics(value: Any, where: str) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            if key == "Ref" or key.startswith("Fn::"):
                raise ValueError(f"{where} uses {key}; resolve it before building a local table")
            _reject_intrinsics(inner, f"{where}.{key}")
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            _reject_intrinsics(inner, f"{where}[{index}]")


def _index(definition: dict[str, Any], where: str) -> dict[str, Any]:
    unknown = set(definition) - _INDEX_KEYS
    if unknown:
        raise ValueError(f"{where} has properties a local table cannot map yet: {sorted(unknown)}")
    return dict(definition)


def create_request(properties: dict[str, Any], table_name: str) -> dict[str, Any]:
    """The CreateTable request for a template's ``AWS::DynamoDB::Table`` Properties."""
    _reject_intrinsics(properties, "Properties")
    request: dict[str, Any] = {"TableName": table_name}
    for name, value in properties.items():
        if name in _AFTER_CREATE or name in _IGNORED:
            continue
        if name in _AS_IS:
            request[name] = value
        elif name in ("GlobalSecondaryIndexes", "LocalSecondaryIndexes"):
            request[name] = [_index(index, f"{name}[{i}]") for i, index in enumerate(value)]
        elif name == "SSESpecification":
            sse = {"Enabled": bool(value.get("SSEEnabled", False))}
            sse.update({k: value[k] for k in ("SSEType", "KMSMasterKeyId") if k in value})
            request[name] = sse
        elif name == "StreamSpecification":
            request[name] = {"StreamEnabled": True, "StreamViewType": value["StreamViewType"]}
        else:
            raise ValueError(f"template property {name} is not mapped by serverless_worker.local.table")
    return request


def create_state_table(client: Any, table_name: str | None = None, *, logical_id: str = STATE_TABLE,
                       template: Path | None = None) -> CreatedTable:
    """Create the template's table (under a unique name unless given) and wait until it is active."""
    properties = resource(logical_id, template)["Properties"]
    name = table_name or f"state-{uuid.uuid4().hex[:12]}"
    client.create_table(**create_request(properties, name))
    client.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 30})

    ttl = properties.get("TimeToLiveSpecification")
    if ttl and ttl.get("Enabled"):
        client.update_time_to_live(TableName=name, TimeToLiveSpecification={
            "Enabled": True, "AttributeName": ttl["AttributeName"]})

    pitr = bool((properties.get("PointInTimeRecoverySpecification") or {}).get("PointInTimeRecoveryEnabled"))
    if pitr:
        try:
            client.update_continuous_backups(TableName=name, PointInTimeRecoverySpecification={
                "PointInTimeRecoveryEnabled": True})
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") != "UnknownOperationException":
                raise
            pitr = False  # DynamoDB Local has no continuous backups
    return CreatedTable(name=name, ttl_attribute=ttl["AttributeName"] if ttl else None,
                        point_in_time_recovery=pitr)
