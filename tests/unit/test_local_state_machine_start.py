"""The local runner starts moto's Step Functions beside its first pull: when that start
fails, the run stops with the cause and exit 2, and leaves nothing in flight."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from rich.console import Console

from serverless_worker.cli import build_parser
from serverless_worker.cli.local_command import build_settings
from serverless_worker.local import aws as local_aws
from serverless_worker.local.worker import EXIT_CONFIGURATION, LocalRunner

ROOT = Path(__file__).resolve().parents[2]


def test_a_state_machine_that_cannot_start_stops_the_run_with_its_cause(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(cls: type, **_: object) -> None:
        raise OSError("no port for moto")

    monkeypatch.setattr(local_aws.EmbeddedAws, "start", classmethod(refuse))
    monkeypatch.chdir(tmp_path)
    for name in [n for n in os.environ if n.startswith("SW_")]:
        monkeypatch.delenv(name)
    args = build_parser().parse_args([
        "local", "--handler-module", str(ROOT / "functions" / "handlers" / "examples.py"),
        "--handlers", "echo", "slow-report", "--until-idle-seconds", "2"])
    settings, own_sandbox = build_settings(args)
    out = io.StringIO()
    runner = LocalRunner(settings, own_sandbox=own_sandbox, console=Console(file=out, width=200), live=False)

    status = runner.run()

    text = out.getvalue()
    assert status == EXIT_CONFIGURATION, text
    assert "the embedded Step Functions did not start (OSError: no port for moto)" in text
    assert "still in flight 0 none: every delivery has a definite outcome" in " ".join(text.split()), text
