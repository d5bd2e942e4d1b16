"""``serverless-worker completion SHELL``: tab completion of every subcommand and flag, the
way argparse's completion library, argcomplete, offers it.

The command's parser is argparse; argcomplete completes from that same parser (no second
list of flags to drift), asked by the shell through the ``_ARGCOMPLETE`` protocol, which
:func:`serverless_worker.cli.main` answers before anything else runs. This prints the shell
code that registers it (argcomplete's ``shellcode``, what its ``register-python-argcomplete``
prints), for one shell.

Example::

    eval "$(serverless-worker completion bash)"            # in ~/.bashrc
    serverless-worker completion fish > ~/.config/fish/completions/serverless-worker.fish
"""

from __future__ import annotations

import argparse

__all__ = ["SHELLS", "register", "run"]

SHELLS = ("bash", "zsh", "fish", "tcsh", "powershell")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``completion`` subcommand."""
    parser = subparsers.add_parser(
        "completion", help="print the shell code for tab completion (bash, zsh, fish, tcsh, powershell)",
        description="Print the shell code that gives serverless-worker tab completion of its subcommands and "
                    'flags (argcomplete\'s). Bash: eval "$(serverless-worker completion bash)" in ~/.bashrc; zsh '
                    "the same with zsh; fish: serverless-worker completion fish > "
                    "~/.config/fish/completions/serverless-worker.fish.")
    parser.add_argument("shell", nargs="?", default="bash", choices=SHELLS, help="the shell (default bash)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ..errors import ConfigurationError
    from . import PROG

    try:
        import argcomplete
    except ImportError:
        raise ConfigurationError("tab completion needs argcomplete, part of the local extra: "
                                 "pip install 'serverless-worker[local]'") from None
    print(argcomplete.shellcode([PROG], shell=args.shell), end="")
    return 0
