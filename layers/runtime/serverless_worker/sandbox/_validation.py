"""Admin bodies (seeds, fault plans, config) checked strictly, with messages a person can act on.

pydantic's own text runs to several lines per problem and ends each with a link to its
documentation; a misspelt field in a seed deserves one line naming it and the field it
was probably meant to be: ``unknown field 'maxRetrys' (did you mean 'maxRetries'?)``.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ValidationError

__all__ = ["BadBody", "describe", "reject_unknown", "validate_body"]

class BadBody(ValueError):
    """An admin body that does not fit its model; the message is short and has no links."""


def validate_body[Model: BaseModel](model: type[Model], body: Any) -> Model:
    """``model`` validated from ``body``, or :class:`BadBody` saying what is wrong in a line per problem."""
    try:
        return model.model_validate(body)
    except ValidationError as err:
        raise BadBody(describe(err, model)) from None


def reject_unknown(model: type[BaseModel], body: Any) -> None:
    """Refuse a body that is not an object, or has top-level keys ``model`` does not have
    (for bodies merged into a model that is itself lenient)."""
    if not isinstance(body, dict):
        raise BadBody("body must be a JSON object")
    unknown = [key for key in body if key not in model.model_fields]
    if unknown:
        raise BadBody("; ".join(_unknown(str(key), (), model.model_fields) for key in unknown))


def describe(err: ValidationError, model: type[BaseModel]) -> str:
    """One short clause per error in ``err``, joined by ``; ``."""
    clauses = []
    for error in err.errors(include_url=False):
        loc = tuple(error["loc"])
        if error["type"] == "extra_forbidden":
            clauses.append(_unknown(str(loc[-1]), loc[:-1], _fields_at(model, loc[:-1])))
        else:
            clauses.append(f"{_path(loc) or 'body'}: {error['msg']}")
    return "; ".join(clauses)


def _unknown(name: str, where: tuple[Any, ...], known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    place = f" in {_path(where)}" if where else ""
    return f"unknown field {name!r}{place}{hint}"


def _path(loc: tuple[Any, ...]) -> str:
    """``('jobs', 0, 'count')`` as ``jobs[0].count``."""
    text = ""
    for step in loc:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else str(step))
    return text


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names of the model found by following ``loc`` from ``model`` (empty if none)."""
    current: Any = model
    for step in loc:
        current = _step(_optional_inner(current), step)
        if current is None:
            return []
    current = _optional_inner(current)
    return list(current.model_fields) if isinstance(current, type) and issubclass(current, BaseModel) else []


def _step(annotation: Any, step: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        field = annotation.model_fields.get(str(step))
        return field.annotation if field is not None else None
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (list, tuple, set) and args:
        return args[0]
    if typing.get_origin(annotation) is dict and len(args) == 2:
        return args[1]
    return None


def _optional_inner(annotation: Any) -> Any:
    """``X`` for ``X | None``; anything else unchanged."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(inner) == 1:
            return inner[0]
    return annotation
