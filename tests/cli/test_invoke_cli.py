"""``serverless-worker invoke`` as a subprocess: every sample event in events/ runs its
function in-process against a sandbox job server and an embedded DynamoDB (moto's server),
a scheduler tick pulls and dispatches real jobs that the executor then completes, and
every way the setup can be wrong ends in one clear error line with exit status 2.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin
from support.local_aws import ROOT, LocalAws, run_cli

pytestmark = pytest.mark.cli

EVENTS = sorted((ROOT / "events").glob("*.json"))
API_KEY = "sandbox-api-key"
UNUSED_SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:unused"  # SW_API_KEY wins
FUNCTIONS = {"scheduler": "SchedulerFunction", "executor": "ExecutorFunction", "steps": "StepsFunction",
             "drain": "DrainFunction"}
# What each sample does against an empty ledger: nothing to run, and it says so.
EXPECTED: dict[str, Callable[[dict[str, Any]], bool]] = {
    "scheduler": lambda r: r["pulls"] >= 1 and r["pulled"] == 0 and r["errors"] == [],
    "executor": lambda r: r["action"] == "missing",
    "steps-acquire": lambda r: r["action"] == "done",
    "steps-run_slice": lambda r: r["continue"] is False,
    "steps-renew": lambda r: r["finished"] is True,
    "steps-report": lambda r: r["reported"] is False,
    "steps-ack": lambda r: r["acknowledged"] is False,
    "steps-give_back": lambda r: r["action"] == "missing",
    "steps-give_back-acquire": lambda r: r["action"] == "missing",
    "drain": lambda r: r["still_running"] == 0 and r["shutdown_called"] is True,
    "drain-resume": lambda r: r == {"resumed": True},
}


def _function(path: Path) -> str:
    return FUNCTIONS[path.stem.split("-", 1)[0]]


def _parameters(base_url: str, *extra: str) -> list[str]:
    # A tick lasts its whole poll window; 4 s leaves room for a pull on a busy machine.
    return ["--parameter-overrides", f"BaseUrl={base_url}", f"ApiKeySecretArn={UNUSED_SECRET}",
            "Handlers=echo", "PollWindowSeconds=4", "LeaseRenewSeconds=1", *extra]


def _invoke(aws: LocalAws, function: str, event: Path | str, base_url: str, *extra: str,
            env: dict[str, str] | None = None) -> Any:
    return run_cli("invoke", function, "--event", str(event), *_parameters(base_url, *extra),
                   env=env if env is not None else aws.env(SW_API_KEY=API_KEY))


def _result(proc: Any) -> dict[str, Any]:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    result = json.loads(proc.stdout)  # stdout holds only the return value; logs went to stderr
    assert isinstance(result, dict)
    return result


def _one_clear_error(proc: Any) -> str:
    """Exit 2, no traceback, a last stderr line that is the project's error message."""
    assert proc.returncode == 2, f"exit {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout == ""
    errors = [line for line in proc.stderr.splitlines() if line.startswith("serverless-worker: error: ")]
    assert len(errors) == 1, proc.stderr
    return proc.stderr[proc.stderr.index("serverless-worker: error: "):]


@pytest.fixture
def pipelogiq(serve: Callable[..., SandboxServer]) -> SandboxServer:
    return serve("pipelogiq", lease_seconds=5, visibility_timeout=30, poll_interval=0.05)


@pytest.mark.parametrize("event", EVENTS, ids=lambda p: p.name)
def test_every_sample_event_runs_its_function(event: Path, local_aws: LocalAws,
                                              pipelogiq: SandboxServer) -> None:
    # when the sample event is invoked against an empty ledger
    proc = _invoke(local_aws, _function(event), event, pipelogiq.url)

    # then the function ran to completion with a Lambda-like context and returned JSON
    result = _result(proc)
    assert f"END {_function(event)} " in proc.stderr
    check = EXPECTED.get(event.stem)
    if check is not None:
        assert check(result), f"{event.name}: unexpected result {result}"


