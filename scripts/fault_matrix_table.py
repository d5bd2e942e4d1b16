"""Render the fault matrix (the JSON lines the reliability suite appends through
``tests/reliability/invariants.py``) as a markdown table, scenario x protocol: what each
fault did to each protocol's jobs, for a release note or a review.

    .venv/bin/pytest tests/reliability -n 2 -p no:cacheprovider
    .venv/bin/python scripts/fault_matrix_table.py [.fault-matrix.jsonl]

Each cell is the observed outcome, plus the re-runs and why the protocol made them
unavoidable. When a cell was recorded more than once (the file is only ever appended
to), the last row wins; scenarios keep the order they were first recorded in.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_PATH", "PROTOCOLS", "cell", "load_rows", "main", "render"]

PROTOCOLS = ("pipelogiq", "priostack", "claimqueue")
DEFAULT_PATH = Path(__file__).resolve().parent.parent / ".fault-matrix.jsonl"


def load_rows(lines: Iterable[str]) -> list[dict[str, Any]]:
    """Parse the JSON lines; a blank line is skipped, a broken one is an error naming its number."""
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as err:
            raise SystemExit(f"line {number} is not JSON: {err}") from None
        if not isinstance(row, dict) or not {"scenario", "protocol", "outcome"} <= row.keys():
            raise SystemExit(f"line {number} lacks scenario, protocol or outcome")
        rows.append(row)
    return rows


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def cell(row: dict[str, Any]) -> str:
    """The outcome, then the re-runs (job -> runs) with their reason, if any."""
    text = str(row["outcome"])
    reruns = row.get("reruns") or {}
    if reruns:
        runs = ", ".join(f"{job} ran {n}x" for job, n in sorted(reruns.items()))
        why = row.get("why_reruns") or "no reason recorded"
        text += f" Re-runs: {runs} ({why})."
    return _escape(text)


def render(rows: list[dict[str, Any]]) -> str:
    """The markdown table: one row per scenario, one column per protocol."""
    protocols = list(PROTOCOLS) + sorted({r["protocol"] for r in rows} - set(PROTOCOLS))
    scenarios: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        scenarios.setdefault(row["scenario"], {})[row["protocol"]] = row  # the last one wins
    lines = ["| scenario | " + " | ".join(protocols) + " |", "| --- |" + " --- |" * len(protocols)]
    for scenario, cells in scenarios.items():
        values = [cell(cells[p]) if p in cells else "not run" for p in protocols]
        lines.append(f"| {_escape(scenario)} | " + " | ".join(values) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", nargs="?", type=Path,
                        default=Path(os.environ.get("SWTEST_FAULT_MATRIX_OUT") or DEFAULT_PATH),
                        help="the JSON lines file (default: $SWTEST_FAULT_MATRIX_OUT or .fault-matrix.jsonl)")
    args = parser.parse_args(argv)
    if not args.path.is_file():
        print(f"{args.path}: no such file; run tests/reliability first", file=sys.stderr)
        return 1
    rows = load_rows(args.path.read_text(encoding="utf-8").splitlines())
    if not rows:
        print(f"{args.path}: no rows", file=sys.stderr)
        return 1
    print(render(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
