"""The DynamoDB backend of the state store: one table (``StateTable`` in template.yaml).

All DynamoDB access of the project. The rules (statuses, transitions, fences, item
layout) are the base store's (``state/base.py``, ``state/rules.py``); this module turns its
few primitives into DynamoDB requests and its neutral conditions and updates
(``state/conditions.py``) into condition and update expressions.

Index writes: the in-flight index holds keys only, so a write costs index units only when it
adds (1), moves (2) or removes (1) an entry. Its range key ``deadline`` is set when the
delivery is recorded and is *never later* than the item's own deadline ``due``: a run that
pushes its deadline out (an update whose deadline ``extends``: start_run, take_over,
renew_deadline, save_checkpoint) writes ``due`` only, and moves ``deadline`` just when the
new deadline is earlier (a refused first try, then a second write). So the short path costs
the index 2 units (record, settle), not 4. Readers treat the index as a superset:
``stranded`` re-checks ``due`` on the full item, and ``count_in_flight(live_at=...)`` counts
entries whose ``deadline`` has not passed and reads the few whose has (runs outliving their
dispatch deadline) to check their ``due``.

Documents: the delivery is stored as raw-deflate compressed JSON bytes
(``items.pack_document``) to keep the item under one write unit (1 KB) where the job allows.

Sizes: DynamoDB items are capped at 400 KB. A write that would cross it raises
:class:`ItemTooLargeError` (a ``PayloadTooLargeError``) naming the ledger key, before the
call where the write alone is too large, else from DynamoDB's own refusal. The runtime
should then settle the job with a small outcome instead: a delivery too large to record
is reported as bad input (or handed back) without being run; an outcome or checkpoint
too large is replaced by a ``FAILURE`` outcome saying so, which does fit.

Example::

    store = DynamoStateStore.from_env()          # TABLE_NAME from the function's environment
    key = store.record_delivery(delivery, instance="blue", deadline=now + 60, dispatch_mode="invoke")
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from .. import logsafety  # noqa: F401  (botocore must not log item bodies: they hold tokens)
from ..awsclients import LazyClient
from ..errors import ConfigurationError
from .base import Returns, StateStore
from .conditions import All, AnyOf, Compare, Condition, Exists, Missing, OneOf, Param, StartsWith, Update
from .errors import ItemTooLargeError, StateStoreError
from .items import LedgerItem, from_item, item_size, pack_document, to_attribute, to_item
from .keys import DEADLINE, DUE, IN_FLIGHT_INDEX, ITEM_MAX_BYTES, PK, SCOPE, SK, sort_key_for
from .rules import FINAL_RETENTION_SECONDS

__all__ = ["DynamoStateStore"]

log = logging.getLogger("serverless_worker.state")

# Every call has a timeout; throttling and 5xx are retried by botocore's standard mode.
# No client-side parameter validation: DynamoDB validates every request itself (a bad one
# is a ValidationException, a StateStoreError here), and skipping botocore's copy saves
# about a tenth of the client's CPU per request, four requests per job.
_CLIENT_CONFIG = Config(connect_timeout=3, read_timeout=10, retries={"mode": "standard", "max_attempts": 5},
                        parameter_validation=False)

_BATCH_GET_MAX = 100
_RETURNS = {"none": "NONE", "new": "ALL_NEW", "updated": "UPDATED_NEW"}
# The index key stays put while it is not later than the item's new deadline (see above).
_INDEX_KEY_STAYS = Missing(DEADLINE) | Compare(DEADLINE, "<=", Param("deadline"))


class DynamoStateStore(StateStore):
    """The worker's state in one DynamoDB table. The client is built on its first request
    when not given; ``ops`` counts the DynamoDB requests made."""

    def __init__(self, table_name: str, *, client: Any = None,
                 clock: Callable[[], float] = time.time,
                 final_retention_seconds: int = FINAL_RETENTION_SECONDS) -> None:
        if not table_name:
            raise ConfigurationError("state table name is empty (set TABLE_NAME)")
        super().__init__(clock=clock, final_retention_seconds=final_retention_seconds)
        self.table_name = table_name
        # Built on its first request (awsclients): a cold start does not pay for an unused client.
        self._client = client if client is not None else LazyClient("dynamodb", config=_CLIENT_CONFIG)

    # DynamoDB has no cheaper batch with conditions: the scheduler records each delivery on
    # its dispatch pool, one conditional put each (the base's ``_put_new_records``).
    records_in_batches = False

    @classmethod
    def from_env(cls, *, client: Any = None, clock: Callable[[], float] = time.time) -> DynamoStateStore:
        """Build from ``TABLE_NAME`` (template.yaml passes the table's name to every function)."""
        name = os.environ.get("TABLE_NAME", "")
        if not name:
            raise ConfigurationError("TABLE_NAME is not set: it must name the stack's StateTable")
        return cls(name, client=client, clock=clock)

    # -- the base store's primitives ---------------------------------------------------
    def _get_record(self, pk: str) -> dict[str, Any] | None:
        response = self._call("read", "get_item", pk, {"Key": self._key(pk), "ConsistentRead": True})
        item = (response or {}).get("Item")
        return from_item(item) if item else None

    def _put_record(self, pk: str, attributes: dict[str, Any], replace_if: Condition | None,
                    values: dict[str, Any], *, what: str, return_old: bool = False) -> dict[str, Any] | None:
        condition = Missing(PK) if replace_if is None else Missing(PK) | replace_if
        text, names, used = _condition(condition)
        request = {"Item": to_item(attributes), "ConditionExpression": text,
                   "ReturnValues": "ALL_OLD" if return_old else "NONE",
                   **_placeholders(names, _bind(used, values))}
        response = self._call("write", "put_item", pk, request, what=what)
        if response is None:
            return None
        return from_item(response.get("Attributes") or {})

    def _update_record(self, pk: str, update: Update, condition: Condition | None, values: dict[str, Any], *,
                       what: str, returns: Returns = "none", create: bool = False,
                       wait: bool = True) -> dict[str, Any] | None:
        """One UpdateItem (it creates an absent item itself, so ``create`` needs nothing; it
        always waits). A deadline that ``extends`` first tries to keep the index key where it
        is (``due`` only); refused, a second write moves it too."""
        if update.deadline is not None and update.extends:
            stays = _INDEX_KEY_STAYS if condition is None else condition & _INDEX_KEY_STAYS
            response = self._update(pk, update, (DUE,), stays, {**values, "deadline": update.deadline},
                                    returns=returns, what=what)
            if response is not None:
                return response
        moved = (DUE, DEADLINE) if update.deadline is not None else ()
        return self._update(pk, update, moved, condition, values, returns=returns, what=what)

    def _delete_record(self, pk: str, condition: Condition, values: dict[str, Any]) -> bool:
        text, names, used = _condition(condition)
        request = {"Key": self._key(pk), "ConditionExpression": text, **_placeholders(names, _bind(used, values))}
        return self._call("write", "delete_item", pk, request) is not None

    def _in_flight_records(self, scope: str, *, before: float | None = None) -> list[dict[str, Any]]:
        """Query the index, then read the full items (the index holds keys only)."""
        keys = [entry[PK]["S"] for page in self._index_pages(scope, before, count=False)
                for entry in page.get("Items", [])]
        found: dict[str, dict[str, Any]] = {}
        for start in range(0, len(keys), _BATCH_GET_MAX):
            for attrs in self._batch_get(keys[start:start + _BATCH_GET_MAX], scope):
                found[attrs[PK]] = attrs
        return [found[key] for key in keys if key in found]

    def _count_in_flight_records(self, scope: str, *, live_at: float | None = None) -> int:
        counted = int(sum(page["Count"] for page in self._index_pages(scope, None, count=True, not_before=live_at)))
        if live_at is None:
            return counted
        # The index's deadline never is later than the item's: those past it may live on (a run
        # that pushed its deadline out); read them to count the ones whose own deadline has not passed.
        lagging = map(LedgerItem.from_attributes, self._in_flight_records(scope, before=live_at))
        return counted + sum(1 for item in lagging
                             if not item.is_final and item.deadline is not None and item.deadline >= live_at)

    def _pack_delivery(self, record: dict[str, Any], job_id: str) -> Any:
        return pack_document(record, job_id=job_id)

    # -- not in the contract ------------------------------------------------------------
    def ledger_documents(self) -> list[dict[str, Any]]:
        """Every delivery item's attributes: a consistent Scan of the whole table, every page,
        filtered on the key's ``delivery#`` prefix. Not for the worker's paths (its cost grows
        with the table): ``serverless-worker ledger`` reads it when a user asks."""
        text, names, used = _condition(StartsWith(PK, "delivery#"))
        request: dict[str, Any] = {"FilterExpression": text, "ConsistentRead": True,
                                   **_placeholders(names, _bind(used, {}))}
        found: list[dict[str, Any]] = []
        while True:
            page = self._call("read", "scan", "delivery#", request)
            assert page is not None  # a scan has no condition to refuse
            found.extend(from_item(item) for item in page.get("Items", []))
            if "LastEvaluatedKey" not in page:
                return found
            request["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    # -- requests ----------------------------------------------------------------------
    def _key(self, pk: str) -> dict[str, Any]:
        return {PK: {"S": pk}, SK: {"S": sort_key_for(pk)}}

    def _update(self, pk: str, update: Update, deadline_names: tuple[str, ...], condition: Condition | None,
                values: dict[str, Any], *, returns: Returns, what: str) -> dict[str, Any] | None:
        expression, names, update_values = _update_expression(update, deadline_names)
        request: dict[str, Any] = {"Key": self._key(pk), "UpdateExpression": expression,
                                   "ReturnValues": _RETURNS[returns]}
        bound: dict[str, Any] = dict(update_values)
        if condition is not None:
            text, condition_names, used = _condition(condition)
            request["ConditionExpression"] = text
            names = names | condition_names
            bound.update(_bind(used, values))
        request.update(_placeholders(names, bound))
        response = self._call("write", "update_item", pk, request, what=what)
        if response is None:
            return None
        return from_item(response["Attributes"]) if returns != "none" else {}

    def _call(self, kind: str, operation: str, key: str, request: dict[str, Any], *,
              what: str = "") -> dict[str, Any] | None:
        """One DynamoDB request; ``None`` when its condition refused it. The one place errors translate."""
        written = _written_size(request) if kind == "write" else 0
        if written > ITEM_MAX_BYTES:
            raise ItemTooLargeError(key, what, written, ITEM_MAX_BYTES)
        if operation != "batch_get_item":
            request = {"TableName": self.table_name, **request}
        with self._ops_lock:
            self.ops[kind] += 1
        try:
            response: dict[str, Any] = getattr(self._client, operation)(**request)
            return response
        except ClientError as err:
            error = err.response.get("Error", {})
            code, message = error.get("Code", ""), error.get("Message", "")
            if code == "ConditionalCheckFailedException":
                return None
            if code == "ValidationException" and "item size" in message.lower():
                raise ItemTooLargeError(key, what, written, ITEM_MAX_BYTES) from err
            raise StateStoreError(f"DynamoDB {operation} for {key} failed: {code}: {message}") from err
        except BotoCoreError as err:
            raise StateStoreError(f"DynamoDB {operation} for {key} failed: {type(err).__name__}") from err

    def _index_pages(self, scope: str, before: float | None, *, count: bool,
                     not_before: float | None = None) -> Iterator[dict[str, Any]]:
        condition: Condition = Compare(SCOPE, "=", Param("scope"))
        if before is not None:
            condition = condition & Compare(DEADLINE, "<", Param("before"))
        elif not_before is not None:
            condition = condition & Compare(DEADLINE, ">=", Param("not_before"))
        text, names, used = _condition(condition)
        values = {"scope": scope, "before": before, "not_before": not_before}
        request: dict[str, Any] = {"IndexName": IN_FLIGHT_INDEX, "KeyConditionExpression": text,
                                   **_placeholders(names, _bind(used, values))}
        if count:
            request["Select"] = "COUNT"
        while True:
            page = self._call("read", "query", scope, request)
            assert page is not None  # queries have no condition to refuse
            yield page
            if "LastEvaluatedKey" not in page:
                return
            request["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def _batch_get(self, pks: list[str], scope: str) -> list[dict[str, Any]]:
        pending: dict[str, Any] = {
            self.table_name: {"Keys": [self._key(pk) for pk in pks], "ConsistentRead": True}}
        items: list[dict[str, Any]] = []
        for attempt in range(8):
            response = self._call("read", "batch_get_item", scope, {"RequestItems": pending})
            assert response is not None
            items.extend(from_item(item) for item in response.get("Responses", {}).get(self.table_name, []))
            pending = response.get("UnprocessedKeys") or {}
            if not pending:
                return items
            time.sleep(min(1.0, 0.05 * 2**attempt))  # unprocessed keys are throttling: back off
        raise StateStoreError(f"DynamoDB batch_get_item for {scope} left keys unprocessed after 8 attempts")



def _placeholders(names: frozenset[str], values: dict[str, Any]) -> dict[str, Any]:
    request: dict[str, Any] = {}
    if names:
        request["ExpressionAttributeNames"] = {f"#{name}": name for name in names}
    if values:
        request["ExpressionAttributeValues"] = values
    return request


def _bind(used: tuple[tuple[str, Any], ...], values: dict[str, Any]) -> dict[str, Any]:
    """The condition's placeholders with their values: its literals, and each ``Param`` from the call's."""
    return {placeholder: to_attribute(values[value.name] if isinstance(value, Param) else value)
            for placeholder, value in used}


@functools.lru_cache(maxsize=256)
def _condition(condition: Condition) -> tuple[str, frozenset[str], tuple[tuple[str, Any], ...]]:
    """A neutral condition as a ConditionExpression: its text, the attribute names it uses,
    and its value placeholders (``:c0``... for literals, ``:name`` for a ``Param``)."""
    names: set[str] = set()
    used: dict[str, Any] = {}

    def operand(value: Any) -> str:
        placeholder = f":{value.name}" if isinstance(value, Param) else f":c{len(used)}"
        used[placeholder] = value
        return placeholder

    def name(attribute: str) -> str:
        names.add(attribute)
        return f"#{attribute}"

    def text(c: Condition, nested: bool = False) -> str:
        match c:
            case Compare(attribute, op, value):
                return f"{name(attribute)} {op} {operand(value)}"
            case OneOf(attribute, (value,)):
                return f"{name(attribute)} = {operand(value)}"
            case OneOf(attribute, values):
                return f"{name(attribute)} IN ({', '.join(operand(v) for v in values)})"
            case Exists(attribute):
                return f"attribute_exists({name(attribute)})"
            case Missing(attribute):
                return f"attribute_not_exists({name(attribute)})"
            case StartsWith(attribute, prefix):
                return f"begins_with({name(attribute)}, {operand(prefix)})"
            case All(parts) | AnyOf(parts):
                joined = (" AND " if isinstance(c, All) else " OR ").join(text(p, True) for p in parts)
                return f"({joined})" if nested else joined
        raise TypeError(f"not a condition: {c!r}")

    return text(condition), frozenset(names), tuple(used.items())


def _update_expression(update: Update, deadline_names: tuple[str, ...]) -> tuple[str, frozenset[str], dict[str, Any]]:
    """An update as an UpdateExpression (``:u0``... its values), the deadline written to
    ``deadline_names`` (``due``, and ``deadline`` where the index key moves with it)."""
    values: dict[str, Any] = {}

    def value(v: Any) -> str:
        placeholder = f":u{len(values)}"
        values[placeholder] = to_attribute(v)
        return placeholder

    sets = [f"#{n} = {value(v)}" for n, v in update.sets.items()]
    sets += [f"#{n} = if_not_exists(#{n}, {value(v)})" for n, v in update.defaults.items()]
    if deadline_names:
        deadline = value(update.deadline)
        sets += [f"#{n} = {deadline}" for n in deadline_names]
    clauses = []
    if sets:
        clauses.append("SET " + ", ".join(sets))
    if update.removes:
        clauses.append("REMOVE " + ", ".join(f"#{n}" for n in update.removes))
    if update.adds:
        clauses.append("ADD " + ", ".join(f"#{n} {value(d)}" for n, d in update.adds.items()))
    names = frozenset(update.sets) | frozenset(update.defaults) | frozenset(update.removes) | \
        frozenset(update.adds) | frozenset(deadline_names)
    return " ".join(clauses), names, values


def _written_size(request: dict[str, Any]) -> int:
    """Bytes a write puts into one item: the whole item for a put, key plus values for an update."""
    if "Item" in request:
        return item_size(request["Item"])
    values = request.get("ExpressionAttributeValues", {})
    return item_size(request.get("Key", {})) + item_size(values)
