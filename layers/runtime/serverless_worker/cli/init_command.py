"""``serverless-worker init DIR``: a project of your own that uses the runtime by name.

Why: this repository is the runtime's own workspace (its template builds the layer from
the sources); a user's project needs only their handlers, their tests and a stack that
installs ``serverless-worker`` from a requirements file into a layer. The files come
from ``cli/project/`` (package data, so ``init`` works from an installed wheel): a
``.tmpl`` suffix is dropped (it keeps the project's Python out of this package's own
linting), ``gitignore`` becomes ``.gitignore``, and ``@VERSION@`` / ``@NAME@`` become
this package's version and the directory's name. The generated tests pass at once.

Until the package is on PyPI the project carries the installed version's wheel in
``vendor/`` (:mod:`.vendor_wheel`), and both requirements files find it there through
``--find-links`` (pip reads that path relative to the requirements file, so it holds for
``pip install -r`` and for ``sam build``). ``--from-pypi`` leaves both out; ``--wheel``
copies a wheel the user built.

Example::

    serverless-worker init my-worker && cd my-worker && python -m pip install -r requirements.txt
"""

from __future__ import annotations

import argparse
import re
import shutil
import tempfile
from collections.abc import Callable
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

from ..errors import ConfigurationError

__all__ = ["register", "run", "write_project"]

_RENAMES = {"gitignore": ".gitignore"}
# ``@FIND_LINKS path@`` on a line of its own: where pip finds the vendored wheel, from that file.
_FIND_LINKS = re.compile(r"^@FIND_LINKS (\S+)@\n", re.MULTILINE)
VENDOR = "vendor"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``init`` subcommand."""
    parser = subparsers.add_parser(
        "init", help="write a new project: template.yaml, an example handler, its tests, sample events",
        description="Write a project of your own into DIR (new or empty): a SAM template that installs "
                    "serverless-worker into a layer, functions/handlers.py with an example handler, tests "
                    "of it with serverless_worker.testing, events/, a README, and vendor/ with this "
                    "version's serverless-worker wheel, which both requirements files install until the "
                    "package is on PyPI.")
    parser.add_argument("directory", metavar="DIR", help="where to write the project (must be new or empty)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--from-pypi", action="store_true",
                        help="install serverless-worker from PyPI by version (once it is published) instead of "
                             "from the wheel init copies into vendor/")
    source.add_argument("--wheel", metavar="PATH", type=Path,
                        help="the serverless-worker wheel to copy into vendor/ (default: the installed version's, "
                             "packed from the installed files, or built from the source tree of an editable install)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    target = Path(args.directory)
    written = write_project(target, from_pypi=args.from_pypi, wheel=args.wheel, say=print)
    print(f"wrote {len(written)} files to {target}; next: cd {target} && python -m pip install -r requirements.txt "
          "&& serverless-worker local (see its README.md)")
    return 0


def write_project(target: Path, *, from_pypi: bool = False, wheel: Path | None = None,
                  say: Callable[[str], object] = lambda _: None) -> list[Path]:
    """Write the project into ``target`` and return the files written; ConfigurationError
    (one line) when ``target`` is a file or a directory that is not empty, or the wheel
    cannot be had (nothing is written then)."""
    from .. import __version__

    if target.exists() and not target.is_dir():
        raise ConfigurationError(f"init {target}: is a file; give a new or empty directory")
    if target.is_dir() and any(target.iterdir()):
        raise ConfigurationError(f"init {target}: the directory is not empty; give a new or empty one "
                                 "(init never overwrites files)")
    with tempfile.TemporaryDirectory(prefix="sw-init-") as scratch:
        vendored = None if from_pypi else _wheel_for(Path(scratch), __version__, wheel, say)
        name = target.resolve().name
        written: list[Path] = []
        for source, relative in _walk(files(__package__) / "project", Path()):
            destination = target / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            text = source.read_text(encoding="utf-8").replace("@VERSION@", __version__).replace("@NAME@", name)
            text = _FIND_LINKS.sub("" if vendored is None else r"--find-links \1\n", text)
            destination.write_text(text, encoding="utf-8")
            written.append(destination)
        if vendored is not None:
            (target / VENDOR).mkdir()
            written.append(Path(shutil.copy(vendored, target / VENDOR / vendored.name)))
    return written


def _wheel_for(scratch: Path, version: str, given: Path | None, say: Callable[[str], object]) -> Path:
    """The wheel for vendor/: the one given (it must be this version's), else the installed one."""
    from .vendor_wheel import vendor_wheel, wheel_name

    if given is None:
        say("init: getting the serverless-worker wheel for vendor/ (not on PyPI yet; --from-pypi once it is)")
        made, how = vendor_wheel(scratch)
        say(f"init: {made.name}: {how}")
        return made
    if not given.is_file():
        raise ConfigurationError(f"init --wheel {given}: no such file")
    if given.name != wheel_name(version):
        raise ConfigurationError(f"init --wheel {given}: expected {wheel_name(version)} (the installed version, "
                                 "which the project's requirements pin)")
    return given


def _walk(node: Traversable, relative: Path) -> list[tuple[Traversable, Path]]:
    """Every file under ``node`` with its path in the project, in a stable order."""
    found: list[tuple[Traversable, Path]] = []
    for child in sorted(node.iterdir(), key=lambda c: c.name):
        if child.name == "__pycache__":
            continue
        if child.is_dir():
            found += _walk(child, relative / child.name)
        else:
            name = _RENAMES.get(child.name, child.name.removesuffix(".tmpl"))
            found.append((child, relative / name))
    return found
