"""CLI tier: ``serverless-worker ledger`` reads back what the worker recorded of each delivery,
from both backends: the local runner's SQLite state file, and a deployed stack's DynamoDB
table (on moto's server), found from the stack's ``StateTableName`` output.

Each list line is one delivery (job id, handler, status, outcome, attempt); ``--status`` and
``--handler`` filter; a job id shows its full record (the whole message, the deadline while
in flight, the input); ``--json`` gives the entries; no token ever shows.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path

import boto3
import pytest
from test_invoke_cli import _invoke, _result
from test_local_cli import CLI, SECRET, clean_env, local, seed
from test_local_cli import SANDBOX_KEYS as SANDBOX_KEYS  # the sandbox fixture reads it

from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin
from support.local_aws import REGION, TABLE, LocalAws, run_cli

pytestmark = pytest.mark.cli

HANDLERS = '''
from serverless_worker import BusinessError, handler


@handler("greet")
def greet(job):
    if job.input["name"] == "nobody":
        raise BusinessError("NO_ONE", "there is nobody to greet", {"greeted": False})
    if job.input["name"] == "":
        raise ValueError("an empty name\\nis not a name")
    return {"greeting": "hello " + job.input["name"]}
'''


def ledger(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``serverless-worker ledger ARGS`` in ``cwd``, without any SW_ setting of this environment."""
    return subprocess.run([str(CLI), "ledger", *args], cwd=cwd, env=clean_env(), capture_output=True, text=True,
                          timeout=60, check=False)


def test_the_local_state_file_lists_filters_and_shows_each_delivery(
        sandbox: Callable[..., tuple[SandboxServer, SandboxAdmin]], tmp_path: Path) -> None:
    # given a worker run that greeted one name, was refused one and failed on one
    server, admin = sandbox("pipelogiq")
    seed(admin, "pipelogiq", "greet", [{"name": "Ada"}, {"name": "nobody"}, {"name": ""}])
    (tmp_path / "handlers.py").write_text(HANDLERS)
    state = tmp_path / "state.sqlite3"
    worked = local("--url", server.url, "--api-key-env", "TEST_KEY", "--handler-module", "handlers.py",
                   "--until-idle", "1", "--state", str(state), env=clean_env(TEST_KEY=SECRET), cwd=tmp_path)
    assert worked.returncode == 0, worked.stdout + worked.stderr
    tokens = [json.loads(doc)["delivery"] for (doc,) in sqlite3.connect(state).execute("SELECT doc FROM items")
              if json.loads(doc)["pk"].startswith("delivery#")]

    # when the user lists the ledger (the state file local keeps in the working directory)
    listed = ledger("--state", str(state), cwd=tmp_path)

    # then one line per delivery: job id, handler, status, outcome, attempt
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert len(lines) == 3 and all("  greet  ACKNOWLEDGED  " in line for line in lines), lines
    assert sum("  success  attempt 1  " in line for line in lines) == 1
    assert any("business_error NO_ONE: there is nobody to greet" in line for line in lines), lines
    # and --status, --handler filter
    failed = ledger("--state", str(state), "--status", "failed", cwd=tmp_path).stdout.splitlines()
    assert len(failed) == 2 and not any("success" in line for line in failed), failed
    assert ledger("--state", str(state), "--handler", "other", cwd=tmp_path).stdout.startswith("no deliveries")
    # and a job id gives its full record: the whole message (every line), the type once, the input
    raised_id = next(line for line in lines if "ValueError" in line).split()[0]
    full = ledger("--state", str(state), raised_id, cwd=tmp_path).stdout
    assert "  status      ACKNOWLEDGED: settled: the server has its result\n" in full, full
    assert "  error       ValueError: an empty name\n              is not a name\n" in full, full
    assert "ValueError: ValueError" not in full
    assert '  input       {"name": ""}' in full, full
    # and --json the entries, the outcome whole
    entries = json.loads(ledger("--state", str(state), "--json", cwd=tmp_path).stdout)
    refused = next(entry for entry in entries if entry["outcome"]["kind"] == "business_error")
    assert (refused["outcome"]["code"], refused["outcome"]["value"]) == ("NO_ONE", {"greeted": False})
    assert refused["final"] is True and "input" not in refused
    # and no delivery token ever shows
    said = listed.stdout + full + json.dumps(entries)
    assert all(record["token"] not in said for record in map(json.loads, tokens) if record.get("token")), tokens


