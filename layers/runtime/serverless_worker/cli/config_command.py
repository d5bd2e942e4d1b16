"""``serverless-worker config``: every setting, generated from the ``Settings`` model.

Lists each setting's environment variable, flag on the local command, template
parameter, defaults and description, one block per setting wrapped to the terminal
(at most 100 columns), so it reads in an 80-column window. ``--markdown`` prints the table docs/settings.md shows,
so that page is regenerated from the code instead of drifting from it.

Example::

    serverless-worker config --markdown > settings.md
"""

from __future__ import annotations

import argparse
import shutil

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``config`` subcommand."""
    parser = subparsers.add_parser(
        "config", help="list every setting: environment variable, flag, template parameter, default",
        description="List every setting of the worker, generated from its settings model and template.yaml.")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table (the one in docs/settings.md)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ._settings_table import settings_rows, to_markdown, to_text

    rows = settings_rows()
    if args.markdown:
        print(to_markdown(rows))
        return 0
    print(to_text(rows, width=max(40, min(shutil.get_terminal_size().columns, 100))))
    return 0
