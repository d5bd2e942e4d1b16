"""``serverless-worker init DIR``: a project of your own that uses the runtime by name.

Why: this repository is the runtime's own workspace (its template builds the layer from
the sources); a user's project needs only their handlers, their tests and a stack that
installs ``serverless-worker`` from a requirements file into a layer. The files come
from ``cli/project/`` (package data, so ``init`` works from an installed wheel): a
``.tmpl`` suffix is dropped (it keeps the project's Python out of this package's own
linting), ``gitignore`` becomes ``.gitignore``, and ``@VERSION@`` / ``@NAME@`` become
this package's version and the directory's name. The generated tests pass at once.

Example::

    serverless-worker init my-worker && cd my-worker && python -m pytest
"""

from __future__ import annotations

import argparse
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

from ..errors import ConfigurationError

__all__ = ["register", "run", "write_project"]

_RENAMES = {"gitignore": ".gitignore"}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``init`` subcommand."""
    parser = subparsers.add_parser(
        "init", help="write a new project: template.yaml, an example handler, its tests, sample events",
        description="Write a project of your own into DIR (new or empty): a SAM template that installs "
                    "serverless-worker into a layer, functions/handlers.py with an example handler, tests "
                    "of it with serverless_worker.testing, events/ and a README.")
    parser.add_argument("directory", metavar="DIR", help="where to write the project (must be new or empty)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    target = Path(args.directory)
    written = write_project(target)
    print(f"wrote {len(written)} files to {target}; next: cd {target} && python -m pytest "
          "(see its README.md)")
    return 0


def write_project(target: Path) -> list[Path]:
    """Write the project into ``target`` and return the files written; ConfigurationError
    (one line) when ``target`` is a file or a directory that is not empty."""
    from .. import __version__

    if target.exists() and not target.is_dir():
        raise ConfigurationError(f"init {target}: is a file; give a new or empty directory")
    if target.is_dir() and any(target.iterdir()):
        raise ConfigurationError(f"init {target}: the directory is not empty; give a new or empty one "
                                 "(init never overwrites files)")
    name = target.resolve().name
    written: list[Path] = []
    for source, relative in _walk(files(__package__) / "project", Path()):
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        text = source.read_text(encoding="utf-8").replace("@VERSION@", __version__).replace("@NAME@", name)
        destination.write_text(text, encoding="utf-8")
        written.append(destination)
    return written


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
