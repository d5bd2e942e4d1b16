"""``serverless-worker drain`` as a subprocess, against a sandbox and moto's server: the
draining flag every tick reads, hand-back of deliveries that never started, the
shutdown call, ``--resume``, and one clear error when settings are missing."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin
from support.local_aws import TABLE, LocalAws, run_cli

pytestmark = pytest.mark.cli

API_KEY = "sandbox-api-key"


@pytest.fixture
def pipelogiq(serve: Callable[..., SandboxServer]) -> SandboxServer:
    return serve("pipelogiq", lease_seconds=5, visibility_timeout=30, poll_interval=0.05)


def _settings(aws: LocalAws, server: SandboxServer, **extra: str) -> dict[str, str]:
    """The worker's settings as the functions get them: SW_* variables."""
    settings = {"SW_PROTOCOL": "pipelogiq", "SW_BASE_URL": server.url, "SW_API_KEY": API_KEY,
                "SW_TABLE_NAME": TABLE, "SW_INSTANCE_ID": "blue"}
    return aws.env(**{**settings, **extra})


def _tick(aws: LocalAws, server: SandboxServer) -> dict[str, object]:
    proc = run_cli("invoke", "SchedulerFunction", "-e", "events/scheduler.json", "--parameter-overrides",
                   f"BaseUrl={server.url}", "InstanceId=blue", "Handlers=echo", "PollWindowSeconds=4",
                   "ApiKeySecretArn=arn:aws:secretsmanager:us-east-1:123456789012:secret:unused",
                   env=aws.env(SW_API_KEY=API_KEY))
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def test_drain_hands_back_unstarted_deliveries_shuts_down_and_blocks_ticks(
        local_aws: LocalAws, pipelogiq: SandboxServer, admin_for: Callable[..., SandboxAdmin]) -> None:
    # given two jobs pulled and dispatched by a tick, but never started by an executor
    admin = admin_for(pipelogiq)
    admin.seed({"handler": "echo", "inputs": [{"n": 1}, {"n": 2}]})
    assert _tick(local_aws, pipelogiq)["dispatched"] == 2

    # when the worker is drained from the command line
    proc = run_cli("drain", "--grace-seconds", "5", env=_settings(local_aws, pipelogiq))

    # then both deliveries went back to the server unrun, the worker said goodbye, and exit 0
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    report = json.loads(proc.stdout)
    assert report["handed_back"] == 2 and report["still_running"] == 0, report
    assert report["shutdown_called"] is True
    assert {item["status"] for item in local_aws.ledger()} == {"HANDED_BACK"}
    assert admin.stats()["calls"].get("shutdown", 0) == 1
    assert local_aws.item("control#pipelogiq#blue")["draining"] is True

    # and the next tick pulls nothing
    admin.seed({"handler": "echo", "inputs": [{"n": 3}]})
    tick = _tick(local_aws, pipelogiq)
    assert tick["stopped"] == "draining" and tick["pulled"] == 0, tick


def test_resume_clears_the_flag_and_the_next_tick_pulls(
        local_aws: LocalAws, pipelogiq: SandboxServer, admin_for: Callable[..., SandboxAdmin]) -> None:
    admin = admin_for(pipelogiq)
    drained = run_cli("drain", "--grace-seconds", "0", env=_settings(local_aws, pipelogiq))
    assert drained.returncode == 0, drained.stderr

    resumed = run_cli("drain", "--resume", env=_settings(local_aws, pipelogiq))

    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == {"resumed": True}
    assert local_aws.item("control#pipelogiq#blue")["draining"] is False
    admin.seed({"handler": "echo", "inputs": [{"n": 1}]})
    assert _tick(local_aws, pipelogiq)["pulled"] == 1


def test_flags_override_the_environment(local_aws: LocalAws, pipelogiq: SandboxServer) -> None:
    # given an environment naming another instance and a table that does not exist
    env = _settings(local_aws, pipelogiq, SW_INSTANCE_ID="green", SW_TABLE_NAME="no-such-table")

    # when the flags name the real ones
    proc = run_cli("drain", "--grace-seconds", "0", "--instance-id", "blue", "--table-name", TABLE,
                   "--base-url", pipelogiq.url, "--protocol", "pipelogiq",
                   "--handler-module", "functions.handlers", env=env)

    # then the flags won
    assert proc.returncode == 0, proc.stderr
    assert local_aws.item("control#pipelogiq#blue")["draining"] is True
    assert local_aws.item("control#pipelogiq#green") is None


@pytest.mark.parametrize(("drop", "message"), [
    ("SW_BASE_URL", "SW_BASE_URL: required but not set"),
    ("SW_API_KEY", "no API key configured"),
    ("AWS_DEFAULT_REGION", "no AWS region configured"),
])
def test_missing_settings_are_one_clear_error(local_aws: LocalAws, pipelogiq: SandboxServer, drop: str,
                                              message: str) -> None:
    env = _settings(local_aws, pipelogiq)
    del env[drop]

    proc = run_cli("drain", env=env)

    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert message in proc.stderr
    assert proc.stdout == ""


def test_grace_seconds_must_be_a_number(local_aws: LocalAws) -> None:
    proc = run_cli("drain", "--grace-seconds", "soon", env=local_aws.env())

    assert proc.returncode == 2
    assert "soon is not a number of seconds" in proc.stderr

