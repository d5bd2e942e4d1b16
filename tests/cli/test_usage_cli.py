"""CLI tier: what a newcomer sees first, run as the real console script.

A mistyped ``--protocol`` is one line on stderr with exit 2; ``serverless-worker config``
reads in an 80-column terminal, one block per setting, while ``--markdown`` prints the
table docs/settings.md holds, which is checked to be its output.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from serverless_worker.settings import Settings

pytestmark = pytest.mark.cli

CLI = Path(sys.executable).with_name("serverless-worker")
ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, columns: int = 80) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SW_")}
    env["COLUMNS"] = str(columns)
    return subprocess.run([str(CLI), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30,
                          check=False)


def test_a_misspelt_protocol_prints_one_line_and_exits_2() -> None:
    result = run("local", "--protocol", "pipelogic")

    assert result.returncode == 2
    assert result.stderr == ("serverless-worker: error: --protocol 'pipelogic' is not one of pipelogiq, "
                             "priostack, claimqueue (did you mean 'pipelogiq'?) (serverless-worker local --help)\n")
    assert result.stdout == ""


def test_config_reads_at_80_columns_one_block_per_setting() -> None:
    result = run("config", columns=80)

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    too_wide = [line for line in lines if len(line) > 80]
    assert too_wide == []
    for name in Settings.model_fields:
        assert f"SW_{name.upper()}  ({name})" in lines, name
    block = result.stdout.split("SW_BATCH_SIZE  (batch_size)\n", 1)[1].split("\n\n", 1)[0]
    assert "    default: 10" in block
    assert "    flag: --batch-size" in block
    assert "    template: BatchSize" in block
    assert "Most deliveries taken per pull call." in block


def test_config_markdown_is_still_the_table() -> None:
    result = run("config", "--markdown", columns=80)

    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("| setting | environment variable | local flag | template parameter |")
    assert result.stdout.strip() in (ROOT / "docs" / "settings.md").read_text(), \
        "docs/settings.md is stale: paste `serverless-worker config --markdown` into it"


def test_local_help_gives_the_state_file_a_run_uses() -> None:
    from serverless_worker.local.defaults import LOCAL_DEFAULTS

    result = run("local", "--help", columns=200)

    # the flag's text names the file a worker for a server keeps (the local default), and
    # the temporary file only for the built-in demo
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert LOCAL_DEFAULTS["state_path"] == ".serverless-worker/state.sqlite3"
    assert "Default .serverless-worker/state.sqlite3 in the working directory; the built-in demo's is a " \
           "temporary file" in text
    assert "Unset: a temporary file" not in text
