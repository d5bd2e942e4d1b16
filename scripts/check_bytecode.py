"""Check that a ``sam build`` output is what Lambda's python3.13 runs as it is.

1. Bytecode. Lambda's /opt and /var/task are read-only, so a module without a usable .pyc
   is compiled again on every cold start (layers/runtime/Makefile says what that cost).
   Every ``.py`` under each directory must have a ``__pycache__/<name>.cpython-313.pyc``
   that is hash-based and unchecked (a zip keeps mtimes only to 2 s, so timestamped
   bytecode can look stale) and whose hash matches the source beside it.
2. Platform, with ``--architecture x86_64|arm64``: every installed wheel's tags
   (``*.dist-info/WHEEL``) are pure or for that CPU and CPython 3.13, and every extension
   module (``.so``) is an ELF file for that CPU. A layer built for the other CPU fails at
   its first import in Lambda, so this catches it at build time.

Usage: ``python3.13 scripts/check_bytecode.py [--architecture arm64] .aws-sam/build [...]``;
exit status 1 lists the first offenders.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

LAMBDA_PYTHON = (3, 13)
UNCHECKED_HASH = 0b01  # PEP 552 flags: bit 0 hash-based, bit 1 check_source (off)
# ELF e_machine (offset 18, little-endian) and the wheel platform suffix of each CPU.
ELF_MACHINE = {"x86_64": 0x3E, "arm64": 0xB7}
WHEEL_ARCH = {"x86_64": "x86_64", "arm64": "aarch64"}
PY_TAGS = {"py3", "py2.py3", f"cp{LAMBDA_PYTHON[0]}{LAMBDA_PYTHON[1]}"}
ABI_TAGS = {"none", "abi3", f"cp{LAMBDA_PYTHON[0]}{LAMBDA_PYTHON[1]}"}


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


def wheel_tag_problem(tag: str, architecture: str) -> str | None:
    """Why a wheel tag (``cp313-cp313-manylinux_2_17_aarch64``) cannot run on Lambda's
    python3.13 on ``architecture``, or None if it can."""
    try:
        python, abi, platform = tag.split("-")
    except ValueError:
        return f"unreadable tag {tag!r}"
    if python not in PY_TAGS and not any(p in PY_TAGS for p in python.split(".")):
        return f"{tag}: built for another Python"
    if abi not in ABI_TAGS:
        return f"{tag}: built for another Python ABI"
    if platform == "any":
        return None
    if not platform.startswith(("manylinux", "linux")) or not platform.endswith(WHEEL_ARCH[architecture]):
        return f"{tag}: not for Linux on {architecture}"
    return None


def check_platform(roots: list[Path], architecture: str) -> tuple[int, list[str]]:
    """(wheels and extension modules checked, "path: problem" for each that cannot run)."""
    bad: list[str] = []
    wheels = sorted(p for root in roots for p in root.rglob("*.dist-info/WHEEL"))
    for wheel in wheels:
        tags = [line.split(":", 1)[1].strip() for line in wheel.read_text().splitlines()
                if line.startswith("Tag:")]
        problems = [wheel_tag_problem(tag, architecture) for tag in tags] or ["no Tag: line"]
        if all(problems):  # one runnable tag is enough
            bad.append(f"{wheel.parent.name}: {problems[0]}")
    extensions = sorted(p for root in roots for p in root.rglob("*.so"))
    for so in extensions:
        header = so.read_bytes()[:20]
        if header[:4] != b"\x7fELF":
            bad.append(f"{so}: not an ELF file")
        elif int.from_bytes(header[18:20], "little") != ELF_MACHINE[architecture]:
            bad.append(f"{so}: machine code for another CPU than {architecture}")
    return len(wheels) + len(extensions), bad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="check_bytecode.py", description=__doc__.splitlines()[0])
    parser.add_argument("--architecture", choices=sorted(ELF_MACHINE),
                        help="also check that every wheel and extension module is for this CPU")
    parser.add_argument("roots", nargs="*", type=Path)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if sys.version_info[:2] != LAMBDA_PYTHON:
        print(f"check_bytecode: run it with python{LAMBDA_PYTHON[0]}.{LAMBDA_PYTHON[1]}, "
              "the Lambda runtime's version", file=sys.stderr)
        return 2
    if not args.roots or not all(r.is_dir() for r in args.roots):
        print(f"usage: check_bytecode.py [--architecture ARCH] DIR [DIR ...] (got {args.roots})", file=sys.stderr)
        return 2
    count, bad = check(args.roots)
    if count == 0:
        print(f"check_bytecode: no .py files under {[str(r) for r in args.roots]}", file=sys.stderr)
        return 1
    if bad:
        print(f"check_bytecode: {len(bad)} of {count} modules would be compiled on every cold start:",
              *bad[:20], sep="\n  ", file=sys.stderr)
        return 1
    print(f"check_bytecode: {count} modules, each with unchecked-hash bytecode")
    if args.architecture:
        checked, wrong = check_platform(args.roots, args.architecture)
        if wrong:
            print(f"check_bytecode: {len(wrong)} of {checked} wheels and extension modules cannot run on "
                  f"{args.architecture}:", *wrong[:20], sep="\n  ", file=sys.stderr)
            return 1
        print(f"check_bytecode: {checked} wheels and extension modules, each for {args.architecture}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
