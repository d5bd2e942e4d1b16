"""Write docs/ledger.md's transition table from the code's one table (``state/rules.py``).

    .venv/bin/python scripts/ledger_doc.py          # rewrite the marked section
    .venv/bin/python scripts/ledger_doc.py --check  # exit 1 when the doc is out of date

The section lies between ``<!-- transitions:begin -->`` and ``<!-- transitions:end -->``;
everything else in the doc is prose and stays as written. tests/unit/test_ledger_doc.py
fails when the doc and the table disagree.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from serverless_worker.state.conditions import All, AnyOf, Compare, Condition, Exists, Missing, OneOf, Param, StartsWith
from serverless_worker.state.rules import CASE_RECORD_NEW, TRANSITIONS

__all__ = ["BEGIN", "DOC", "END", "describe", "main", "rewrite", "transitions_markdown"]

DOC = Path(__file__).resolve().parent.parent / "docs" / "ledger.md"
BEGIN, END = "<!-- transitions:begin -->", "<!-- transitions:end -->"


def _operand(value: Any) -> str:
    if isinstance(value, Param):
        return f"the call's `{value.name}`"
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"`{getattr(value, 'value', value)}`"


def describe(condition: Condition, *, nested: bool = False) -> str:
    """A condition in words."""
    match condition:
        case Compare(attribute, op, value):
            return f"`{attribute}` {op} {_operand(value)}"
        case OneOf(attribute, (value,)):
            return f"`{attribute}` = {_operand(value)}"
        case OneOf(attribute, values):
            return f"`{attribute}` in {', '.join(_operand(v) for v in values)}"
        case Exists(attribute):
            return f"`{attribute}` set"
        case Missing(attribute):
            return f"no `{attribute}`"
        case StartsWith(attribute, prefix):
            return f"`{attribute}` starts with {_operand(prefix)}"
        case All(parts) | AnyOf(parts):
            text = (" and " if isinstance(condition, All) else " or ").join(describe(p, nested=True) for p in parts)
            return f"({text})" if nested else text
    raise TypeError(f"not a condition: {condition!r}")


def transitions_markdown() -> str:
    """The code's table (``state/rules.py``) as docs/ledger.md shows it."""
    lines = ["| write | case | condition on the stored item | to | refused |", "| --- | --- | --- | --- | --- |"]
    for t in TRANSITIONS.values():
        condition = describe(t.condition)
        if t.write == "record_new":
            condition = "no item"
        elif t.creates:
            condition = ("no item, or " if t.case == CASE_RECORD_NEW else "also: ") + condition
        to = f"`{t.to.value}`" + (" (final)" if t.to.is_final else "") if t.to is not None else "unchanged"
        lines.append(f"| `{t.write}` | {t.case} | {condition} | {to} | {t.refused} |")
    return "\n".join(lines) + "\n"


def rewrite(text: str, table: str | None = None) -> str:
    """``text`` with its marked section replaced by ``table`` (by default the code's)."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{DOC.name} has no {BEGIN} ... {END} section")
    generated = table if table is not None else transitions_markdown()
    return f"{text[:start]}{BEGIN}\n{generated}{text[end:]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check; exit 1 when the doc is out of date")
    args = parser.parse_args(argv)
    text = DOC.read_text(encoding="utf-8")
    wanted = rewrite(text)
    if wanted == text:
        return 0
    if args.check:
        print(f"{DOC} is out of date: run scripts/ledger_doc.py", file=sys.stderr)
        return 1
    DOC.write_text(wanted, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
