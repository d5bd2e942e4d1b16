"""Conditions and updates in a form no backend owns.

The rulebook (``state/rules.py``) and the base store (``state/base.py``) write every
condition and every change of an item once, in these terms; each backend translates them:
DynamoDB into condition and update expressions (``state/store.py``), SQLite into a
``WHERE`` clause and a JSON patch of the row's document (``state/sqlite_store.py``).

A condition is immutable and hashable, so a backend translates each one once and caches
it; the values that change per call are :class:`Param` names, bound at the call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["All", "AnyOf", "Compare", "Condition", "Exists", "Missing", "OneOf", "Param", "StartsWith", "Update"]


@dataclass(frozen=True)
class Param:
    """A value given with the call (``Param("epoch")``), not fixed in the condition."""

    name: str


class Condition:
    """A test on one stored item; ``&`` and ``|`` combine them."""

    def __and__(self, other: Condition) -> All:
        return All(_parts(self, All) + _parts(other, All))

    def __or__(self, other: Condition) -> AnyOf:
        return AnyOf(_parts(self, AnyOf) + _parts(other, AnyOf))


def _parts(condition: Condition, kind: type[All | AnyOf]) -> tuple[Condition, ...]:
    """``a | b | c`` as one ``AnyOf`` of three, not two nested (and so for ``&``)."""
    return condition.parts if isinstance(condition, kind) else (condition,)


@dataclass(frozen=True)
class Compare(Condition):
    """``attribute op value``; false where the attribute is missing."""

    attribute: str
    op: Literal["=", "<", "<=", ">="]
    value: Any


@dataclass(frozen=True)
class OneOf(Condition):
    attribute: str
    values: tuple[Any, ...]


@dataclass(frozen=True)
class Exists(Condition):
    attribute: str


@dataclass(frozen=True)
class Missing(Condition):
    attribute: str


@dataclass(frozen=True)
class StartsWith(Condition):
    attribute: str
    prefix: Any


@dataclass(frozen=True)
class All(Condition):
    parts: tuple[Condition, ...]


@dataclass(frozen=True)
class AnyOf(Condition):
    parts: tuple[Condition, ...]


@dataclass
class Update:
    """What a write changes: attributes set (``None`` skips one), counted up, set only where
    missing, removed; and the item's deadline, which a backend may keep apart from its index
    key (``extends``: a run pushing its own deadline out, never in; state/store.py).

    The order of ``sets`` is kept: a large document first, so an emulator that applies
    clauses one by one keeps none of them when it refuses the value (state/base.py)."""

    sets: dict[str, Any] = field(default_factory=dict)
    adds: dict[str, int] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)
    removes: list[str] = field(default_factory=list)
    deadline: float | None = None
    extends: bool = False

    def set(self, **values: Any) -> Update:
        self.sets.update((name, value) for name, value in values.items() if value is not None)
        return self

    def add(self, **deltas: int) -> Update:
        self.adds.update(deltas)
        return self

    def default(self, **values: Any) -> Update:
        self.defaults.update(values)
        return self

    def remove(self, *names: str) -> Update:
        self.removes.extend(names)
        return self

    def move_deadline(self, deadline: float, *, extends: bool = False) -> Update:
        self.deadline, self.extends = deadline, extends
        return self
