"""The settings a command that works a job server (``local``, ``doctor``, ``config``) runs
with, and where each value came from: a flag, the environment, the project's
``template.yaml`` (the handler module), the local command's own default, or the model's.

Flags and variables are read and validated by the one settings model; a bad one is
refused naming its variable and flag, every bad one at once. The handler module is never
guessed: a flag or ``SW_HANDLER_MODULE`` names it, or the project's template does (the
module the deployed stack loads); without any, only the built-in demo runs (its own
handlers against its own sandbox), and a run for a server is refused in one line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError
from ..local.defaults import DEMO_DEFAULTS, LOCAL_DEFAULTS
from ..local.settings import LocalSettings
from ._flags import env_name, flag_names, settings_from_args

__all__ = ["NO_HANDLER_MODULE", "LocalSetup", "Source", "build_settings"]

# Until our own sandbox listens (on a port the OS picks), the settings need some URL.
_PLACEHOLDER_URL = "http://127.0.0.1:1"


@dataclass(frozen=True)
class Source:
    """Where a setting's value came from: ``kind`` is ``flag``, ``environment``, ``file`` or
    ``default``; ``detail`` says which (the variable, the file, whose default)."""

    kind: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind} ({self.detail})" if self.detail else self.kind


_FLAG, _DEFAULT = Source("flag"), Source("default")
_LOCAL_DEFAULT, _DEMO_DEFAULT = Source("default", "local command"), Source("default", "built-in demo")
NO_HANDLER_MODULE = ("no handler module to run: name yours with --handler-module FILE.py, a package directory "
                     "or a module name (or SW_HANDLER_MODULE), or run from a project whose template.yaml sets "
                     "SW_HANDLER_MODULE (`serverless-worker init` writes one)")


@dataclass(frozen=True)
class LocalSetup:
    """Validated settings, whether the run uses its own sandbox, and each setting's source."""

    settings: LocalSettings
    own_sandbox: bool
    sources: dict[str, Source] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # what a run would refuse (``strict=False`` only)


def build_settings(args: argparse.Namespace, *, strict: bool = True) -> LocalSetup:
    """The validated settings and where each came from; ConfigurationError names every bad
    setting (its variable and flag) at once, and a missing handler module in one line.
    ``strict=False`` (``config``): only a value the model refuses raises; the rules across
    settings and the missing module are returned in :attr:`LocalSetup.problems` instead."""
    given = settings_from_args(args)
    sources = dict.fromkeys(given, _FLAG)
    problems: list[str] = []
    queue = getattr(args, "queue", None)
    if queue is not None:
        _queue(queue, given, problems)
        sources["handlers"] = Source("flag", "--queue")
    key_env = getattr(args, "api_key_env", None)
    if key_env is not None:
        value = os.environ.get(key_env, "")
        if not value.strip():
            problems.append(f"--api-key-env {key_env}: the environment variable {key_env} is not set")
        else:
            given["api_key"] = value
            sources["api_key"] = Source("environment", f"{key_env}, named by --api-key-env")
    for name in LocalSettings.model_fields:
        if name not in sources and _in_environment(name):
            sources[name] = Source("environment", env_name(name))
    own_sandbox = "base_url" not in given and not _in_environment("base_url")
    values: dict[str, Any] = {}
    for name, value in LOCAL_DEFAULTS.items():
        if not _in_environment(name):
            values[name] = value
            sources[name] = _LOCAL_DEFAULT
    if own_sandbox:
        for name, value in DEMO_DEFAULTS.items():
            if not _in_environment(name):
                values[name] = value
                sources[name] = _DEMO_DEFAULT
    values.update(given)
    sources.update(dict.fromkeys(set(given) - set(sources), _FLAG))
    if own_sandbox:
        values["base_url"] = _PLACEHOLDER_URL
        sources["base_url"] = Source("default", "the built-in sandbox: no --url")
    missing_module = _handler_module(values, sources, own_sandbox)
    try:
        settings = LocalSettings(**values)
    except ConfigurationError as err:
        raise ConfigurationError(_message(_lines(str(err)) + problems + _cross_checks(
            lambda name: values.get(name) or os.environ.get(env_name(name)), own_sandbox,
            key_problem=key_env is not None))) from None
    problems += _cross_checks(lambda name: getattr(settings, name), own_sandbox, key_problem=key_env is not None)
    if strict and problems:
        raise ConfigurationError(_message(problems + ([NO_HANDLER_MODULE] if missing_module else [])))
    if strict and missing_module:
        raise ConfigurationError(NO_HANDLER_MODULE)
    for name in LocalSettings.model_fields:
        sources.setdefault(name, _DEFAULT)
    return LocalSetup(settings, own_sandbox, sources, problems + ([NO_HANDLER_MODULE] if missing_module else []))


