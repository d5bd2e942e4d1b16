# PYTHON_ARGCOMPLETE_OK  (argcomplete: this entry point answers tab completion; see main)
"""The ``serverless-worker`` command: a thin argparse frame over the runtime.

Each subcommand is one module of this package, named ``<subcommand>_command``, exposing ``register(subparsers)``, which
adds its parser and sets ``handler=fn`` (``fn(args) -> int``) with ``set_defaults``.
Adding a subcommand is one module plus one name in :data:`SUBCOMMANDS`. Subcommand
modules import heavy dependencies inside their handlers, so ``--help`` stays instant.

Example (serves until Ctrl-C)::

    main(["sandbox", "pipelogiq", "--port", "8081", "--demo"])
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

from .. import __version__
from ..errors import ERROR_PREFIX, ServerlessWorkerError

__all__ = ["SUBCOMMANDS", "OneLineErrorParser", "build_parser", "main"]

PROG = "serverless-worker"

# Modules of this package, one per subcommand, in the order ``--help`` lists them.
SUBCOMMANDS: tuple[str, ...] = (
    "init",
    "local",
    "sandbox",
    "invoke",
    "drain",
    "doctor",
    "config",
    "ledger",
    "completion",
)

# Exit status for usage and configuration errors, the same one argparse uses.
EXIT_USAGE = 2


# "argument --protocol: 'x' is not one of ..." (a ``type=`` function's message) reads as "--protocol 'x' ...".
_QUOTED_VALUE_ERROR = re.compile(r"^argument (--[\w-]+)(?:/[\w-]+)*: (?=')")
_FLAG_THEN_VALUE = r"\1 "


class OneLineErrorParser(argparse.ArgumentParser):
    """A usage error is one line on stderr and exit status 2, not the whole usage first.

    With dozens of settings flags, argparse's usage ran to a screenful above the one line
    that said what was wrong; ``--help`` still prints it all. Subparsers are of this class
    too (``add_subparsers`` uses the parent's class).
    """

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix(PROG).strip()
        where = f" ({PROG} {command} --help)" if command else f" ({PROG} --help)"
        self.exit(EXIT_USAGE, f"{ERROR_PREFIX}{_QUOTED_VALUE_ERROR.sub(_FLAG_THEN_VALUE, message)}{where}\n")


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered subcommand."""
    parser = OneLineErrorParser(
        prog=PROG,
        description="Run job handlers for HTTP job-worker APIs on AWS Lambda, or locally.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"{__name__}.{name}_command").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit status.

    Asked by the shell for completions (argcomplete's ``_ARGCOMPLETE`` protocol: ``completion``
    prints the shell code that asks), it answers from the parser and exits without running
    anything; argcomplete is imported only then, so a normal start pays nothing for it
    (importing it takes about 20 ms). Without it (no ``local`` extra) the shell gets no words.
    """
    parser = build_parser()
    if "_ARGCOMPLETE" in os.environ:
        try:
            import argcomplete
        except ImportError:  # installed without the local extra: no completions, and nothing run
            return 1
        argcomplete.autocomplete(parser)
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(handler(args))
    except ServerlessWorkerError as err:
        # Expected failures (bad settings, port taken, bad seed file) get one line, no traceback.
        print(f"{ERROR_PREFIX}{err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
