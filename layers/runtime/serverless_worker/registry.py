"""The ``@handler`` decorator, the registry it fills, and loading the user's handler module.

The decorator returns the function unchanged, so a handler stays a plain function
(run it in tests through :mod:`serverless_worker.testing`). The input model comes from
the annotation: ``job: Job[Payment]`` validates the payload against ``Payment``.

Example::

    from serverless_worker import BusinessError, Job, handler

    @handler("payment-processor", timeout=30)
    def charge(job: Job[Payment]) -> dict:
        if job.input.amount > 1000:
            raise BusinessError("CARD_DECLINED", "over the limit")
        return {"status": "charged"}
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import inspect
import logging
import math
import pkgutil
import re
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, Never, TypeVar, get_args, get_origin, get_type_hints

from pydantic import BaseModel

from .errors import ConfigurationError, UnknownHandlerError
from .job import Job
from .results import NotJsonSerializableError, to_jsonable

__all__ = [
    "HANDLER_MODES",
    "HANDLER_NAME_RE",
    "SPEC_ATTRIBUTE",
    "HandlerMode",
    "HandlerRegistry",
    "HandlerSpec",
    "default_registry",
    "get_handler",
    "handler",
    "load_handlers",
]

F = TypeVar("F", bound=Callable[..., Any])

_log = logging.getLogger(__name__)

SPEC_ATTRIBUTE = "__serverless_worker_handler__"
# Safe as a Pipelogiq handler name, a Priostack job type and a claim-queue URL segment.
HANDLER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}$")

# short: one call within one Lambda invocation. slices: through Step Functions, may return
# Continue. callback: through Step Functions, finished later through job.callback_token.
HandlerMode = Literal["short", "slices", "callback"]
HANDLER_MODES: tuple[HandlerMode, ...] = get_args(HandlerMode)
# The options that ``mode=`` replaced: a clear TypeError instead of "unexpected keyword".
_REMOVED_OPTIONS = {"long_running": 'mode="slices"', "callback": 'mode="callback"'}


@dataclass(frozen=True)
class HandlerSpec:
    """One registered handler and the options it was declared with."""

    name: str
    fn: Callable[..., Any]
    input_model: type[BaseModel] | None = None
    timeout: float | None = None
    mode: HandlerMode = "short"
    criteria: Mapping[str, Any] | None = field(default=None, hash=False)
    run_past_lease: bool = False  # opt-in: where late results count, the lease does not bound it

    @property
    def long_running(self) -> bool:
        """Runs through Step Functions (``slices`` or ``callback``), not in one invocation."""
        return self.mode != "short"

    @property
    def callback(self) -> bool:
        """Finished later through the Step Functions task token (``mode="callback"``)."""
        return self.mode == "callback"

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)


def _build_spec(name: str, fn: Callable[..., Any], *, input: type[BaseModel] | None, timeout: float | None,
                mode: HandlerMode, criteria: Mapping[str, Any] | None,
                run_past_lease: bool = False) -> HandlerSpec:
    """Check the declaration once, at import time, so mistakes surface at deploy, not per job."""
    where = f"handler {name!r}"
    if not isinstance(name, str) or not HANDLER_NAME_RE.match(name):
        raise ConfigurationError(
            f"handler name {name!r} is invalid: use 1-128 letters, digits, '.', '_', ':' or '-', "
            "starting with a letter or digit")
    if not callable(fn):
        raise ConfigurationError(f"{where}: the decorated object is not callable")
    try:
        inspect.signature(fn).bind(object())
    except TypeError as err:
        raise ConfigurationError(f"{where}: the function must accept exactly one argument, the job") from err
    except ValueError:  # builtins without a signature: accept and let the run tell
        pass
    if input is not None and not (isinstance(input, type) and issubclass(input, BaseModel)):
        raise ConfigurationError(f"{where}: input= must be a pydantic BaseModel subclass")
    input = _input_model(where, fn, input)
    if mode not in HANDLER_MODES:
        raise ConfigurationError(f"{where}: mode= must be one of {', '.join(map(repr, HANDLER_MODES))}, "
                                 f"not {mode!r}")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) \
                or not math.isfinite(timeout) or timeout <= 0:
            raise ConfigurationError(f"{where}: timeout= must be a positive number of seconds")
        timeout = float(timeout)
    if criteria is not None:
        if not isinstance(criteria, Mapping) or not all(isinstance(k, str) for k in criteria):
            raise ConfigurationError(f"{where}: criteria= must be a dict with string keys")
        try:
            criteria = to_jsonable(dict(criteria))
        except NotJsonSerializableError as err:
            raise ConfigurationError(f"{where}: criteria= must be JSON-serializable") from err
    return HandlerSpec(name=name, fn=fn, input_model=input, timeout=timeout, mode=mode, criteria=criteria,
                       run_past_lease=bool(run_past_lease))


def _input_model(where: str, fn: Callable[..., Any], declared: type[BaseModel] | None) -> type[BaseModel] | None:
    """The model ``job.input`` is validated against: ``input=`` or the ``Job[Model]`` annotation.

    ``Job``, ``Job[dict]``, ``Job[Any]`` or no annotation mean the raw decoded payload.
    Both given must name the same model, since the handler reads the annotated one.
    """
    annotated = _annotated_input(where, fn)
    if annotated is None:
        return declared
    if declared is None:
        return annotated if isinstance(annotated, type) and issubclass(annotated, BaseModel) else None
    if annotated is not declared:
        shown = getattr(annotated, "__name__", repr(annotated))
        raise ConfigurationError(
            f"{where}: input={declared.__name__} does not match the annotation Job[{shown}]; "
            "drop input= (the annotation is enough) or make them name the same model")
    return declared


def _annotated_input(where: str, fn: Callable[..., Any]) -> object:
    """The ``X`` of the job parameter's ``Job[X]`` annotation, or None when it says nothing."""
    try:
        parameters = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # builtins and odd callables without a signature
        return None
    if not parameters:
        return None
    try:
        hints = get_type_hints(fn)
    except TypeError:  # not a function, method, class or module: no annotations to read
        return None
    except Exception as err:  # a string annotation that names something undefined, or a typo in one
        raise ConfigurationError(
            f"{where}: cannot resolve the annotations of {_qualname(fn)}: {type(err).__name__}: {err}; "
            "import the names they use at module level") from err
    hint = hints.get(parameters[0])
    if hint is None or hint is Job:
        return None
    if get_origin(hint) is not Job:
        if isinstance(hint, type) and issubclass(hint, BaseModel):
            raise ConfigurationError(
                f"{where}: the handler receives a Job, not a {hint.__name__}: annotate the parameter "
                f"as Job[{hint.__name__}]")
        return None
    (argument,) = get_args(hint)
    return None if argument is Any or isinstance(argument, TypeVar) else argument


