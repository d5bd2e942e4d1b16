"""``python -m benchmarks.write_units [--jobs N]``: DynamoDB write units per job on the short path.

A write request unit is 1 KB of item, and a global secondary index costs its own units
whenever its entry is added, moved or removed. The meter wraps the runtime's DynamoDB
client and prices every write as DynamoDB does: the base table by the larger of the item
before and after (``ceil(size / 1 KB)``, at least one, a refused condition too); the
in-flight index (``KEYS_ONLY``: its entry is the key attributes plus 100 bytes) by one
unit for an entry added or removed and two for an entry whose key moved. Where the
engine reports ``ConsumedCapacity`` (DynamoDB, DynamoDB Local) its figure is kept beside
the computed one (``engine``), so the model can be checked against it.

The jobs run through ``benchmarks.rig`` (the real scheduler and executor, as the local
runner wires them) against each protocol's sandbox; sessions, locks and counters are
reported apart from the ledger (they are per tick or batched, not per job).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
from collections import Counter
from typing import Any

from serverless_worker.state.items import item_size

__all__ = ["SessionWriteMeter", "WriteUnitMeter", "index_units", "measure", "table_units"]

_WRITES = ("put_item", "update_item", "delete_item")
_WRITE_OPERATIONS = ("PutItem", "UpdateItem", "DeleteItem")
_READ_OPERATIONS = ("GetItem", "Query", "BatchGetItem", "Scan")
_INDEX_KEYS = ("scope", "deadline")
_TABLE_KEYS = ("pk", "sk")
_INDEX_OVERHEAD = 100  # bytes DynamoDB adds to every index entry


def table_units(before: dict[str, Any] | None, after: dict[str, Any] | None) -> int:
    """Base-table write units: the larger of the item before and after, in whole KB, at least 1."""
    size = max(item_size(before) if before else 0, item_size(after) if after else 0)
    return max(1, math.ceil(size / 1024))


def _index_entry(item: dict[str, Any] | None) -> dict[str, Any] | None:
    if not item or any(name not in item for name in _INDEX_KEYS):
        return None
    return {name: item[name] for name in (*_TABLE_KEYS, *_INDEX_KEYS)}


def _entry_units(entry: dict[str, Any]) -> int:
    return max(1, math.ceil((item_size(entry) + _INDEX_OVERHEAD) / 1024))


def index_units(before: dict[str, Any] | None, after: dict[str, Any] | None) -> int:
    """In-flight index write units (keys only: only adding, moving or removing an entry costs)."""
    old, new = _index_entry(before), _index_entry(after)
    if old == new:
        return 0
    return (_entry_units(old) if old else 0) + (_entry_units(new) if new else 0)


def _kind(item: dict[str, Any] | None, request: dict[str, Any]) -> str:
    pk = (request.get("Key") or request.get("Item") or {}).get("pk", {}).get("S", "")
    return pk.split("#", 1)[0] or "?"


class WriteUnitMeter:
    """A DynamoDB client that prices each write (see the module's docstring); everything else passes."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._lock = threading.Lock()
        self.units: Counter[str] = Counter()    # "table:<kind>", "index:<kind>" (computed)
        self.engine: Counter[str] = Counter()   # the engine's ConsumedCapacity per kind, where it reports one
        self.requests: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        if name in _WRITES:
            return lambda **request: self._write(name, request)
        return getattr(self._client, name)

    def _item(self, table: str, key: dict[str, Any]) -> dict[str, Any] | None:
        found: dict[str, Any] | None = self._client.get_item(TableName=table, Key=key,
                                                            ConsistentRead=True).get("Item")
        return found

    def _write(self, operation: str, request: dict[str, Any]) -> Any:
        table = request["TableName"]
        key = request.get("Key") or {name: request["Item"][name] for name in _TABLE_KEYS}
        # Prices need the item on both sides; with concurrent writers to one item the figure
        # could be off by a write, which the short path (one executor per item) never has.
        before = self._item(table, key)
        engine = 0.0
        try:
            response = getattr(self._client, operation)(**{**request, "ReturnConsumedCapacity": "INDEXES"})
            engine = float(response.get("ConsumedCapacity", {}).get("CapacityUnits", 0.0))
        except Exception as err:
            response = getattr(err, "response", {})
            engine = float((response or {}).get("ConsumedCapacity", {}).get("CapacityUnits", 0.0))
            self._note(_kind(before, request), table_units(before, None), 0, engine)
            raise
        after = self._item(table, key)
        self._note(_kind(before, request), table_units(before, after), index_units(before, after), engine)
        return response

    def _note(self, kind: str, table: int, index: int, engine: float) -> None:
        with self._lock:
            self.requests[kind] += 1
            self.units[f"table:{kind}"] += table
            self.units[f"index:{kind}"] += index
            self.engine[kind] += engine  # type: ignore[assignment]


class SessionWriteMeter(WriteUnitMeter):
    """The same prices for every DynamoDB client a boto3 session builds after :meth:`attach`
    (the runtime's own, built in its Lambda entry points), through botocore's events: the
    item is read before the write's parameters are built and after its answer, with
    ``reader``, a client of the same DynamoDB. Only ``table``'s requests are priced; read
    requests are counted (``reads``)."""

    def __init__(self, reader: Any, table: str) -> None:
        super().__init__(reader)
        self.table = table
        self.reads = 0
        self._attached: Any = None

    def attach(self, events: Any) -> None:
        events.register("before-parameter-build.dynamodb", self._before, unique_id="sw-bench-wru-before")
        events.register("after-call.dynamodb", self._after, unique_id="sw-bench-wru-after")
        self._attached = events

    def detach(self) -> None:
        if self._attached is not None:
            self._attached.unregister("before-parameter-build.dynamodb", unique_id="sw-bench-wru-before")
            self._attached.unregister("after-call.dynamodb", unique_id="sw-bench-wru-after")
            self._attached = None

    def _before(self, params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
        if model.name in _WRITE_OPERATIONS and params.get("TableName") == self.table:
            key = params.get("Key") or {name: params["Item"][name] for name in _TABLE_KEYS}
            context["sw_bench_write"] = (key, params, self._item(self.table, key))

    def _after(self, model: Any, context: dict[str, Any], parsed: dict[str, Any], **_: Any) -> None:
        if model.name in _READ_OPERATIONS:
            with self._lock:
                self.reads += 1
            return
        pending = context.pop("sw_bench_write", None)
        if pending is None:
            return
        key, request, before = pending
        if "Error" in parsed:  # refused (a condition) or failed: priced as DynamoDB prices a refusal
            self._note(_kind(before, request), table_units(before, None), 0, 0.0)
            return
        after = self._item(self.table, key)
        self._note(_kind(before, request), table_units(before, after), index_units(before, after), 0.0)


class _MeteredAws:
    """``EmbeddedAws`` with its DynamoDB client metered (the rig only uses ``.dynamodb``)."""

    def __init__(self, aws: Any, meter: WriteUnitMeter) -> None:
        self._aws, self.dynamodb = aws, meter

    def __getattr__(self, name: str) -> Any:
        return getattr(self._aws, name)


def measure(protocol: str, *, jobs: int = 30, concurrency: int = 4) -> dict[str, Any]:
    """Write units per job for ``protocol``: the ledger's (table, index, total) and the rest's."""
    from serverless_worker.local.aws import EmbeddedAws

    from .rig import template_defaults
    from .throughput import run_runtime

    defaults = template_defaults()
    aws = EmbeddedAws.start(pool_size=concurrency + 8)
    try:
        meter = WriteUnitMeter(aws.dynamodb)
        run = run_runtime(_MeteredAws(aws, meter), protocol, jobs, concurrency, defaults["batch_size"],
                          defaults["max_in_flight"], defaults["poll_window_seconds"], timeout=120.0)
    finally:
        aws.close()
    units = meter.units
    table, index = units["table:delivery"] / jobs, units["index:delivery"] / jobs
    other = sum(v for k, v in units.items() if not k.endswith(":delivery"))
    return {
        "protocol": protocol, "jobs": jobs, "done": run["done"],
        "ledger_writes_per_job": meter.requests["delivery"] / jobs,
        "ledger_table_units_per_job": table, "ledger_index_units_per_job": index,
        "ledger_units_per_job": table + index,
        "other_units_per_job": other / jobs,
        "engine_ledger_units_per_job": meter.engine["delivery"] / jobs,
        "ledger_item_bytes": run["item_bytes"],
        "by_operation_per_job": {k: v / jobs for k, v in sorted(run["operations"].items())},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.write_units", description=__doc__)
    parser.add_argument("--jobs", type=int, default=30)
    parser.add_argument("--protocols", nargs="+", default=["pipelogiq", "priostack", "claimqueue"])
    args = parser.parse_args(argv)
    rows = [measure(protocol, jobs=args.jobs) for protocol in args.protocols]
    print(f"{'protocol':<12}{'writes/job':>11}{'table WRU':>11}{'index WRU':>11}{'ledger WRU':>12}"
          f"{'other WRU':>11}{'item bytes':>12}")
    for row in rows:
        print(f"{row['protocol']:<12}{row['ledger_writes_per_job']:>11.2f}{row['ledger_table_units_per_job']:>11.2f}"
              f"{row['ledger_index_units_per_job']:>11.2f}{row['ledger_units_per_job']:>12.2f}"
              f"{row['other_units_per_job']:>11.2f}{row['ledger_item_bytes'] or 0:>12.0f}")
    print(json.dumps(rows, indent=1), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