def test_scheduler_tick_pulls_and_dispatches_then_the_executor_completes_each_job(
        local_aws: LocalAws, pipelogiq: SandboxServer, admin_for: Callable[..., SandboxAdmin],
        tmp_path: Path) -> None:
    # given two echo jobs on the job server
    admin = admin_for(pipelogiq)
    admin.seed({"handler": "echo", "inputs": [{"n": 1}, {"n": 2}]})

    # when the scheduled event ticks once
    tick = _result(_invoke(local_aws, "SchedulerFunction", ROOT / "events" / "scheduler.json", pipelogiq.url))

    # then both were pulled, recorded in the ledger (in flight, not started) and dispatched
    assert tick["pulled"] == 2 and tick["dispatched"] == 2, tick
    ledger = local_aws.ledger()
    assert len(ledger) == 2
    assert all(item["status"] in ("RECORDED", "DISPATCHED") and "scope" in item for item in ledger), ledger

    # when the executor runs each with the event the scheduler sent (only the ledger key)
    for number, item in enumerate(ledger):
        event = tmp_path / f"executor-{number}.json"
        event.write_text(json.dumps({"ledger_key": item["pk"]}))
        done = _result(_invoke(local_aws, "ExecutorFunction", event, pipelogiq.url))
        assert done["ledger_key"] == item["pk"]
        assert done["action"] in ("reported", "acknowledged"), done

    # then the job server has both results, and the ledger has settled them
    jobs = admin.jobs()
    assert sorted(json.loads(job["output"])["n"] for job in jobs) == [1, 2]
    assert {job["status"] for job in jobs} == {"Completed"}
    assert all(item["status"] in ("REPORTED", "ACKNOWLEDGED") for item in local_aws.ledger())


def test_drain_stops_the_next_tick_and_resume_restarts_it(
        local_aws: LocalAws, pipelogiq: SandboxServer, admin_for: Callable[..., SandboxAdmin]) -> None:
    admin = admin_for(pipelogiq)
    events = ROOT / "events"
    drain = _result(_invoke(local_aws, "DrainFunction", events / "drain.json", pipelogiq.url))
    assert drain["shutdown_called"] is True

    admin.seed({"handler": "echo", "inputs": [{"n": 1}]})
    drained = _result(_invoke(local_aws, "SchedulerFunction", events / "scheduler.json", pipelogiq.url))
    assert drained["stopped"] == "draining" and drained["pulled"] == 0, drained

    assert _result(_invoke(local_aws, "DrainFunction", events / "drain-resume.json", pipelogiq.url)) \
        == {"resumed": True}
    resumed = _result(_invoke(local_aws, "SchedulerFunction", events / "scheduler.json", pipelogiq.url))
    assert resumed["pulled"] == 1, resumed


def test_env_vars_file_and_parameter_key_form_configure_the_function(
        local_aws: LocalAws, pipelogiq: SandboxServer, tmp_path: Path) -> None:
    # given a SAM env-vars file renaming the instance, with one variable the template does not declare
    env_file = tmp_path / "env.json"
    env_file.write_text(json.dumps({"Parameters": {"SW_INSTANCE_ID": "blue"},
                                    "SchedulerFunction": {"SW_NOT_DECLARED": "x"}}))

    # when the scheduler runs with it, BaseUrl given in the ParameterKey form
    proc = run_cli("invoke", "SchedulerFunction", "-e", "events/scheduler.json", "--env-vars", str(env_file),
                   "--parameter-overrides", f"ParameterKey=BaseUrl,ParameterValue={pipelogiq.url}",
                   f"ApiKeySecretArn={UNUSED_SECRET} PollWindowSeconds=1",
                   env=local_aws.env(SW_API_KEY=API_KEY))

    # then the session was kept for instance "blue", and the undeclared variable was reported as ignored
    _result(proc)
    assert local_aws.item("session#pipelogiq#blue") is not None
    assert local_aws.item("session#pipelogiq#local") is None
    assert "SW_NOT_DECLARED, which template.yaml does not declare" in proc.stderr


