"""CLI tier: tab completion as argcomplete offers it for the command's own argparse parser.

``serverless-worker completion bash`` prints argcomplete's shell code; sourced in a real bash,
its completion function asks the real console script (through argcomplete's ``_ARGCOMPLETE``
protocol) and gets the subcommands and flags the parser has: nothing is listed by hand.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cli

CLI = Path(sys.executable).with_name("serverless-worker")


def complete(line: str) -> list[str]:
    """What bash's completion offers for ``line`` (the cursor at its end)."""
    words = line.split(" ")
    script = (f'eval "$("{CLI}" completion bash)"\n'
              f'COMP_LINE={line!r}; COMP_POINT=${{#COMP_LINE}}; COMP_WORDS=({" ".join(repr(w) for w in words)})\n'
              f"COMP_CWORD={len(words) - 1}\n"
              f"_python_argcomplete serverless-worker {words[-1]!r} {words[-2]!r}\n"
              'printf "%s\\n" "${COMPREPLY[@]}"\n')
    env = {**os.environ, "PATH": f"{CLI.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, env=env, check=False)
    assert result.returncode == 0, result.stderr
    return [word.strip() for word in result.stdout.splitlines() if word.strip()]


def test_subcommands_and_their_flags_complete_from_the_parser() -> None:
    assert complete("serverless-worker lo") == ["local"]
    assert set(complete("serverless-worker ")) >= {"init", "local", "sandbox", "doctor", "config", "completion"}
    assert set(complete("serverless-worker local --ha")) == {"--handlers", "--handler-module"}
    assert {"pipelogiq", "priostack", "claimqueue", "jobs"} <= set(complete("serverless-worker sandbox "))
    assert complete("serverless-worker local --protocol pr") == ["priostack"]


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_other_shells_get_their_own_code(shell: str) -> None:
    result = subprocess.run([str(CLI), "completion", shell], capture_output=True, text=True, timeout=60, check=False)

    assert result.returncode == 0, result.stderr
    assert "serverless-worker" in result.stdout and "_ARGCOMPLETE" in result.stdout


def test_without_argcomplete_a_completion_request_gets_no_words_and_runs_nothing() -> None:
    # given the command installed without the local extra (argcomplete not importable)
    script = ("import sys; sys.modules['argcomplete'] = None\n"
              "from serverless_worker.cli import main\nsys.exit(main(['local']))\n")

    # when the shell asks it for completions
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "_ARGCOMPLETE": "1"}, check=False)

    # then it answers nothing, quietly, and runs no subcommand (local would start a worker)
    assert (result.returncode, result.stdout, result.stderr) == (1, "", "")
