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

from serverless_worker.state.rules import transitions_markdown

__all__ = ["BEGIN", "DOC", "END", "main", "rewrite"]

DOC = Path(__file__).resolve().parent.parent / "docs" / "ledger.md"
BEGIN, END = "<!-- transitions:begin -->", "<!-- transitions:end -->"


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