# -- one clear error for every way the setup can be wrong -----------------------------------
def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unreachable_job_server_ends_the_tick_saying_why(local_aws: LocalAws) -> None:
    # The scheduler does not fail a tick for it (the next tick retries); its report says why.
    proc = _invoke(local_aws, "SchedulerFunction", "events/scheduler.json", f"http://127.0.0.1:{_closed_port()}")

    report = _result(proc)
    assert report["stopped"] == "no session: ServerUnavailableError"
    assert report["pulls"] == 0
    assert any("bootstrap: transport failure" in error for error in report["errors"]), report


def test_misconfigured_job_server_url(local_aws: LocalAws) -> None:
    proc = _invoke(local_aws, "ExecutorFunction", "events/executor.json", "http://jobs.example.com")

    message = _one_clear_error(proc)
    assert "SW_BASE_URL: plain http:// is allowed only to loopback" in message


def test_missing_table(local_aws: LocalAws, pipelogiq: SandboxServer, tmp_path: Path) -> None:
    env_file = tmp_path / "env.json"
    env_file.write_text(json.dumps({"StepsFunction": {"SW_TABLE_NAME": "no-such-table"}}))

    proc = _invoke(local_aws, "StepsFunction", "events/steps-renew.json", pipelogiq.url,
                   "--env-vars", str(env_file))

    assert "ResourceNotFoundException" in _one_clear_error(proc)


def test_no_aws_credentials(local_aws: LocalAws, pipelogiq: SandboxServer) -> None:
    env = local_aws.env(SW_API_KEY=API_KEY)
    del env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]

    proc = _invoke(local_aws, "DrainFunction", "events/drain.json", pipelogiq.url, env=env)

    assert "NoCredentialsError" in _one_clear_error(proc)


def test_no_aws_region(local_aws: LocalAws, pipelogiq: SandboxServer) -> None:
    env = local_aws.env(SW_API_KEY=API_KEY)
    del env["AWS_DEFAULT_REGION"]

    proc = _invoke(local_aws, "ExecutorFunction", "events/executor.json", pipelogiq.url, env=env)

    assert "no AWS region configured" in _one_clear_error(proc)


def test_unreadable_api_key_secret(local_aws: LocalAws, pipelogiq: SandboxServer) -> None:
    # no SW_API_KEY: the key must come from the (absent) Secrets Manager secret
    proc = _invoke(local_aws, "DrainFunction", "events/drain.json", pipelogiq.url, env=local_aws.env())
    tick = _result(_invoke(local_aws, "SchedulerFunction", "events/scheduler.json", pipelogiq.url,
                           env=local_aws.env()))

    message = f"could not read the API key from Secrets Manager secret {UNUSED_SECRET}"
    assert message in _one_clear_error(proc)
    assert tick["stopped"] == "no session: ConfigurationError"
    assert any(message in error for error in tick["errors"]), tick


@pytest.mark.parametrize(("args", "message"), [
    (["invoke", "Scheduler", "-e", "events/scheduler.json"], "no function 'Scheduler'"),
    (["invoke", "SchedulerFunction", "-e", "events/nope.json"], "cannot read --event events/nope.json"),
    (["invoke", "SchedulerFunction", "-e", "template.yaml"], "--event template.yaml is not valid JSON"),
    (["invoke", "SchedulerFunction", "--parameter-overrides", "BaseURL=https://x"],
     "unknown parameter(s) BaseURL"),
    (["invoke", "SchedulerFunction", "--template", "nope.yaml"], "cannot read"),
])
def test_bad_arguments(local_aws: LocalAws, args: list[str], message: str) -> None:
    proc = run_cli(*args, env=local_aws.env())

    assert message in _one_clear_error(proc)