class HandlerRegistry:
    """Handlers by name. Registering a second, different handler under a name raises."""

    def __init__(self) -> None:
        self._specs: dict[str, HandlerSpec] = {}
        self._lock = threading.Lock()

    def register(self, spec: HandlerSpec) -> HandlerSpec:
        """Add ``spec``. The same spec again is a no-op, and the same function re-imported
        from the same source (``importlib.reload``) replaces it; anything else raises."""
        with self._lock:
            existing = self._specs.get(spec.name)
            if existing is not None and existing != spec and not _same_source(existing.fn, spec.fn):
                raise ConfigurationError(
                    f"handler {spec.name!r} is already registered by "
                    f"{_qualname(existing.fn)}; cannot register {_qualname(spec.fn)} under the same name")
            self._specs[spec.name] = spec
        return spec

    def handler(self, name: str, *, input: type[BaseModel] | None = None, timeout: float | None = None,
                mode: HandlerMode = "short", criteria: Mapping[str, Any] | None = None,
                run_past_lease: bool = False, **removed: Never) -> Callable[[F], F]:
        """Decorator registering the function in this registry (see :func:`handler`)."""
        _refuse_removed(name, removed)

        def decorate(fn: F) -> F:
            spec = _build_spec(name, fn, input=input, timeout=timeout, mode=mode,
                               criteria=criteria, run_past_lease=run_past_lease)
            self.register(spec)
            # A bound method cannot carry the attribute; lookup by name still works.
            with contextlib.suppress(AttributeError, TypeError):
                setattr(fn, SPEC_ATTRIBUTE, spec)
            return fn

        return decorate

    def get(self, name: str) -> HandlerSpec:
        """The spec for ``name``; raises UnknownHandlerError listing the known names."""
        try:
            return self._specs[name]
        except KeyError:
            raise UnknownHandlerError(name, self.names()) from None

    def names(self) -> list[str]:
        return sorted(self._specs)

    def specs(self) -> list[HandlerSpec]:
        return [self._specs[n] for n in self.names()]

    def clear(self) -> None:
        """Forget every handler (tests)."""
        with self._lock:
            self._specs.clear()

    @contextlib.contextmanager
    def isolated(self) -> Iterator[HandlerRegistry]:
        """Empty the registry for a block and restore its handlers afterwards (tests).

        Example::

            with default_registry.isolated():
                load_handlers("tests/fixtures/handlers.py")
        """
        with self._lock:
            saved = dict(self._specs)
            self._specs.clear()
        try:
            yield self
        finally:
            with self._lock:
                self._specs.clear()
                self._specs.update(saved)

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __iter__(self) -> Iterator[HandlerSpec]:
        return iter(self.specs())

    def __len__(self) -> int:
        return len(self._specs)

    def __repr__(self) -> str:
        return f"HandlerRegistry({self.names()})"


