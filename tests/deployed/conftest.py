"""Deployed tier: `sam build` + a plain `sam deploy` of template.yaml into LocalStack, one
stack per protocol, each against its sandbox on loopback, driven by its own schedule.

Only `make test-deployed` collects this directory (tests/conftest.py). LocalStack is the one
``scripts/container_tools.py`` picks: ``AWS_ENDPOINT_URL`` when it is set (a LocalStack already
running); else, where a Docker engine answers, LocalStack's own CLI (``localstack start``,
``wait``, ``stop``, with host networking for its Lambda containers); else the host helper
beside this repository (../shared/tools/localstack-host.sh, or ``SWTEST_LOCALSTACK_HOST``);
either of the last two started here and stopped at the end. Lambda containers use the host's
network, so the functions reach the sandboxes at 127.0.0.1.

The session fixture seeds the short-path jobs before the deploy, so the first scheduled
tick finds them; the tests then run in file order against the same three stacks. Beside
them, at no extra wait, the project ``serverless-worker init`` writes is built (while the
main stack builds) and deployed (while the main stacks deploy) as its README says
(init_project.py), with its own sandbox and jobs.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "aws"))  # aws.test_short_path imports e2e_support

from aws.conftest import Env
from deployed.aws_calls import CallRecord
from deployed.init_project import (
    GREETINGS,
    INIT_FUNCTIONS,
    INIT_PROTOCOL,
    InitStack,
    build_init_project,
    init_parameters,
)
from deployed.localstack import REGION, ROOT, DeployedStack, Sam, clients
from reliability.test_secrets import MARK, _Tokens
from serverless_worker.sandbox import create_sandbox
from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin

PROTOCOLS = ("pipelogiq", "priostack", "claimqueue")
SUMMARY_PATH = ROOT / ".aws-sam" / "deployed" / "summary.txt"
# Every handler the tier's jobs use (the claim queue pulls per queue, Pipelogiq per handler).
HANDLERS = ("e2e.validated,e2e.ghost,e2e.reject,e2e.boom,e2e.slow,"
            "long-steady,long-pages,long-callback,long-callback-patient")
SANDBOX_CONFIG: dict[str, dict[str, Any]] = {
    # A 25 s lease, which the 35 s job outlives only by renewing it: LocalStack starts a
    # container per concurrent step (seconds each on two busy cores), and a 10 s lease lapsed
    # between a slice's end and its report. Visibility well past a cold start.
    # Visibility and the claim lease well past a cold start: when the first tick fans out to a
    # dozen new containers at once on two cores, an executor can start minutes late.
    "pipelogiq": {"lease_seconds": 25, "visibility_timeout": 300, "poll_interval": 0.05},
    "priostack": {},
    "claimqueue": {"lease_seconds": 300},
}
# The parameters every stack gets; ScheduleRate is the real schedule, one tick a minute.
PARAMETERS = {
    "HandlerModule": "deployed_tier", "Handlers": HANDLERS, "ScheduleRate": "rate(1 minute)",
    # At most 3 deliveries in flight per stack (9 executor containers, not 15 cold starts at
    # once); the tick pulls on for 40 s as they finish.
    "PollWindowSeconds": "40", "Liveness": "while-work", "LeaseRenewSeconds": "2",
    "ExecutorTimeoutSeconds": "60", "ExecutorMemorySize": "256", "ExecutorReservedConcurrency": "10",
    "MaxInFlight": "3", "SchedulerTracing": "PassThrough", "LogLevel": "INFO",
    # Every function logs the AWS calls it makes, for `make iam-proof` (deployed/aws_calls.py).
    "RecordAwsCalls": "true",
}


@dataclass
class Tier:
    """The running tier: sandboxes, stacks, secrets to look for, and what the summary says."""

    sam: Sam
    envs: dict[str, Env]
    stacks: dict[str, DeployedStack]
    secrets: list[str]
    tokens: _Tokens
    started: float
    build_seconds: float = 0.0
    deploy_seconds: float = 0.0
    jobs: dict[str, Counter[str]] = field(default_factory=dict)
    schedule_ticks: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    dlq_sent_at: float = 0.0
    init: InitStack | None = None
    calls: CallRecord | None = None  # the AWS calls its functions make, for `make iam-proof`

    def line(self, ok: bool) -> str:
        def outcomes(p: str) -> str:
            return ", ".join(f"{state} {n}" for state, n in sorted(self.jobs[p].items()))

        per = "; ".join(f"{p} {sum(self.jobs[p].values())} jobs ({outcomes(p)})" for p in PROTOCOLS if p in self.jobs)
        ticks = ", ".join(f"{p} {n}" for p, n in self.schedule_ticks.items())
        extra = f"; {'; '.join(self.notes)}" if self.notes else ""
        return (f"deployed tier: {'passed' if ok else 'FAILED'}: {per or 'no jobs checked'}; "
                f"ticks from the schedule: {ticks or 'none seen'}; build {self.build_seconds:.0f} s, "
                f"deploy {self.deploy_seconds:.0f} s (3 stacks and the init stack at once), "
                f"tier {time.monotonic() - self.started:.0f} s{extra}")

    def init_line(self, ok: bool) -> str:
        init = self.init
        if init is None:
            return "init stack: FAILED before it was built"
        jobs = ", ".join(f"{state} {n}" for state, n in sorted(init.jobs.items()))
        extra = f"; {'; '.join(init.notes)}" if init.notes else ""
        return (f"init stack: {'passed' if ok else 'FAILED'}: {INIT_PROTOCOL} "
                f"{sum(init.jobs.values())} jobs ({jobs or 'none checked'}); "
                f"ticks from the schedule: {init.schedule_ticks or 'none seen'}; "
                f"init + sam build {init.build_seconds:.0f} s (beside the main build), "
                f"deploy {init.stack.deploy_seconds if init.env else 0:.0f} s (beside the main stacks){extra}")


def _container_tools() -> Any:
    """scripts/container_tools.py (the Makefile's choice of tools), loaded from its file."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("container_tools", ROOT / "scripts" / "container_tools.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["container_tools"] = module
    spec.loader.exec_module(module)
    return module


LOCALSTACK_CLI_ENDPOINT = "http://127.0.0.1:4566"
# What the host helper is given too: short async retry delays (the dead-letter check waits for
# LocalStack's second retry), Lambda containers on the host's network (they call the sandboxes).
LOCALSTACK_ENV = {"LAMBDA_RETRY_BASE_DELAY": "5", "LAMBDA_DOCKER_NETWORK": "host"}


def _answers(endpoint: str) -> bool:
    import requests

    try:
        return requests.get(f"{endpoint}/_localstack/health", timeout=5).ok
    except requests.RequestException:
        return False


def _with_localstack_cli(cli: str) -> Iterator[str]:
    """LocalStack in Docker through its own CLI, started (and stopped) here unless it runs already."""
    already = _answers(LOCALSTACK_CLI_ENDPOINT)
    if not already:
        flags = [flag for name, value in LOCALSTACK_ENV.items() for flag in ("-e", f"{name}={value}")]
        subprocess.run([cli, "start", "-d", "--network", "host", *flags], check=True, timeout=1200)
        subprocess.run([cli, "wait", "-t", "600"], check=True, timeout=660)
    os.environ["AWS_ENDPOINT_URL"] = LOCALSTACK_CLI_ENDPOINT
    try:
        yield LOCALSTACK_CLI_ENDPOINT
    finally:
        if not already:
            subprocess.run([cli, "stop"], check=False, timeout=300)


@pytest.fixture(scope="session")
def localstack() -> Iterator[str]:
    """The endpoint: AWS_ENDPOINT_URL as given, or LocalStack through its CLI (on Docker) or
    the host script (started here, with short async retry delays, and stopped at the end if
    this run started it)."""
    tools = _container_tools()
    try:
        choice = tools.choose("test-deployed", env=os.environ, helper=os.environ.get("SWTEST_LOCALSTACK_HOST"))
    except tools.NoTools as missing:
        pytest.exit(str(missing), returncode=2)
    for key, value in (("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"),
                       ("AWS_DEFAULT_REGION", REGION)):
        os.environ.setdefault(key, value)
    if choice.kind == "endpoint":
        yield choice.url
        return
    if choice.kind == "docker":
        yield from _with_localstack_cli(choice.path)
        return
    script = Path(choice.path)
    already = subprocess.run(["bash", str(script), "status"], capture_output=True, check=False).returncode == 0
    if not already:
        # LocalStack retries a failed async event after 1x and 2x this many seconds (AWS: about
        # 1 and 2 minutes); the dead-letter check waits for both.
        # Every function runs python3.13: no python3.11 image to build.
        subprocess.run(["bash", str(script), "start"], check=True, timeout=1200,
                       env={"LOCALSTACK_HOST_PYTHONS": "3.13", **os.environ, "LAMBDA_RETRY_BASE_DELAY": "5"})
    env = subprocess.run(["bash", str(script), "env"], capture_output=True, text=True, check=True).stdout
    for line in env.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        if key in ("AWS_ENDPOINT_URL", "DOCKER_HOST"):
            os.environ[key] = value
    try:
        yield os.environ["AWS_ENDPOINT_URL"]
    finally:
        if not already:
            subprocess.run(["bash", str(script), "stop"], check=False, timeout=300)


def _store_key(protocol: str, key: str, run: str) -> dict[str, str]:
    """The API key in SSM (a SecureString), or for Priostack in Secrets Manager."""
    if protocol == "priostack":
        arn = clients("secretsmanager").create_secret(Name=f"sw-deployed/{run}/{protocol}",
                                                      SecretString=key)["ARN"]
        return {"ApiKeySecretArn": arn}
    name = f"/sw-deployed/{run}/{protocol}/api-key"
    clients("ssm").put_parameter(Name=name, Value=key, Type="SecureString", Overwrite=True)
    return {"ApiKeyParameterName": name}


def _sandbox(protocol: str, key: str) -> SandboxServer:
    auth: dict[str, Any] = {"pipelogiq": {"api_keys": {key: 12}}, "priostack": {"api_keys": [key]},
                            "claimqueue": {"tokens": [key]}}[protocol]
    return SandboxServer(create_sandbox(protocol, **SANDBOX_CONFIG[protocol], **auth)).start()


BUILD_DIR = ROOT / ".aws-sam" / "deployed" / "build"


@pytest.fixture(scope="session")
def call_record(localstack: str) -> Iterator[CallRecord]:
    """The AWS calls of every stack deployed with RecordAwsCalls, written at the session's
    end for `make iam-proof` (while LocalStack still runs: this outlasts the stacks' fixtures)."""
    record = CallRecord(template=BUILD_DIR / "template.yaml")
    yield record
    if record.stacks:
        # Not captured (this runs after the last test): `make test-deployed` shows it last but one.
        try:
            print(f"\naws calls recorded for the IAM proof: {record.write()}", file=sys.__stdout__)
        except Exception:  # the proof then says the record is missing; the tier's own result stands
            print(f"\naws calls not recorded for the IAM proof:\n{traceback.format_exc()}", file=sys.__stdout__)


@pytest.fixture(scope="session")
def tier(localstack: str, call_record: CallRecord) -> Iterator[Tier]:
    from aws.test_short_path import _seed_outcomes
    from serverless_worker.sandbox import pipelogiq as pipelogiq_sandbox

    started = time.monotonic()
    run = uuid.uuid4().hex[:6]
    sam = Sam(sam=str(ROOT / ".venv-sam" / "bin" / "sam"), build_dir=BUILD_DIR,
              bucket=f"sw-deployed-{run}", log_dir=ROOT / ".aws-sam" / "deployed" / "logs")
    tokens = _Tokens()  # Pipelogiq session and delivery tokens that carry MARK
    original_secrets = pipelogiq_sandbox.secrets
    pipelogiq_sandbox.secrets = tokens  # type: ignore[assignment]
    servers: list[SandboxServer] = []
    stacks: dict[str, DeployedStack] = {}
    tier_: Tier | None = None
    init_dir = tempfile.TemporaryDirectory(prefix="sw-deployed-init-")
    background = ThreadPoolExecutor(1)
    try:
        # The init project builds while the main stack does.
        init_build = background.submit(build_init_project, sam, Path(init_dir.name), f"sw-init-{run}")
        build_seconds = sam.build()
        clients("s3").create_bucket(Bucket=sam.bucket)
        _BUILT.append(sam)
        envs: dict[str, Env] = {}
        keys: list[str] = []
        for protocol in PROTOCOLS:
            key = f"{MARK}-{protocol}-key-{secrets.token_hex(8)}"
            keys.append(key)
            server = _sandbox(protocol, key)
            servers.append(server)
            assert server.url.startswith("http://127.0.0.1:"), server.url
            stack = DeployedStack(name=f"sw-deployed-{protocol}-{run}", protocol=protocol, parameters={
                **PARAMETERS, "Protocol": protocol, "BaseUrl": server.url, **_store_key(protocol, key, run)})
            stacks[protocol] = stack
            envs[protocol] = Env(protocol, server, SandboxAdmin(server.url), stack)  # type: ignore[arg-type]
            _seed_outcomes(envs[protocol])  # before the deploy: the first scheduled tick takes them
        tier_ = Tier(sam=sam, envs=envs, stacks=stacks, secrets=keys, tokens=tokens, started=started,
                     build_seconds=build_seconds, calls=call_record)

        init = tier_.init = init_build.result()
        key = f"{MARK}-init-key-{secrets.token_hex(8)}"
        keys.append(key)
        server = _sandbox(INIT_PROTOCOL, key)
        servers.append(server)
        name = init.project.name  # the README names the stack after the project
        init_stack = DeployedStack(name=name, protocol=INIT_PROTOCOL, functions=INIT_FUNCTIONS,
                                   parameters=init_parameters(name, server.url, key))
        init.env = Env(INIT_PROTOCOL, server, SandboxAdmin(server.url), init_stack)  # type: ignore[arg-type]
        init.topic_arn = init_stack.parameters["AlarmTopicArn"]
        init.env.seed("greet", GREETINGS)  # before the deploy, as for the main stacks
        templates = {init_stack.name: init.template}

        def deploy(stack: DeployedStack) -> None:
            stack.deploy_seconds = sam.deploy(stack.name, stack.parameters, templates.get(stack.name))
            stack.load_outputs()
            if stack.name not in templates:  # the main template's stacks record their AWS calls
                call_record.deployed(stack)

        deploy_started = time.monotonic()
        every = [*stacks.values(), init_stack]
        with ThreadPoolExecutor(len(every)) as pool:
            for future in [pool.submit(deploy, s) for s in every]:
                future.result()
        tier_.deploy_seconds = time.monotonic() - deploy_started
        yield tier_
    finally:
        if tier_ is not None:
            _FINISHED.append(tier_)
        background.shutdown(wait=True)
        leftover = list(stacks.values())
        if tier_ is not None and tier_.init is not None and tier_.init.env is not None:
            if tier_.init.delete is not None:
                try:
                    tier_.init.delete.result(timeout=600)
                except Exception as err:  # the test reports it; below, the delete is tried again
                    print(f"teardown: the init stack's sam delete: {err}")
            leftover.append(tier_.init.stack)
        for stack in leftover:  # whatever the sam delete tests did not remove
            try:
                clients("cloudformation").describe_stacks(StackName=stack.name)
            except Exception:
                continue
            try:
                sam.delete(stack.name)
            except Exception as err:
                print(f"teardown: sam delete {stack.name}: {err}")
        for server in servers:
            server.stop()
        pipelogiq_sandbox.secrets = original_secrets
        init_dir.cleanup()


_FINISHED: list[Tier] = []
_BUILT: list[Sam] = []  # this session's build (the tier's), reused by the self-pull stack

# The self-pull stack (test_deployed_self_pull.py): the same template and parameters, with
# executors that keep pulling (SelfPull=true as a parameter override) and handlers that
# declare a timeout (only those are pulled that way). Priostack: a handed-back job is
# activated again at once, where a claim-queue item would wait out its lease.
SELF_PULL_PROTOCOL = "priostack"
SELF_PULL_PARAMETERS = {"SelfPull": "true", "Handlers": "e2e.echo-timed,e2e.slow-timed-long", "MaxInFlight": "3",
                        "PollWindowSeconds": "20"}


@pytest.fixture(scope="module")
def self_pull_stack(localstack: str, call_record: CallRecord) -> Iterator[Env]:
    """One stack deployed with ``SelfPull=true`` against its own sandbox, deleted afterwards;
    built by this session's tier if it ran, else here."""
    run = uuid.uuid4().hex[:6]
    if _BUILT:
        sam = _BUILT[-1]
    else:
        sam = Sam(sam=str(ROOT / ".venv-sam" / "bin" / "sam"), build_dir=BUILD_DIR,
                  bucket=f"sw-deployed-sp-{run}", log_dir=ROOT / ".aws-sam" / "deployed" / "logs")
        sam.build()
        clients("s3").create_bucket(Bucket=sam.bucket)
        _BUILT.append(sam)
    key = f"{MARK}-self-pull-key-{secrets.token_hex(8)}"
    server = _sandbox(SELF_PULL_PROTOCOL, key)
    stack = DeployedStack(name=f"sw-deployed-self-pull-{run}", protocol=SELF_PULL_PROTOCOL, parameters={
        **PARAMETERS, **SELF_PULL_PARAMETERS, "Protocol": SELF_PULL_PROTOCOL, "BaseUrl": server.url,
        **_store_key(SELF_PULL_PROTOCOL, key, run)})
    env = Env(SELF_PULL_PROTOCOL, server, SandboxAdmin(server.url), stack)  # type: ignore[arg-type]
    try:
        stack.deploy_seconds = sam.deploy(stack.name, stack.parameters)
        stack.load_outputs()
        call_record.deployed(stack)
        yield env
    finally:
        try:
            call_record.collect(stack)
        except Exception as err:
            print(f"teardown: the AWS calls of {stack.name} not collected: {err}", file=sys.__stdout__)
        try:
            sam.delete(stack.name)
        except Exception as err:
            print(f"teardown: sam delete {stack.name}: {err}")
        env.admin.close()
        server.stop()


def pytest_sessionstart(session: pytest.Session) -> None:
    SUMMARY_PATH.unlink(missing_ok=True)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The closing `deployed tier:` line (also written where `make test-deployed` prints it last)."""
    if not _FINISHED:
        return
    stats = terminalreporter.stats

    def passed(init: bool) -> bool:
        """Every test of the main stacks (or of the init stack) passed, and one at least; a
        fixture error (no node id of either kind) fails both."""
        def reports(outcome: str) -> list[Any]:
            return [r for r in stats.get(outcome, []) if init is ("test_init_stack" in getattr(r, "nodeid", ""))]

        return bool(reports("passed")) and not reports("failed") and not stats.get("error")

    lines = [_FINISHED[-1].line(passed(init=False)), _FINISHED[-1].init_line(passed(init=True))]
    SUMMARY_PATH.parent.mkdir(parents=True, exist_ok=True)
    SUMMARY_PATH.write_text("".join(line + "\n" for line in lines))
    for line in lines:
        terminalreporter.write_line(line)
