"""CLI tier: what a newcomer sees first, run as the real console script.

A mistyped ``--protocol`` is one line on stderr with exit 2; ``serverless-worker config``
shows each setting's effective value and where it came from (flag, environment, the project's
template.yaml, a default), as text or JSON; ``config --reference`` reads in an 80-column
terminal, one block per setting, while ``--markdown`` prints the table docs/settings.md
holds, which is checked to be its output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from serverless_worker.local.settings import LocalSettings
from serverless_worker.settings import Settings

pytestmark = pytest.mark.cli

CLI = Path(sys.executable).with_name("serverless-worker")
ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, columns: int = 80, cwd: Path = ROOT, **env_vars: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SW_")}
    env["COLUMNS"] = str(columns)
    env.update(env_vars)
    return subprocess.run([str(CLI), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=30,
                          check=False)


def test_a_misspelt_protocol_prints_one_line_and_exits_2() -> None:
    result = run("local", "--protocol", "pipelogic")

    assert result.returncode == 2
    assert result.stderr == ("serverless-worker: error: --protocol 'pipelogic' is not one of pipelogiq, "
                             "priostack, claimqueue (did you mean 'pipelogiq'?) (serverless-worker local --help)\n")
    assert result.stdout == ""


def test_config_reference_reads_at_80_columns_one_block_per_setting() -> None:
    result = run("config", "--reference", columns=80)

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


def test_config_shows_each_effective_value_with_its_source() -> None:
    # given a flag, a variable, the repository's template (the handler module) and defaults
    result = run("config", "--url", "https://jobs.example.com", "--api-key-env", "MY_KEY", "--batch-size", "7",
                 columns=200, SW_INSTANCE_ID="laptop", MY_KEY="s3cret-never-shown")

    # then each line is the variable, the value local would use, and where it came from
    assert result.returncode == 0, result.stderr
    lines = {line.split()[0]: line for line in result.stdout.splitlines()[1:] if line.startswith("  SW_")}
    assert lines["SW_BATCH_SIZE"].split()[1:] == ["7", "flag"]
    assert lines["SW_BASE_URL"].split()[1:] == ["https://jobs.example.com", "flag"]
    assert lines["SW_INSTANCE_ID"].split()[1:] == ["laptop", "environment", "(SW_INSTANCE_ID)"]
    assert lines["SW_HANDLER_MODULE"].split()[1:] == ["handlers", "file", "(template.yaml)"]
    assert lines["SW_EXECUTOR_RESERVED_CONCURRENCY"].split()[1:] == ["10", "default", "(local", "command)"]
    assert lines["SW_MAX_IN_FLIGHT"].split()[1:] == ["50", "default"]
    assert "set (not shown)" in lines["SW_API_KEY"] and "MY_KEY, named by --api-key-env" in lines["SW_API_KEY"]
    assert "s3cret" not in result.stdout + result.stderr


def test_config_json_has_every_setting_and_what_a_run_would_refuse(tmp_path: Path) -> None:
    # given a directory that is no project, and a server URL without a key
    result = run("config", "--json", "--url", "https://jobs.example.com", cwd=tmp_path)

    # then JSON: every setting with its value and source, and the problems local would stop on
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    settings = {row["name"]: row for row in document["settings"]}
    assert settings.keys() == set(LocalSettings.model_fields)
    assert (settings["base_url"]["value"], settings["base_url"]["source"]) == ("https://jobs.example.com", "flag")
    assert settings["state_path"]["source"] == "default" and settings["state_path"]["detail"] == "local command"
    assert settings["handler_module"]["source"] == "none"
    assert any(problem.startswith("SW_API_KEY: no API key") for problem in document["problems"])
    assert any(problem.startswith("no handler module to run") for problem in document["problems"])


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