def _in_environment(name: str) -> bool:
    return bool(os.environ.get(env_name(name), "").strip())


def _handler_module(values: dict[str, Any], sources: dict[str, Source], own_sandbox: bool) -> bool:
    """Fill in the handler module when no flag or variable named it: the project's template's,
    else, for the built-in demo only, the demo's. Returns whether there is none."""
    from ..local.handler_module import DEMO_HANDLER_MODULE, project_handler_module

    if "handler_module" in values or _in_environment("handler_module"):
        return False
    named = project_handler_module()
    if named is not None:
        module, template = named
        values["handler_module"] = module
        sources["handler_module"] = Source("file", _shown(template))
        return False
    # The model's own default stands in (for validation); a run for a server refuses it.
    values["handler_module"] = DEMO_HANDLER_MODULE
    sources["handler_module"] = Source("default", "built-in demo") if own_sandbox else Source("none")
    return not own_sandbox


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _queue(queue: str, given: dict[str, Any], problems: list[str]) -> None:
    if "handlers" in given and set(given["handlers"].split(",")) != {queue}:
        # Naming the same queue twice is harmless; naming two different ones is a contradiction.
        problems.append(f"--queue {queue}, --handlers {given['handlers']}: they name different handlers; "
                        "give one of them (a claim queue's name is its handler's)")
    given["handlers"] = queue
    if "criteria" not in given:
        return
    try:
        criteria = json.loads(given["criteria"])
    except ValueError:
        problems.append(f"{env_name('criteria')} (--criteria): is not valid JSON")
        return
    if not isinstance(criteria, dict):
        problems.append(f"{env_name('criteria')} (--criteria): with --queue, must be the queue's criteria "
                        'object, {"field": matcher}')
        return
    given["criteria"] = json.dumps({queue: criteria})


def _cross_checks(value: Callable[[str], Any], own_sandbox: bool, *, key_problem: bool) -> list[str]:
    """Rules across settings, on validated settings or (when those failed) on the raw values."""
    problems = []
    protocol = str(value("protocol") or "pipelogiq").strip().lower()
    if str(value("transport") or "http").strip().lower() == "socket" and protocol != "claimqueue":
        problems.append(f"{env_name('transport')} (--transport): socket is the claim queue's work socket; "
                        f"{protocol} has only http")
    has_key = value("api_key") or value("api_key_secret_arn") or value("api_key_parameter")
    if not own_sandbox and not has_key and not key_problem:
        problems.append(f"{env_name('api_key')}: no API key for {value('base_url')}; pass --api-key-env NAME "
                        f"(the variable holding it) or set {env_name('api_key_secret_arn')} or "
                        f"{env_name('api_key_parameter')}")
    return problems


_SETTING_LINE = re.compile(r"^(SW_[A-Z0-9_]+)(?=[: ,\[])")


def _lines(message: str) -> list[str]:
    """The model's ``SW_NAME: problem`` lines, each naming the flag too."""
    body = message.removeprefix("invalid settings:").strip("\n")
    lines = [line.strip() for line in body.splitlines() if line.strip()]
    return [_SETTING_LINE.sub(_with_flag, line) for line in lines]


def _with_flag(match: re.Match[str]) -> str:
    env = match.group(1)
    flags = flag_names(env.removeprefix("SW_").lower())
    return f"{env} ({', '.join(flags)})" if flags else env


def _message(lines: list[str]) -> str:
    return "invalid settings:\n  " + "\n  ".join(lines)
