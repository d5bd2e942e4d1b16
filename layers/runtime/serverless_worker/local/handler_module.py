"""Load the user's handlers for a local run, the way the stack would, from the project.

``SW_HANDLER_MODULE`` names a module (``functions.handlers`` by default; ``handlers`` in
template.yaml, where ``functions/`` is the code root), a package directory or a ``.py``
file. A dotted name is looked for in the project first (``<root>/functions/handlers``),
since ``functions/`` is not an installed package, then imported as a module.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..errors import ConfigurationError
from ..registry import HandlerRegistry, load_handlers

__all__ = ["load_local_handlers", "resolve_handler_module"]


def _is_path(text: str) -> bool:
    return text.endswith(".py") or "/" in text or "\\" in text


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def resolve_handler_module(name: str, root: Path) -> str:
    """A path (file or package directory) or an importable dotted name for ``name``."""
    if _is_path(name):
        path = Path(name)
        return str(path if path.is_absolute() or path.exists() else root / path)
    parts = name.split(".")
    for base in (root, root / "functions"):
        package, module = base.joinpath(*parts), base.joinpath(*parts[:-1], parts[-1] + ".py")
        if (package / "__init__.py").is_file():
            return str(package)
        if module.is_file():
            return str(module)
    if _importable(name):
        return name
    raise ConfigurationError(f"SW_HANDLER_MODULE: {name!r} is neither a module nor a file or package "
                             f"under {root}")


def load_local_handlers(module: str, root: Path, wanted: list[str]) -> HandlerRegistry:
    """A registry with the handlers ``module`` declares; every name in ``wanted`` must be among them."""
    registry = HandlerRegistry()
    load_handlers(resolve_handler_module(module, root), registry)
    if not len(registry):
        raise ConfigurationError(f"SW_HANDLER_MODULE: {module!r} registers no @handler functions")
    missing = [name for name in wanted if name not in registry]
    if missing:
        raise ConfigurationError(f"SW_HANDLERS: no handler registered as {', '.join(missing)} in "
                                 f"{module!r} (registered: {', '.join(registry.names())})")
    return registry
