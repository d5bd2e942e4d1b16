"""Whether a claimed item meets the criteria the claim sent, checked on our side.

The queue promises "you never get an item you didn't ask for" (a missing field or an
unknown operator fails closed), but a server is not its document: one that ignores the
criteria hands a small box the GPU box's work. So the worker reads each claimed item
against its own criteria and gives back what does not meet them (``runtime/pulling.py``).

Where the worker cannot judge, it trusts the server: an operator it does not know (the
user's criteria may use one this worker was not written for) or an operand of the wrong
shape counts as met. Only a criterion the worker can evaluate and the item fails makes the
item foreign: a false "foreign" would hand back work the server rightly gave us, forever.

    criteria_miss({"format": "png"}, {"format": "jpg"})   # "format is 'png', asked for 'jpg'"
    criteria_miss({"width": 800}, {"width": {"lte": 2000}})  # None: met
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

__all__ = ["criteria_miss"]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _same(a: Any, b: Any) -> bool:
    """JSON equality: ``true`` is not ``1``, ``1`` is ``1.0``."""
    if _number(a) and _number(b):
        return bool(a == b)
    return type(a) is type(b) and bool(a == b)


def _comparable(a: Any, b: Any) -> bool:
    return (_number(a) and _number(b)) or (isinstance(a, str) and isinstance(b, str))


def _order(test: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool | None]:
    """An ordering operator: ``None`` (cannot judge) for an operand it cannot compare with anything."""
    def check(value: Any, operand: Any) -> bool | None:
        if not (_number(operand) or isinstance(operand, str)):
            return None
        return _comparable(value, operand) and test(value, operand)
    return check


def _member(inside: bool) -> Callable[[Any, Any], bool | None]:
    def check(value: Any, operand: Any) -> bool | None:
        if not isinstance(operand, list):
            return None
        return any(_same(value, x) for x in operand) is inside
    return check


# The operators the queue's document shows (lte, in) and the usual rest of the family.
_OPERATORS: dict[str, Callable[[Any, Any], bool | None]] = {
    "eq": _same,
    "ne": lambda a, b: not _same(a, b),
    "lt": _order(lambda a, b: a < b),
    "lte": _order(lambda a, b: a <= b),
    "gt": _order(lambda a, b: a > b),
    "gte": _order(lambda a, b: a >= b),
    "in": _member(True),
    "nin": _member(False),
}


def criteria_miss(item: Any, criteria: dict[str, Any] | None) -> str | None:
    """The first criterion ``item`` fails, in words (its field and the item's value); ``None``
    when it meets them all, or fails none the worker can judge."""
    if not criteria:
        return None
    if not isinstance(item, dict):
        return f"the item is not an object ({type(item).__name__}), asked for criteria on {sorted(criteria)}"
    for name, matcher in criteria.items():
        if name not in item:
            return f"the item has no field {name!r}, asked for {matcher!r}"
        value = item[name]
        if isinstance(matcher, dict):
            if len(matcher) != 1:
                continue  # not one operator: nothing the worker can judge
            ((op, operand),) = matcher.items()
            test = _OPERATORS.get(op)
            if test is None:
                continue
            try:
                met = test(value, operand)
            except TypeError:
                met = None
            if met is False:
                return f"{name} is {value!r:.80}, asked for {matcher!r:.80}"
        elif not _same(value, matcher):
            return f"{name} is {value!r:.80}, asked for {matcher!r:.80}"
    return None