default_registry = HandlerRegistry()


def handler(name: str, *, input: type[BaseModel] | None = None, timeout: float | None = None,
            mode: HandlerMode = "short", criteria: Mapping[str, Any] | None = None,
            run_past_lease: bool = False, registry: HandlerRegistry | None = None,
            **removed: Never) -> Callable[[F], F]:
    """Register a function as the handler for ``name``.

    ``name`` is the Pipelogiq stage handler name, the Priostack job type or the claim
    queue's name. The payload must satisfy the pydantic model of the ``job: Job[Model]``
    annotation (else the job ends as bad input without calling the function); ``input``
    names it explicitly and must agree with the annotation. ``timeout`` is the handler's
    own budget in seconds. ``mode`` is ``"short"`` (one call in one invocation),
    ``"slices"`` (through Step Functions; may return
    :class:`~serverless_worker.results.Continue`) or ``"callback"`` (through Step Functions,
    finished later through ``job.callback_token``). ``criteria`` are the claim queue
    capability criteria; ``run_past_lease`` (opt-in, claim queue only) lets the handler run
    for its whole ``timeout`` past the unrenewable lease, since the queue accepts a late
    result unless another worker finished the item first (``docs/timeouts.md``).
    """
    _refuse_removed(name, removed)
    return (registry if registry is not None else default_registry).handler(
        name, input=input, timeout=timeout, mode=mode, criteria=criteria, run_past_lease=run_past_lease)


def _refuse_removed(name: str, options: Mapping[str, object]) -> None:
    """Name the replacement of a removed option; any other unknown keyword is a plain TypeError."""
    for option in options:
        replacement = _REMOVED_OPTIONS.get(option)
        if replacement is not None:
            raise TypeError(f"handler {name!r}: {option}= was removed; declare {replacement} instead "
                            f"(mode= is one of {', '.join(map(repr, HANDLER_MODES))})")
        raise TypeError(f"handler() got an unexpected keyword argument {option!r}")


def get_handler(name: str) -> HandlerSpec:
    """The spec registered under ``name`` in the default registry."""
    return default_registry.get(name)


def load_handlers(module_or_path: str | Path, registry: HandlerRegistry | None = None) -> ModuleType:
    """Import the user's handler module and make sure its handlers are in ``registry``.

    Accepts a dotted module name (``functions.handlers``), a ``.py`` file or a package
    directory. Files load under a private module name through
    ``importlib.util.spec_from_file_location``; ``sys.path`` is never changed, so a
    package directory is the way to load several modules with relative imports.
    In a package every module beside ``__init__.py`` is imported too (names starting with
    ``_`` excepted), so a new file in ``functions/handlers/`` registers its handlers without
    an import in ``__init__.py``; one that registers none is named in a warning.
    Loading the same module again does not re-run it; its handlers are re-registered
    (after a ``registry.clear()``, for instance).
    """
    target = registry if registry is not None else default_registry
    text = str(module_or_path)
    is_path = isinstance(module_or_path, Path) or text.endswith(".py") or "/" in text or "\\" in text
    try:
        module = _import_path(Path(text)) if is_path else importlib.import_module(text)
        discovered = _import_package_modules(module)
    except ConfigurationError:
        raise
    except Exception as err:
        raise ConfigurationError(
            f"could not load handler module {text!r}: {type(err).__name__}: {err}") from err
    specs = _declared_specs(module)
    for sub in discovered:
        if not any(_defined_in(spec, sub.__name__) for spec in specs):
            _log.warning("handler module %s registers no @handler functions (a helper module there can be "
                         "named with a leading underscore, which keeps it out of the handler modules)",
                         getattr(sub, "__file__", None) or sub.__name__)
    for spec in specs:
        target.register(spec)
    return module


