"""``serverless-worker config``: the settings ``serverless-worker local`` would run with here,
each value with where it came from (a flag, the environment, the project's template.yaml, a
default), read by the same code ``local`` uses; it takes ``local``'s flags, so
``config --protocol priostack`` shows what that run would get. ``--json`` prints them as JSON;
``--reference`` lists every setting's variable, flag, template parameter, defaults and
description, one block each wrapped to the terminal; ``--markdown`` prints the table
docs/settings.md shows, so that page is regenerated from the code instead of drifting from it.

A secret's value is never shown, only whether it is set.

Example::

    serverless-worker config --url https://jobs.example.com --json
    serverless-worker config --markdown > settings.md
"""

from __future__ import annotations

import argparse
import shutil
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._resolve import LocalSetup

__all__ = ["register", "run"]

_BUILT_IN_SANDBOX = "the built-in sandbox (a loopback port picked at start)"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``config`` subcommand."""
    from ._flags import add_settings_flags, add_worker_flags

    parser = subparsers.add_parser(
        "config", help="show the settings `local` runs with here, each with its source (flag, environment, "
                       "file, default); --reference lists them all",
        description="Show every setting `serverless-worker local` would run with here, given the same flags "
                    "(which this command takes too), and where each value came from: a flag, the environment, "
                    "the project's template.yaml or a default. Secrets show only whether they are set.")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true",
                        help="the effective settings as JSON: [{name, env, value, source, detail}]")
    output.add_argument("--reference", action="store_true",
                        help="every setting: its variable, flag, template parameter, defaults and description")
    output.add_argument("--markdown", action="store_true",
                        help="the reference as a Markdown table (the one in docs/settings.md)")
    add_worker_flags(parser)
    add_settings_flags(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ._settings_table import settings_rows, to_markdown, to_text

    if args.markdown or args.reference:
        rows = settings_rows()
        width = max(40, min(shutil.get_terminal_size().columns, 100))
        print(to_markdown(rows) if args.markdown else to_text(rows, width=width))
        return 0
    from ._resolve import build_settings

    setup = build_settings(args, strict=False)
    effective = _effective(setup)
    if args.json:
        from pydantic import TypeAdapter

        document = {"settings": [{k: v for k, v in row.items() if k != "shown"} for row in effective],
                    "problems": setup.problems}
        print(TypeAdapter(dict[str, Any]).dump_json(document, indent=2).decode())
        return 0
    print("serverless-worker config: the settings `serverless-worker local` runs with here "
          "(flag > environment > file > default)")
    widths = [max(len(str(row[key])) for row in effective) for key in ("env", "shown")]
    for row in effective:
        source = f"{row['source']} ({row['detail']})" if row["detail"] else row["source"]
        print(f"  {row['env']:<{widths[0]}}  {row['shown']:<{widths[1]}}  {source}")
    if setup.problems:
        print("with these, `serverless-worker local` would refuse to start:")
        for problem in setup.problems:
            print(f"  {problem}")
    return 0


def _effective(setup: LocalSetup) -> list[dict[str, Any]]:
    """One row per setting: its name, variable, value (JSON-able; a secret's is never
    shown), the value as text, and its source's kind and detail."""
    from pydantic import SecretStr

    from ._flags import env_name

    rows = []
    for name, value in setup.settings.model_dump().items():
        source = setup.sources[name]
        if isinstance(value, SecretStr):
            value = shown = "set (not shown)"
        elif name == "base_url" and setup.own_sandbox:
            value, shown = None, _BUILT_IN_SANDBOX
        elif name == "handler_module" and source.kind == "none":
            value, shown = None, "none: name one with --handler-module (a run for a server is refused)"
        else:
            shown = _text(value)
        rows.append({"name": name, "env": env_name(name), "value": value, "shown": shown, "source": source.kind,
                     "detail": source.detail})
    return rows


def _text(value: Any) -> str:
    import json

    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(map(str, value)) or "(empty)"
    if isinstance(value, dict):
        return json.dumps(value) if value else "(empty)"
    return str(value)
