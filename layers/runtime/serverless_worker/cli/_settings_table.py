"""The settings table, generated from the ``Settings`` model and template.yaml, so the
copy in docs/settings.md is regenerated rather than maintained (``serverless-worker config --markdown``).

Each row: the setting, its environment variable, its flag on the local command, the
template parameter (or resource) the stack feeds it from, its default (and the local
command's own default where it differs), and the field's description.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic_core import PydanticUndefined

from ..errors import ConfigurationError
from ..local.defaults import DEMO_DEFAULTS, LOCAL_DEFAULTS
from ..local.settings import LocalSettings
from ._flags import LAMBDA_ONLY, NO_FLAG, env_name, flag_names

__all__ = ["SettingRow", "settings_rows", "to_markdown", "to_text"]


@dataclass(frozen=True)
class SettingRow:
    name: str
    env: str
    flags: str
    template: str
    default: str
    local_default: str
    description: str


def _default(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    if value in ([], {}):
        return "empty"
    return f"`{str(value).lower() if isinstance(value, bool) else value}`"


def _template_column(source: Any, parameters: dict[str, Any], model_default: str) -> str:
    """The parameters (with the stack's default where it is not the model's) or resources."""
    if source is None:
        return "-"
    parts = [f"`{p}`{_stack_default(parameters.get(p, {}), model_default)}" for p in source.parameters]
    parts += [f"`{r}` (resource)" for r in source.resources]
    if not parts and source.literal is not None:
        parts.append(f"fixed `{source.literal}`")
    return ", ".join(parts) or "-"


def _stack_default(parameter: dict[str, Any], model_default: str) -> str:
    if "Default" not in parameter:
        return "" if model_default == "required" else " (required by the stack)"
    default = parameter["Default"]
    if default in ("", [], {}, "{}", "[]"):
        return "" if model_default in ("empty", "unset") else " (stack default: empty)"
    shown = f"`{default}`"
    return "" if shown == model_default else f" (stack default {shown})"


def _flag_column(name: str) -> str:
    if name in NO_FLAG:
        return "never a flag: `--api-key-env NAME` reads it from NAME"
    if name in LAMBDA_ONLY:
        return "- (set by the stack)"
    return ", ".join(f"`{flag}`" for flag in flag_names(name))


def _local_default(name: str) -> str:
    parts = []
    if name in LOCAL_DEFAULTS:
        parts.append(f"`{LOCAL_DEFAULTS[name]}`")
    if name in DEMO_DEFAULTS:
        demo = DEMO_DEFAULTS[name]
        parts.append(f"`{demo}` (built-in demo)" if demo is not None else "unset (built-in demo)")
    if name == "base_url":
        parts.append("the built-in sandbox")
    if name == "api_key":
        parts.append("a fresh key for the built-in sandbox")
    return ", ".join(parts)


def settings_rows(template: Path | None = None) -> list[SettingRow]:
    """One row per ``Settings`` field, in the model's order."""
    sources: dict[str, Any] | None
    parameters: dict[str, Any] = {}
    try:
        from ..local.template import environment_sources, load_template  # PyYAML: the local extra

        loaded = load_template(template)
        sources = environment_sources(loaded)
        parameters = loaded.get("Parameters", {})
    except (ConfigurationError, ImportError):
        sources = None  # no template.yaml here (or no PyYAML): the column says so
    rows = []
    for name, field in LocalSettings.model_fields.items():
        env = env_name(name)
        default = _default(field)
        column = (_template_column(sources.get(env), parameters, default) if sources is not None
                  else "(no template.yaml found)")
        rows.append(SettingRow(name=name, env=env, flags=_flag_column(name), template=column,
                               default=default, local_default=_local_default(name),
                               description=field.description or ""))
    return rows


def to_markdown(rows: list[SettingRow]) -> str:
    header = ("| setting | environment variable | local flag | template parameter | default "
              "| local default | description |")
    lines = [header, "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        cells = [f"`{row.name}`", f"`{row.env}`", row.flags, row.template, row.default, row.local_default,
                 row.description]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)


def to_text(rows: list[SettingRow], width: int = 80) -> str:
    """One block per setting, readable at ``width`` columns (a terminal, not a wide table).

    The variable and setting name head each block; defaults, flag and template parameter
    follow as labelled lines, then the description, each wrapped to ``width``.
    """
    indent = "    "
    blocks = []
    for row in rows:
        lines = [f"{row.env}  ({row.name})"]
        labelled = [("default", row.default), ("local default", row.local_default), ("flag", row.flags),
                    ("template", row.template)]
        for label, value in labelled:
            if value:
                lines += textwrap.wrap(f"{label}: {value.replace('`', '')}", width, initial_indent=indent,
                                       subsequent_indent=indent * 2, break_on_hyphens=False)
        lines += textwrap.wrap(row.description, width, initial_indent=indent, subsequent_indent=indent,
                               break_on_hyphens=False)
        blocks.append("\n".join(lines))
    title = "serverless-worker settings (flag > environment > local default > default)"
    return "\n\n".join([title, *blocks])