def test_a_missing_state_file_is_one_line_naming_the_options(tmp_path: Path) -> None:
    result = ledger(cwd=tmp_path)

    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("serverless-worker: error: no state file at "), lines
    assert "--stack-name" in lines[0]


@pytest.fixture
def pipelogiq(serve: Callable[..., SandboxServer]) -> SandboxServer:
    return serve("pipelogiq", lease_seconds=30, visibility_timeout=60, poll_interval=0.05)


def test_a_deployed_stacks_table_is_found_from_its_outputs(
        local_aws: LocalAws, pipelogiq: SandboxServer, admin_for: Callable[..., SandboxAdmin],
        tmp_path: Path) -> None:
    # given a deployed stack (on moto) whose scheduler took two jobs, one of which its executor ran
    admin = admin_for(pipelogiq)
    admin.seed({"handler": "echo", "inputs": [{"n": 1}, {"n": 2}]})
    tick = _result(_invoke(local_aws, "SchedulerFunction", "events/scheduler.json", pipelogiq.url))
    assert tick["dispatched"] == 2, tick
    first = local_aws.ledger()[0]
    event = tmp_path / "executor.json"
    event.write_text(json.dumps({"ledger_key": first["pk"]}))
    assert _result(_invoke(local_aws, "ExecutorFunction", event, pipelogiq.url))["action"] in ("reported",
                                                                                                "acknowledged")
    cloudformation = boto3.client("cloudformation", region_name=REGION, endpoint_url=local_aws.url,
                                  aws_access_key_id="testing", aws_secret_access_key="testing")
    cloudformation.create_stack(StackName="my-worker", TemplateBody=json.dumps({
        "Resources": {"Queue": {"Type": "AWS::SQS::Queue"}},
        "Outputs": {"StateTableName": {"Value": TABLE}}}))
    env = local_aws.env()

    # when the user lists the stack's ledger by its name
    listed = run_cli("ledger", "--stack-name", "my-worker", env=env)

    # then both deliveries are there: the one run settled, the other still in flight
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert len(lines) == 2, lines
    assert sum("  echo  ACKNOWLEDGED  success  " in line for line in lines) == 1, lines
    waiting = run_cli("ledger", "--stack-name", "my-worker", "--status", "in-flight", "--json", env=env)
    [entry] = json.loads(waiting.stdout)
    assert entry["status"] in ("RECORDED", "DISPATCHED") and entry["deadline"] is not None, entry
    assert entry["outcome"] is None and entry["final"] is False
    # and --handler and the other status words filter the table's entries as the file's
    assert len(run_cli("ledger", "--stack-name", "my-worker", "--handler", "echo", env=env).stdout.splitlines()) == 2
    assert run_cli("ledger", "--stack-name", "my-worker", "--handler", "other", env=env).stdout.startswith(
        "no deliveries")
    [done] = run_cli("ledger", "--stack-name", "my-worker", "--status", "done", env=env).stdout.splitlines()
    assert "  echo  ACKNOWLEDGED  success  " in done and done.split()[0] != entry["job_id"], done
    # and its full record says where it stands and until when
    full = run_cli("ledger", "--table-name", TABLE, entry["job_id"], env=env).stdout
    assert "taken, not started yet" in full and "  deadline    " in full, full
    # and a stack that does not exist is one line, exit 2
    missing = run_cli("ledger", "--stack-name", "no-such-stack", env=env)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing.stderr
    assert "no stack 'no-such-stack'" in missing.stderr
