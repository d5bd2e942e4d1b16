"""The wheel of the installed serverless-worker, for the ``vendor/`` of a project ``init`` writes.

Why: until the package is on PyPI, a project's ``pip install -r requirements.txt`` and
its ``sam build`` can only find ``serverless-worker==X.Y.Z`` in a wheel shipped with the
project. An installed wheel is packed again from its installed files (``RECORD`` lists
them; the dist-info holds the metadata and entry points), so init needs neither network
nor build tools. An editable install (this repository's ``.venv``) has no wheel: it is
built from the source tree with ``pip wheel``, offline (no build isolation, so setuptools
and wheel must be installed, as the dev extra has them), on a copy of the sources so the
tree gets no ``build/``.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from urllib.parse import unquote, urlparse

from ..errors import ConfigurationError

__all__ = ["DISTRIBUTION", "editable_source", "vendor_wheel", "wheel_name"]

DISTRIBUTION = "serverless-worker"
# What an installer adds to a dist-info; a wheel never carries these.
_INSTALLER_FILES = {"INSTALLER", "REQUESTED", "direct_url.json", "RECORD"}


def wheel_name(version: str) -> str:
    return f"serverless_worker-{version}-py3-none-any.whl"


def editable_source(dist: importlib.metadata.Distribution) -> Path | None:
    """The source tree of an editable install (``pip install -e``), else None."""
    text = dist.read_text("direct_url.json")
    if not text:
        return None
    record = json.loads(text)
    if not record.get("dir_info", {}).get("editable"):
        return None
    return Path(unquote(urlparse(record["url"]).path))


def vendor_wheel(directory: Path) -> tuple[Path, str]:
    """Write the installed version's wheel into ``directory``; returns it and how it was made."""
    dist = importlib.metadata.distribution(DISTRIBUTION)
    directory.mkdir(parents=True, exist_ok=True)
    source = editable_source(dist)
    if source is not None:
        return _build(source, dist.version, directory), f"built from the source tree {source} (an editable install)"
    return _repack(dist, directory), "packed from the installed package"


def _repack(dist: importlib.metadata.Distribution, directory: Path) -> Path:
    """The installed files (package and dist-info, without installer records or bytecode) as a wheel."""
    members = sorted(
        (f for f in dist.files or []
         if f.parts and not f.parts[0].startswith("..") and "__pycache__" not in f.parts and f.suffix != ".pyc"
         and not (f.parts[0].endswith(".dist-info") and f.name in _INSTALLER_FILES)),
        key=lambda f: (f.parts[0].endswith(".dist-info"), str(f)))  # the dist-info last, as the format advises
    info = next((f.parts[0] for f in members if f.parts[0].endswith(".dist-info")), None)
    if info is None or not any(f.parts[0] == "serverless_worker" for f in members):
        raise ConfigurationError(f"init: the installed {DISTRIBUTION} lists no files to pack into a wheel; "
                                 "give one with --wheel PATH, or use --from-pypi")
    target = directory / wheel_name(dist.version)
    records = []
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as wheel:
        for member in members:
            data = Path(str(dist.locate_file(member))).read_bytes()
            name = member.as_posix()
            wheel.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            records.append(f"{name},sha256={digest},{len(data)}")
        records.append(f"{info}/RECORD,,")
        wheel.writestr(f"{info}/RECORD", "\n".join(records) + "\n")
    return target


def _build(source: Path, version: str, directory: Path) -> Path:
    """``pip wheel`` of a copy of the project file, README and package from ``source``."""
    import serverless_worker

    package = Path(serverless_worker.__file__).resolve().parent
    command = f"python -m pip wheel --no-deps -w dist {source}"
    hint = (f"; build it with `{command}` and give it to init with --wheel dist/{wheel_name(version)} "
            "(or use --from-pypi once it is on PyPI)")
    try:
        inside = package.relative_to(source.resolve())
    except ValueError:
        raise ConfigurationError(f"init: the editable install's package {package} is not under its source tree "
                                 f"{source}{hint}") from None
    with tempfile.TemporaryDirectory(prefix="sw-wheel-") as scratch:
        copy = Path(scratch) / "src"
        for name in ("pyproject.toml", "README.md"):
            if (source / name).is_file():
                (copy / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(source / name, copy / name)
        shutil.copytree(package, copy / inside, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        built = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", str(copy), "--no-deps", "--no-build-isolation", "--no-index",
             "-q", "-w", str(directory)],
            capture_output=True, text=True, timeout=300, check=False)
    target = directory / wheel_name(version)
    if built.returncode != 0 or not target.is_file():
        reason = (built.stderr.strip().splitlines() or ["no wheel was written"])[-1]
        raise ConfigurationError(f"init: could not build the {DISTRIBUTION} wheel from {source} ({reason}){hint}")
    return target
