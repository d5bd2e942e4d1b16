"""The Lambda layer holds what Lambda runs: what it leaves out, nothing it ships imports.

``layers/runtime/Makefile`` leaves the developer tooling out of the layer (``DEV_TOOLING``).
That is safe only while no module the layer ships, and no function's ``app.py``, imports a
left-out module, lazily inside a function included. Two ways to import one stay allowed:
under ``if TYPE_CHECKING:`` (never run), and inside a ``try`` whose ``except ImportError``
turns the absence into a clear error (the claim queue's socket transport, the SQLite
backend's lazy export). The build itself is checked in test_build_bytecode.py.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from serverless_worker.errors import ConfigurationError
from serverless_worker.protocols.claimqueue import ClaimQueueClient
from support.layer import LEFT_OUT_OF_LAYER as LEFT_OUT
from support.template import TEMPLATE_PATH

ROOT = TEMPLATE_PATH.parent
LAYER = ROOT / "layers" / "runtime"
PACKAGE = LAYER / "serverless_worker"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(LAYER).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _left_out(module: str) -> bool:
    """True for a module under one of the left-out paths (``serverless_worker.local.worker``)."""
    parts = module.split(".")
    if parts[0] != "serverless_worker":
        return False
    for entry in LEFT_OUT:
        left = entry.removesuffix(".py").split("/")
        if parts[1:1 + len(left)] == left:
            return True
    return False


def _guarded(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """An import under ``if TYPE_CHECKING:`` or in a ``try`` that catches its absence."""
    child, parent = node, parents.get(node)
    while parent is not None:
        if isinstance(parent, ast.If) and child in parent.body and ast.unparse(parent.test).endswith("TYPE_CHECKING"):
            return True
        if isinstance(parent, ast.Try) and child in parent.body and any(
                h.type is not None and {n.id for n in ast.walk(h.type) if isinstance(n, ast.Name)}
                & {"ImportError", "ModuleNotFoundError"} for h in parent.handlers):
            return True
        child, parent = parent, parents.get(parent)
    return False


def _unguarded_imports(path: Path, package: str) -> Iterator[str]:
    """The absolute name of every module ``path`` imports where it runs (``from a import b``
    names both ``a`` and ``a.b``, since ``b`` may be a submodule)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom) or _guarded(node, parents):
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
            continue
        base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
        module = ".".join([*base, *([node.module] if node.module else [])])
        yield module
        yield from (f"{module}.{alias.name}" for alias in node.names)


def _shipped() -> Iterator[tuple[Path, str]]:
    """Each module the layer ships, with the package its relative imports start from, and
    each function's handler module."""
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        if not _left_out(name):
            yield path, name if path.name == "__init__.py" else name.rpartition(".")[0]
    for path in sorted((ROOT / "functions").glob("*/*.py")):
        yield path, path.parent.name


def test_the_makefile_leaves_out_exactly_the_developer_tooling() -> None:
    makefile = (LAYER / "Makefile").read_text().replace("\\\n", " ")
    (line,) = re.findall(r"^DEV_TOOLING := (.*)$", makefile, flags=re.MULTILINE)
    assert set(line.split()) == LEFT_OUT
    assert all((PACKAGE / entry).exists() for entry in LEFT_OUT)


def test_nothing_the_layer_ships_imports_what_it_leaves_out() -> None:
    shipped = list(_shipped())
    assert any(path.name == "entry.py" for path, _ in shipped) and len(shipped) > 40
    found = {f"{path.relative_to(ROOT)} imports {name}"
             for path, package in shipped for name in _unguarded_imports(path, package) if _left_out(name)}
    assert found == set()


def test_the_check_sees_a_lazy_import_of_a_left_out_module(tmp_path: Path) -> None:
    module = tmp_path / "lazy.py"
    module.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .testing import X\n"
                      "def f():\n    from . import testing\n    from .local.worker import run\n"
                      "def g():\n    try:\n        from .state import sqlite_store\n"
                      "    except ImportError:\n        raise RuntimeError('absent')\n")
    found = {name for name in _unguarded_imports(module, "serverless_worker") if _left_out(name)}
    assert found == {"serverless_worker.testing", "serverless_worker.local.worker",
                     "serverless_worker.local.worker.run"}


def test_the_socket_transport_without_its_module_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # as in the Lambda layer: neither the socket module nor websockets can be imported
    import serverless_worker.protocols as protocols

    monkeypatch.setitem(sys.modules, "serverless_worker.protocols.claimqueue_socket", None)
    monkeypatch.setitem(sys.modules, "websockets", None)
    monkeypatch.delattr(protocols, "claimqueue_socket", raising=False)
    with pytest.raises(ConfigurationError, match="socket transport needs the websockets package"):
        ClaimQueueClient("http://127.0.0.1:1", "token", transport="socket")
    with ClaimQueueClient("http://127.0.0.1:1", "token", transport="http") as client:
        assert client.transport == "http"
