"""Check that a ``sam build`` output ships bytecode Lambda can use as it is.

Lambda's /opt and /var/task are read-only, so a module without a usable .pyc is compiled
again on every cold start (layers/runtime/Makefile says what that cost). Every ``.py`` under
each directory must have a ``__pycache__/<name>.cpython-311.pyc`` that is hash-based and
unchecked (a zip keeps mtimes only to 2 s, so timestamped bytecode can look stale) and whose
hash matches the source beside it.

Usage: ``python3.11 scripts/check_bytecode.py .aws-sam/build [...]``; exit status 1 lists the
first offenders.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

UNCHECKED_HASH = 0b01  # PEP 552 flags: bit 0 hash-based, bit 1 check_source (off)


def problem(source: Path) -> str | None:
    """Why ``source`` has no bytecode Lambda would use, or None if it has."""
    pyc = Path(importlib.util.cache_from_source(str(source)))
    if not pyc.is_file():
        return "no .pyc"
    header = pyc.read_bytes()[:16]
    if header[:4] != importlib.util.MAGIC_NUMBER:
        return "bytecode of another Python version"
    flags = int.from_bytes(header[4:8], "little")
    if flags != UNCHECKED_HASH:
        return "timestamped .pyc" if flags == 0 else "checked-hash .pyc (reads every source)"
    if header[8:16] != importlib.util.source_hash(source.read_bytes()):
        return ".pyc of another version of the source"
    return None


def check(roots: list[Path]) -> tuple[int, list[str]]:
    """(sources checked, "path: problem" for each bad one)."""
    sources = sorted(p for root in roots for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    bad = [f"{p}: {why}" for p in sources if (why := problem(p))]
    return len(sources), bad


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if sys.version_info[:2] != (3, 11):
        print("check_bytecode: run it with python3.11, the Lambda runtime's version", file=sys.stderr)
        return 2
    roots = [Path(a) for a in args]
    if not roots or not all(r.is_dir() for r in roots):
        print(f"usage: check_bytecode.py DIR [DIR ...] (got {args})", file=sys.stderr)
        return 2
    count, bad = check(roots)
    if count == 0:
        print(f"check_bytecode: no .py files under {args}", file=sys.stderr)
        return 1
    if bad:
        print(f"check_bytecode: {len(bad)} of {count} modules would be compiled on every cold start:",
              *bad[:20], sep="\n  ", file=sys.stderr)
        return 1
    print(f"check_bytecode: {count} modules, each with unchecked-hash bytecode")
    return 0


if __name__ == "__main__":
    sys.exit(main())
