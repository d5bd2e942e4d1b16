"""Load the user's handlers for a local run, the way the stack would, from the project.

``SW_HANDLER_MODULE`` names a module (``functions.handlers`` by default; ``handlers`` in
template.yaml, where ``functions/`` is the code root), a package directory or a ``.py``
file. Relative paths and dotted names are looked for in the working directory first,
where the user typed them (``my_handlers`` is ``./my_handlers.py``, without needing
``PYTHONPATH=.``), then in the project (``<root>``, ``<root>/functions``), since
``functions/`` is not an installed package, and a dotted name last as an installed module.

Imports then resolve as in Lambda, where the code root is on the path: the project's
``functions/`` and the directory of the handler module (of a package: the directory
holding it) join ``sys.path``, so ``import util`` beside a handler works here too. In a
handler package every module is loaded (:func:`serverless_worker.registry.load_handlers`).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from ..errors import ConfigurationError
from ..registry import HandlerRegistry, load_handlers

__all__ = ["DEMO_HANDLER_MODULE", "DEMO_MARKER", "code_directories", "demo_handler_names", "load_local_handlers",
           "project_handler_module", "resolve_handler_module"]

# The built-in demo's handlers: this repository's examples (functions/handlers/examples.py),
# which mark their module with ``DEMO_MARKER = True`` so that they never run against a
# user's server unasked.
DEMO_HANDLER_MODULE = "functions.handlers"
DEMO_MARKER = "__serverless_worker_demo__"
_SETTING = "SW_HANDLER_MODULE"


def _is_path(text: str) -> bool:
    return text.endswith(".py") or "/" in text or "\\" in text


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _module_file(base: Path, parts: list[str]) -> Path | None:
    """``base/a/b/__init__.py``'s package or ``base/a/b.py`` for the dotted name ``a.b``, if either exists."""
    package, module = base.joinpath(*parts), base.joinpath(*parts[:-1], parts[-1] + ".py")
    if (package / "__init__.py").is_file():
        return package
    return module if module.is_file() else None


def resolve_handler_module(name: str, root: Path, cwd: Path | None = None) -> str:
    """A path (file or package directory) or an importable dotted name for ``name``.

    The working directory (``cwd``, by default the process's) comes before the project root.
    """
    here = cwd if cwd is not None else Path.cwd()
    if _is_path(name):
        path = Path(name)
        if path.is_absolute():
            return str(path)
        for base in (here, root):
            if (base / path).exists():
                return str(base / path)
        raise ConfigurationError(f"SW_HANDLER_MODULE: no file or package {name!r} in {here} "
                                 f"(nor under the project root {root})")
    parts = name.split(".")
    for base in (here, root, root / "functions"):
        found = _module_file(base, parts)
        if found is not None:
            return str(found)
    if _importable(name):
        return name
    raise ConfigurationError(f"SW_HANDLER_MODULE: {name!r} is neither a module nor a file or package "
                             f"in {here} or under {root}")


def code_directories(resolved: str, root: Path) -> list[Path]:
    """What Lambda would have on the path for this handler module: the code root
    (``<root>/functions``, the template's ``CodeUri``) and the module's own directory."""
    found = [(root / "functions").resolve()] if (root / "functions").is_dir() else []
    if _is_path(resolved) and (here := Path(resolved).resolve().parent) not in found:
        found.append(here)
    return found


def project_handler_module(start: Path | None = None) -> tuple[str, Path] | None:
    """The handler module the project of the working directory (or ``start``) names in its
    ``template.yaml`` (``SW_HANDLER_MODULE`` in the functions' environment, a ``!Ref`` read
    as its parameter's default), with that file; ``None`` outside a project or when the
    template names none. The same module the deployed stack loads."""
    from .project import TEMPLATE_NAME, project_here
    from .template import environment_sources, load_template, param_default

    root = project_here(start)
    if root is None:
        return None
    path = root / TEMPLATE_NAME
    template = load_template(path)
    if _SETTING not in environment_sources(template):
        return None
    globals_ = template.get("Globals", {}).get("Function", {}).get("Environment", {}).get("Variables", {})
    executor = template.get("Resources", {}).get("ExecutorFunction", {}).get("Properties", {})
    value = executor.get("Environment", {}).get("Variables", {}).get(_SETTING, globals_.get(_SETTING))
    module = param_default(template, value)
    if not isinstance(module, str) or not module.strip():
        return None
    return module.strip(), path


def demo_handler_names(registry: HandlerRegistry, names: list[str]) -> list[str]:
    """Those of ``names`` that are the built-in demo's handlers (their module carries
    :data:`DEMO_MARKER`)."""
    found = []
    for name in names:
        module = sys.modules.get(getattr(registry.get(name).fn, "__module__", "") or "")
        if module is not None and getattr(module, DEMO_MARKER, False) is True:
            found.append(name)
    return found


def load_local_handlers(module: str, root: Path, wanted: list[str]) -> HandlerRegistry:
    """A registry with the handlers ``module`` declares; every name in ``wanted`` must be among them."""
    registry = HandlerRegistry()
    resolved = resolve_handler_module(module, root)
    for directory in code_directories(resolved, root):
        if str(directory) not in sys.path:
            sys.path.append(str(directory))
    load_handlers(resolved, registry)
    if not len(registry):
        raise ConfigurationError(f"SW_HANDLER_MODULE: {module!r} registers no @handler functions")
    missing = [name for name in wanted if name not in registry]
    if missing:
        raise ConfigurationError(f"SW_HANDLERS: no handler registered as {', '.join(missing)} in "
                                 f"{module!r} (registered: {', '.join(registry.names())})")
    return registry
