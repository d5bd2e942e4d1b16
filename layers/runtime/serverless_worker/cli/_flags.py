"""Command-line flags generated from the settings model (the runtime's
:class:`~serverless_worker.settings.Settings` and the local command's additions,
:class:`~serverless_worker.local.settings.LocalSettings`): ``--batch-size`` is
``SW_BATCH_SIZE`` is the template parameter ``BatchSize``.

Flag values are handed to the model as the strings an environment variable would hold,
so a flag and its variable are parsed and validated by the same code.
"""

from __future__ import annotations

import argparse
import difflib
import types
import typing
from typing import Any

from ..local.settings import LocalSettings
from ..settings import ENV_PREFIX

__all__ = ["ALIASES", "LAMBDA_ONLY", "NO_FLAG", "add_settings_flags", "add_worker_flags", "env_name",
           "flag_names", "one_of", "settings_from_args"]

# The key itself never goes on a command line (shell history, ps): --api-key-env names a variable.
NO_FLAG = frozenset({"api_key"})
# Lambda only: set by the stack for its functions (the local command builds its own, and
# its executors never pull for themselves).
LAMBDA_ONLY = frozenset({"executor_function_name", "state_machine_arn", "table_name", "schedule_seconds",
                         "self_pull", "self_pull_max_jobs", "self_pull_check_seconds"})
# Shorter names the local command also accepts.
ALIASES: dict[str, tuple[str, ...]] = {
    "base_url": ("--url",),
    "executor_reserved_concurrency": ("--concurrency",),
    "until_idle_seconds": ("--until-idle",),
    "state_path": ("--state",),
}
_DEST = "setting_"
_METAVARS = {"base_url": "URL", "handler_module": "MODULE_OR_PATH", "instance_id": "ID", "log_level": "LEVEL",
             "api_key_secret_arn": "ARN", "api_key_parameter": "NAME", "state_path": "PATH"}


def env_name(field: str) -> str:
    return f"{ENV_PREFIX}{field.upper()}"


def flag_names(field: str) -> tuple[str, ...]:
    """``("--batch-size",)`` plus any alias; empty for settings that are never flags."""
    if field in NO_FLAG or field in LAMBDA_ONLY:
        return ()
    return ("--" + field.replace("_", "-"), *ALIASES.get(field, ()))


def _kind(annotation: Any) -> type | None:
    """The plain type inside ``X | None`` / ``Annotated[X, ...]`` / ``Literal[...]`` (None for others)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _kind(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _kind(inner[0]) if len(inner) == 1 else None
    return annotation if isinstance(annotation, type) else origin


def _choices(annotation: Any) -> list[str] | None:
    if typing.get_origin(annotation) is typing.Literal:
        return [str(a) for a in typing.get_args(annotation)]
    return None


def one_of(choices: list[str]) -> Any:
    """An argparse ``type=`` that accepts one of ``choices``, else says which it is closest to.

    argparse's own ``choices=`` message quotes every choice and suggests nothing; this one is
    the line a newcomer needs: ``'pipelogic' is not one of pipelogiq, ... (did you mean 'pipelogiq'?)``.
    """
    def parse(text: str) -> str:
        if text in choices:
            return text
        close = difflib.get_close_matches(text.lower(), choices, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(choices)}{hint}")

    parse.__name__ = "choice"
    return parse


def add_worker_flags(parser: argparse.ArgumentParser) -> None:
    """``--api-key-env`` and ``--queue``: how a command that talks to a job server (local,
    doctor) is given its key and a claim queue; ``build_settings`` reads both."""
    parser.add_argument("--api-key-env", metavar="NAME",
                        help="the environment variable that holds the API key or bearer token (the key "
                             "itself is never a flag); default SW_API_KEY")
    parser.add_argument("--queue", metavar="NAME",
                        help="claim queue to work (the same as --handlers NAME); with it, --criteria is "
                             "that queue's criteria object, e.g. '{\"format\": \"jpg\"}'")


def add_settings_flags(parser: argparse.ArgumentParser, only: frozenset[str] | None = None) -> None:
    """One flag per setting (see :func:`flag_names`), each defaulting to "not given";
    ``only``: just these settings (a command that uses a few, such as ``doctor``)."""
    example = "--protocol is SW_PROTOCOL" if only else "--batch-size is SW_BATCH_SIZE"
    group = parser.add_argument_group(
        "settings", f"each flag is also an environment variable ({example}); "
                    "the flag wins. `serverless-worker config` lists them all.")
    for name, field in LocalSettings.model_fields.items():
        options = flag_names(name)
        if not options or (only is not None and name not in only):
            continue
        kind = _kind(field.annotation)
        help_text = f"{(field.description or '').replace('%', '%%')} [{env_name(name)}]"
        kwargs: dict[str, Any] = {"dest": _DEST + name, "default": None, "help": help_text}
        choices = _choices(field.annotation)
        if kind is bool:
            kwargs.update(action="store_const", const="true")
        elif choices:
            kwargs.update(type=one_of(choices), metavar="|".join(choices))
        elif kind is list:
            kwargs.update(nargs="+", metavar="NAME")
        elif kind in (int, float):
            kwargs.update(metavar="SECONDS" if "seconds" in name or "timeout" in name else "N")
        elif kind is dict:
            kwargs.update(metavar="JSON")
        else:
            kwargs.update(metavar=_METAVARS.get(name, "VALUE"))
        action = group.add_argument(*options, **kwargs)
        if choices:
            # Tab completion (argcomplete) offers an action's ``completer``'s words: the choices
            # are checked by ``one_of`` (for its message), so argparse's ``choices`` is unset.
            setattr(action, "completer", _choices_completer(choices))  # noqa: B010 (argcomplete's attribute)


def _choices_completer(choices: list[str]) -> Any:
    def complete(prefix: str, **_: Any) -> list[str]:
        return [choice for choice in choices if choice.startswith(prefix)]

    return complete


def settings_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given as flags, by field name (lists joined the way SW_HANDLERS reads them)."""
    given: dict[str, Any] = {}
    for name in LocalSettings.model_fields:
        value = getattr(args, _DEST + name, None)
        if value is None:
            continue
        if isinstance(value, list):
            value = ",".join(part.strip() for item in value for part in item.split(",") if part.strip())
        given[name] = value
    return given
