"""What a handler may return besides a plain JSON value.

- a JSON-able value (dict, list, str, number, bool, None, or a pydantic model): success;
- :class:`Result`: success plus the Pipelogiq extras (result logs, context updates,
  appended stages, wait for approval); other protocols report ``value`` only;
- :class:`Continue`: "call me again in a fresh slice with ``job.checkpoint`` set", for
  handlers declared ``mode="slices"`` that outgrow one Lambda invocation.

Example::

    return Result({"ok": True}, context={"customer": "c-42"}, logs=["charged"])
    return Continue({"page": 3}, delay_seconds=5)
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, SecretStr
from pydantic_core import PydanticSerializationError, to_jsonable_python

from .errors import NotJsonSerializableError
from .model import AppendedStage, ContextUpdate, ResultExtras, ResultLog
from .textforms import rfc3339

__all__ = ["Continue", "NotJsonSerializableError", "Result", "to_jsonable"]


def to_jsonable(value: Any) -> Any:
    """Normalize ``value`` to plain JSON types the way pydantic does.

    Models are dumped in JSON mode; datetimes, dates and times become ISO 8601 strings,
    Decimals and UUIDs strings, tuples lists, enums their values (docs/outcomes.md, "What a
    handler may return"). Refused, naming the type and where it sits: a set or frozenset
    (it has no order, so the list it would become differs from run to run; return
    ``sorted(...)``), NaN and infinities (JSON has none), and any type pydantic cannot dump.
    """
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    _refuse_unordered(value, "the value")
    try:
        normalized = to_jsonable_python(value)
        json.dumps(normalized, allow_nan=False)
    except PydanticSerializationError as err:
        inner = str(err).removeprefix("Unable to serialize unknown type: ")
        detail = "" if inner == str(type(value)) else f" (contains {inner})"
        raise NotJsonSerializableError(f"{type(value).__name__}{detail}") from err
    except (TypeError, ValueError) as err:  # NaN/Infinity, circular references
        raise NotJsonSerializableError(f"{type(value).__name__} ({err})") from err
    return normalized


_MAX_DEPTH = 100  # deeper than any result means a cycle; to_jsonable_python then says so


def _refuse_unordered(value: Any, where: str, depth: int = 0) -> None:
    """Raise :class:`NotJsonSerializableError` for a set anywhere in plain containers."""
    if depth > _MAX_DEPTH:
        return
    if isinstance(value, set | frozenset):
        raise NotJsonSerializableError(
            f"{type(value).__name__} at {where}: a set has no order, so the JSON list it would become "
            "differs from run to run; return a list (sorted(...))")
    if isinstance(value, Mapping):
        for key, item in value.items():
            # A key that looks like a field name says where; any other key is content: not quoted.
            label = repr(key) if isinstance(key, str) and key.isidentifier() and len(key) <= 40 else "..."
            _refuse_unordered(item, f"{where}[{label}]", depth + 1)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _refuse_unordered(item, f"{where}[{index}]", depth + 1)


def _log_line(entry: str | ResultLog | Mapping[str, Any], now: float) -> ResultLog:
    if isinstance(entry, ResultLog):
        return entry
    if isinstance(entry, str):
        return ResultLog(message=entry, logLevel="INFO", created=rfc3339(now))
    data = dict(entry)
    data.setdefault("created", rfc3339(now))
    return ResultLog.model_validate(data)


def _context_update(key: str, value: Any) -> ContextUpdate:
    if isinstance(value, ContextUpdate):
        return value.model_copy(update={"key": key})
    if isinstance(value, SecretStr):
        # The server must receive the value; isSensitive asks it to mask the item.
        return ContextUpdate(key=key, value=value.get_secret_value(), isSensitive=True)
    if isinstance(value, str):
        return ContextUpdate(key=key, value=value)
    return ContextUpdate(key=key, value=json.dumps(to_jsonable(value)), valueType="json")


def _stage(entry: AppendedStage | Mapping[str, Any]) -> AppendedStage:
    if isinstance(entry, AppendedStage):
        return entry
    data = dict(entry)
    if "input" in data and not isinstance(data["input"], str):
        data["input"] = json.dumps(to_jsonable(data["input"]))
    return AppendedStage.model_validate(data)


@dataclass(frozen=True)
class Result:
    """A successful value with the Pipelogiq result extras.

    ``context`` maps a key to its new value: a string is sent as is, a
    :class:`~pydantic.SecretStr` as a sensitive item, anything else as JSON
    (``valueType: "json"``), or pass a ``ContextUpdate`` for full control.
    ``delete_context`` lists keys to tombstone. ``append_stages`` holds
    ``AppendedStage`` objects or dicts with ``stageName``, ``stageHandlerName``,
    ``input`` (non-strings are JSON-encoded) and ``options``.
    """

    value: Any = None
    logs: Sequence[str | ResultLog | Mapping[str, Any]] = ()
    context: Mapping[str, Any] = field(default_factory=dict)
    delete_context: Sequence[str] = ()
    append_stages: Sequence[AppendedStage | Mapping[str, Any]] = ()
    wait_for_approval: bool = False

    def to_extras(self, now: float | None = None) -> ResultExtras:
        """The extras in their wire-ready form; raises on a malformed entry."""
        at = time.time() if now is None else now
        updates = [_context_update(k, v) for k, v in self.context.items()]
        updates += [ContextUpdate(key=k, isDeleted=True) for k in self.delete_context]
        return ResultExtras(
            logs=[_log_line(entry, at) for entry in self.logs],
            context=updates,
            appended_stages=[_stage(s) for s in self.append_stages],
            wait_for_approval=self.wait_for_approval,
        )


@dataclass(frozen=True)
class Continue:
    """Ask to be called again in a fresh slice with ``job.checkpoint = checkpoint``.

    Only for handlers declared ``mode="slices"``; the checkpoint must be
    JSON-serializable (it is stored between slices). ``delay_seconds`` is how long
    to wait before the next slice.
    """

    checkpoint: Any = None
    delay_seconds: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.delay_seconds, int | float) or isinstance(self.delay_seconds, bool):
            raise TypeError("Continue.delay_seconds must be a number")
        if not math.isfinite(self.delay_seconds) or self.delay_seconds < 0:
            raise ValueError("Continue.delay_seconds must be a finite number >= 0")
