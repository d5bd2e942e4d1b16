"""Find the project the local runner works from: the directory holding ``template.yaml``.

The local runner builds its embedded AWS from the stack's own files (the state table
definition, the state machine's ASL, the default handler package), so it needs the
project directory. It is looked for upwards from the working directory first (a user's
own project), then upwards from this package (an editable install of this repository).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from ..errors import ConfigurationError

__all__ = ["TEMPLATE_NAME", "find_project_root", "project_here"]

TEMPLATE_NAME = "template.yaml"


def _upwards(start: Path) -> Path | None:
    for directory in (start, *start.parents):
        if (directory / TEMPLATE_NAME).is_file() and (directory / "functions").is_dir():
            return directory
    return None


@cache
def _package_root() -> Path | None:
    return _upwards(Path(__file__).resolve().parent)


def project_here(start: Path | None = None) -> Path | None:
    """The project the working directory (or ``start``) is in, upwards, or ``None``: never
    this package's own checkout as a fallback (a user's settings come from their project)."""
    return _upwards((start or Path.cwd()).resolve())


def find_project_root(start: Path | None = None) -> Path:
    """The nearest directory with ``template.yaml`` and ``functions/``; raises ConfigurationError."""
    found = _upwards((start or Path.cwd()).resolve()) or _package_root()
    if found is None:
        raise ConfigurationError(
            f"no {TEMPLATE_NAME} with a functions/ directory found above {start or Path.cwd()}; "
            "run serverless-worker local from the project directory")
    return found