def _import_package_modules(package: ModuleType) -> list[ModuleType]:
    """Import every module directly in a handler package (not those named ``_x``), in name order."""
    locations = getattr(package, "__path__", None)
    if locations is None:
        return []
    names = sorted(info.name for info in pkgutil.iter_modules(locations) if not info.name.startswith("_"))
    return [importlib.import_module(f"{package.__name__}.{name}") for name in names]


def _defined_in(spec: HandlerSpec, module_name: str) -> bool:
    defined = getattr(spec.fn, "__module__", None) or ""
    return defined == module_name or defined.startswith(module_name + ".")


def _import_path(path: Path) -> ModuleType:
    resolved = path.resolve()
    if resolved.is_dir():
        init = resolved / "__init__.py"
        if not init.is_file():
            raise ConfigurationError(f"handler package {str(path)!r} has no __init__.py")
        location, search = init, [str(resolved)]
    elif resolved.is_file():
        location, search = resolved, None
    else:
        raise ConfigurationError(f"handler module path {str(path)!r} does not exist")
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:10]
    stem = re.sub(r"\W", "_", resolved.stem if search is None else resolved.name)
    name = f"{_FILE_MODULE_PREFIX}{stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, location, submodule_search_locations=search)
    if spec is None or spec.loader is None:
        raise ConfigurationError(f"cannot import {str(path)!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    # Registered before running, as import does: pydantic resolves annotations through it.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]
        raise
    return module


def _declared_specs(module: ModuleType) -> list[HandlerSpec]:
    """Handlers defined in ``module`` or its already-imported submodules."""
    prefix = module.__name__ + "."
    modules = [m for n, m in list(sys.modules.items()) if m is not None and (n == module.__name__
                                                                             or n.startswith(prefix))]
    found: list[HandlerSpec] = []
    for mod in modules:
        for value in list(vars(mod).values()):
            spec = getattr(value, SPEC_ATTRIBUTE, None) if callable(value) else None
            if isinstance(spec, HandlerSpec) and getattr(spec.fn, "__module__", None) == mod.__name__:
                found.append(spec)
    return found


def _same_source(a: Callable[..., Any], b: Callable[..., Any]) -> bool:
    """Two function objects for one definition: same qualified name, same file and line."""
    code_a, code_b = getattr(a, "__code__", None), getattr(b, "__code__", None)
    return (code_a is not None and code_b is not None
            and getattr(a, "__qualname__", None) == getattr(b, "__qualname__", None)
            and code_a.co_filename == code_b.co_filename and code_a.co_firstlineno == code_b.co_firstlineno)


# The private module name a handler file is loaded under (``_import_path``): never shown.
_FILE_MODULE_PREFIX = "_sw_handlers_"


def _qualname(fn: Callable[..., Any]) -> str:
    """``greetings.py:12 greet`` for a handler loaded from a file (its module name is private,
    ``_import_path``'s), ``package.module.greet`` for one imported by name."""
    name = getattr(fn, "__qualname__", None) or repr(fn)
    module = getattr(fn, "__module__", None) or "?"
    code = getattr(fn, "__code__", None)
    if not module.startswith(_FILE_MODULE_PREFIX) or code is None:
        return f"{module}.{name}"
    source = Path(code.co_filename)
    with contextlib.suppress(ValueError):
        source = source.relative_to(Path.cwd())
    return f"{source}:{code.co_firstlineno} {name}"
