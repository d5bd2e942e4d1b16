"""``serverless-worker config``: every setting, generated from the ``Settings`` model.

Lists each setting's environment variable, flag on the local command, template
parameter, defaults and description. ``--markdown`` prints the table the README shows,
so the README is regenerated from the code instead of drifting from it.

Example::

    serverless-worker config --markdown > settings.md
"""

from __future__ import annotations

import argparse

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``config`` subcommand."""
    parser = subparsers.add_parser(
        "config", help="list every setting: environment variable, flag, template parameter, default",
        description="List every setting of the worker, generated from its settings model and template.yaml.")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table (the README's)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ._settings_table import settings_rows, to_markdown

    rows = settings_rows()
    if args.markdown:
        print(to_markdown(rows))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="serverless-worker settings (flag > environment > local default > default)",
                  title_justify="left", show_lines=False)
    for column in ("environment variable", "local flag", "template parameter", "default", "local default"):
        table.add_column(column, no_wrap=True)
    table.add_column("description", min_width=30, overflow="fold")
    for row in rows:
        table.add_row(row.env, row.flags.replace("`", ""), row.template.replace("`", ""),
                      row.default.replace("`", ""), row.local_default.replace("`", ""), row.description)
    Console().print(table)
    return 0
