"""``make sam-local-invoke``: every function of the built stack, in a Lambda container, with
every sample event in events/, checked.

Steps: ``sam build``; the container engine ``scripts/container_tools.py`` picks: a Docker
engine that answers, on which ``sam local invoke`` runs as SAM documents it (pulling its
images itself), else the host helper beside this repository
(``../shared/tools/sam-local-podman.sh``, or ``SAM_LOCAL_PODMAN``: podman behind a Docker API
and a locally built python3.13 Lambda image, started here and stopped at the end); with
neither, one line saying what to install, exit 2. Then ``sam local invoke`` each function
with each of its events (``events/<handler dir>[-<variant>].json``).

What is checked: the layer resolves and the handlers import inside the container (no
``Runtime.*`` error), and because a container cannot reach the host's loopback (nor AWS
from a machine that reaches only package registries), each invocation ends in the
project's one clear error, never a botocore traceback:

- ``valid`` pass: valid settings, job server at the host's 127.0.0.1 (unreachable
  from the container): each function returns the project's error type (its message naming
  the secret, DynamoDB or the job server), or, for the scheduler, a tick report whose
  ``stopped``/``errors`` say why it could not start.
- ``misconfigured`` pass: ``BaseUrl=http://jobs.example.com`` (plain http off loopback):
  every function fails with ``ConfigurationError`` naming ``SW_BASE_URL``.

The project ``serverless-worker init`` writes gets the same treatment, as a user's would:
it is written into a temporary directory and built with ``sam build`` while the stack above
builds and runs, then its executor (both passes) and its scheduler (valid pass) are invoked
in the same engine session, from the wheel its ``vendor/`` holds.

The containers get placeholder AWS credentials and a closed loopback port as their AWS
endpoint, so a run never sends anything towards AWS. Both templates set
``AWS_ENDPOINT_URL`` from ``AwsEndpointUrl`` through ``Fn::If``, which ``sam local`` leaves
unresolved (it passes such a variable as an empty string, and boto3 then calls AWS), so
the endpoint goes in through ``--env-vars`` as well, which overrides a declared variable.

Usage (the Makefile passes these)::

    .venv/bin/python scripts/sam_local_invoke.py --sam .venv-sam/bin/sam --sam-python .venv-sam/bin/python
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from container_tools import NoTools, choose  # scripts/, this script's own directory, is on sys.path

ROOT = Path(__file__).resolve().parents[1]
PODMAN_SOCKET = "unix:///run/podman/podman.sock"
# The job server a developer runs on the host: the container cannot reach it.
HOST_JOB_SERVER = "http://127.0.0.1:8081"
MISCONFIGURED_JOB_SERVER = "http://jobs.example.com"
PLACEHOLDER_SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:sam-local-placeholder"
# Every AWS call of the functions goes here (AWS_ENDPOINT_URL, by --env-vars): a closed port on
# the container's own loopback, so each is refused at once and none is sent towards AWS.
CLOSED_AWS_ENDPOINT = "http://127.0.0.1:9"
INVOKE_TIMEOUT = 240
# The Lambda runtime of template.yaml: the podman shim builds that image.
LAMBDA_PYTHON_VERSION = "3.13"
# The init project's invocations: (scenario, function, its sample event in the project).
INIT_CASES = (("valid", "ExecutorFunction", "events/executor.json"),
              ("valid", "SchedulerFunction", "events/scheduler.json"),
              ("misconfigured", "ExecutorFunction", "events/executor.json"))


@dataclass
class Outcome:
    function: str
    event: str
    scenario: str
    seconds: float
    ok: bool
    summary: str


def project_error_names() -> set[str]:
    """Every ServerlessWorkerError subclass name: what ``errorType`` may be."""
    import serverless_worker
    from serverless_worker.errors import ServerlessWorkerError

    for module in pkgutil.walk_packages(serverless_worker.__path__, "serverless_worker."):
        try:
            importlib.import_module(module.name)
        except Exception:  # an optional module (sandbox, local) may miss its extra
            continue
    names, todo = set(), [ServerlessWorkerError]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return names


def functions_and_events() -> list[tuple[str, Path]]:
    """(logical id, event file) for each events/<handler dir>[-variant].json."""
    from serverless_worker.stack import ResolvedTemplate

    template = ResolvedTemplate.load(ROOT / "template.yaml")
    by_dir = {template.function(name).handler.split("/", 1)[0]: name for name in template.function_ids()}
    pairs = []
    for event in sorted((ROOT / "events").glob("*.json")):
        function = by_dir.get(event.stem.split("-", 1)[0])
        if function is None:
            raise SystemExit(f"sam-local-invoke: {event.name} matches no function's handler directory")
        pairs.append((function, event))
    missing = set(by_dir.values()) - {function for function, _ in pairs}
    if missing:
        raise SystemExit(f"sam-local-invoke: no sample event for {', '.join(sorted(missing))}")
    return pairs


Completed = subprocess.CompletedProcess[str]


def run(cmd: list[str], *, env: dict[str, str], timeout: float, cwd: Path = ROOT) -> tuple[Completed, float]:
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)
    return proc, time.monotonic() - started


def endpoint_env_vars(directory: Path) -> Path:
    """The ``--env-vars`` file that sets every function's AWS_ENDPOINT_URL to the closed port."""
    path = directory / "aws-endpoint-env.json"
    path.write_text(json.dumps({"Parameters": {"AWS_ENDPOINT_URL": CLOSED_AWS_ENDPOINT}}))
    return path


def build_init_project(sam: str, parent: Path, env: dict[str, str]) -> tuple[Path, float]:
    """``serverless-worker init`` into ``parent``, then ``sam build`` there as its README says
    (the layer from the wheel in its vendor/, with the python3.13 of PYTHON on the PATH).
    Returns the project and the time both took; raises with the output when one fails."""
    project = parent / "sw-local-app"
    command = shutil.which("serverless-worker", path=str(Path(sys.executable).parent)) or "serverless-worker"
    started = time.monotonic()
    proc, _ = run([command, "init", str(project)], env=env, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"serverless-worker init failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    python = os.environ.get("PYTHON") or shutil.which("python3.13")
    build_env = dict(env)
    if python:
        build_env["PATH"] = os.pathsep.join([str(Path(python).parent), env.get("PATH", "")])
    proc, _ = run([sam, "build"], env=build_env, timeout=900, cwd=project)
    if proc.returncode != 0:
        raise RuntimeError(f"sam build of the init project failed: {proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return project, time.monotonic() - started


def invoke_init_project(sam: str, project: Path, env: dict[str, str], errors: set[str],
                        env_vars: Path, pull: list[str]) -> list[Outcome]:
    """The init project's functions in a container, checked as the stack's are."""
    outcomes = []
    for scenario, function, event in INIT_CASES:
        base_url = HOST_JOB_SERVER if scenario == "valid" else MISCONFIGURED_JOB_SERVER
        cmd = [sam, "local", "invoke", function, "-e", event, *pull, "--parameter-overrides",
               f"BaseUrl={base_url}", f"ApiKeySecretArn={PLACEHOLDER_SECRET}",
               f"AwsEndpointUrl={CLOSED_AWS_ENDPOINT}", "--env-vars", str(env_vars)]
        proc, seconds = run(cmd, env=env, timeout=INVOKE_TIMEOUT, cwd=project)
        ok, summary = check(function, scenario, proc, errors)
        label = f"init {function}"
        outcomes.append(Outcome(label, Path(event).name, scenario, seconds, ok, summary))
        print(f"{'ok  ' if ok else 'FAIL'} {scenario:13} {label:22} {Path(event).name:29} "
              f"{seconds:5.1f} s  {summary}", flush=True)
        if not ok:
            print(proc.stderr[-4000:], file=sys.stderr)
    return outcomes


def sam_env(docker_host: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(SAM_CLI_TELEMETRY="0", AWS_ACCESS_KEY_ID="sam-local-placeholder",
               AWS_SECRET_ACCESS_KEY="sam-local-placeholder", AWS_DEFAULT_REGION="us-east-1",
               AWS_REGION="us-east-1")
    if docker_host:
        env["DOCKER_HOST"] = docker_host
    return env


def parse_output(stdout: str) -> Any:
    """sam prints the function's return value (or the runtime's error object) last on stdout."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    return None


def check(function: str, scenario: str, proc: Completed, errors: set[str]) -> tuple[bool, str]:
    output = parse_output(proc.stdout)
    everything = proc.stdout + proc.stderr
    if proc.returncode != 0 or output is None:
        return False, f"sam exited {proc.returncode}: {proc.stderr.strip().splitlines()[-3:]}"
    if "Runtime.ImportModuleError" in everything or "Runtime.HandlerNotFound" in everything:
        return False, "the handler did not import in the container (layer not resolved?)"
    error_type = output.get("errorType") if isinstance(output, dict) else None
    message = str(output.get("errorMessage", "")) if isinstance(output, dict) else ""
    if scenario == "misconfigured":
        if error_type != "ConfigurationError" or "SW_BASE_URL" not in message:
            return False, f"expected ConfigurationError naming SW_BASE_URL, got {output}"
        return True, f"{error_type}: {message.splitlines()[-1].strip()[:90]}"
    if error_type is not None:
        if error_type not in errors:
            return False, f"errorType {error_type} is not one of the project's errors: {message[:200]}"
        if not message or "Traceback" in message:
            return False, f"{error_type} without a clear message: {message[:200]}"
        trace = json.dumps(output.get("stackTrace", []))
        if "/opt/python/serverless_worker/" not in trace:
            return False, f"{error_type} did not come from the layer's package: {trace[:200]}"
        return True, f"{error_type}: {message[:110]}"
    if function == "SchedulerFunction" and str(output.get("stopped", "")).startswith("no session") \
            and output.get("errors"):
        return True, f"tick stopped ({output['stopped']}): {output['errors'][0][:90]}"
    return False, f"expected the project's error (the job server and AWS are unreachable), got {output}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sam", default=str(ROOT / ".venv-sam" / "bin" / "sam"))
    parser.add_argument("--sam-python", default=str(ROOT / ".venv-sam" / "bin" / "python"),
                        help="the SAM CLI's interpreter (the podman script builds its image with it)")
    parser.add_argument("--podman-script", default=os.environ.get("SAM_LOCAL_PODMAN"),
                        help="the podman host helper (SAM_LOCAL_PODMAN); empty: the Docker engine already running; "
                             "unset: Docker where it answers, else ../shared/tools/sam-local-podman.sh")
    parser.add_argument("--skip-build", action="store_true")
    parser.add_argument("--skip-init-project", action="store_true",
                        help="invoke only template.yaml's functions, not those of the project `init` writes")
    args = parser.parse_args(argv)

    try:
        engine = choose("sam-local-invoke", env=os.environ, helper=args.podman_script)
    except NoTools as missing:
        print(missing, file=sys.stderr)
        return 2
    podman = Path(engine.path) if engine.kind == "host" else None
    print(f"container engine: {'podman through ' + str(podman) if podman else 'Docker'}", flush=True)
    errors = project_error_names()
    pairs = functions_and_events()
    env = sam_env(PODMAN_SOCKET if podman is not None else os.environ.get("DOCKER_HOST"))
    timings: dict[str, float] = {}
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="sw-sam-local-init-") as scratch, ThreadPoolExecutor(1) as background:
        # The init project builds while the stack builds and the engine starts.
        init_build = None if args.skip_init_project else background.submit(
            build_init_project, os.path.abspath(args.sam), Path(scratch), env)
        env_vars = endpoint_env_vars(Path(scratch))
        status = invoke_all(args, podman, env, errors, pairs, init_build, env_vars, timings, outcomes)
    if status is not None:
        return status
    failed = [o for o in outcomes if not o.ok]
    total = sum(o.seconds for o in outcomes)
    print(f"sam local invoke: {len(outcomes) - len(failed)}/{len(outcomes)} ok in {total:.0f} s "
          f"({total / max(1, len(outcomes)):.1f} s each)"
          + "".join(f"; {name} {seconds:.0f} s" for name, seconds in timings.items()))
    return 1 if failed else 0


def invoke_all(args: argparse.Namespace, podman: Path | None, env: dict[str, str], errors: set[str],
               pairs: list[tuple[str, Path]], init_build: Future[tuple[Path, float]] | None, env_vars: Path,
               timings: dict[str, float], outcomes: list[Outcome]) -> int | None:
    """Build, start the engine, invoke everything into ``outcomes``; an exit status if a step
    before the invocations failed, else None. On podman the Lambda image is built locally
    (``--skip-pull-image``); on Docker SAM pulls its own, as it documents."""
    pull = ["--skip-pull-image"] if podman is not None else []
    if not args.skip_build:
        proc, timings["sam build"] = run([args.sam, "build"], env=env, timeout=900)
        print(f"sam build: {timings['sam build']:.1f} s", flush=True)
        if proc.returncode != 0:
            print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
            return 1
    try:
        if podman is not None:
            start = ["bash", str(podman), "start", args.sam_python, LAMBDA_PYTHON_VERSION]
            proc, timings["podman start"] = run(start, env=env, timeout=900)
            print(f"podman start: {timings['podman start']:.1f} s", flush=True)
            if proc.returncode != 0:
                print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
                return 1
        scenarios = [("valid", HOST_JOB_SERVER, pairs)]
        first_event = {}
        for function, event in pairs:
            first_event.setdefault(function, event)
        scenarios.append(("misconfigured", MISCONFIGURED_JOB_SERVER, sorted(first_event.items())))
        for scenario, base_url, cases in scenarios:
            for function, event in cases:
                cmd = [args.sam, "local", "invoke", function, "-e", str(event.relative_to(ROOT)),
                       *pull, "--parameter-overrides", f"BaseUrl={base_url}",
                       f"ApiKeySecretArn={PLACEHOLDER_SECRET}", "PollWindowSeconds=2",
                       f"AwsEndpointUrl={CLOSED_AWS_ENDPOINT}", "--env-vars", str(env_vars)]
                proc, seconds = run(cmd, env=env, timeout=INVOKE_TIMEOUT)
                ok, summary = check(function, scenario, proc, errors)
                outcomes.append(Outcome(function, event.name, scenario, seconds, ok, summary))
                print(f"{'ok  ' if ok else 'FAIL'} {scenario:13} {function:17} {event.name:34} "
                      f"{seconds:5.1f} s  {summary}", flush=True)
                if not ok:
                    print(proc.stderr[-4000:], file=sys.stderr)
        if init_build is not None:
            try:
                project, timings["init project: init + sam build"] = init_build.result()
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:
                print(f"FAIL init project: {err}", file=sys.stderr)
                outcomes.append(Outcome("init", "-", "build", 0.0, False, str(err)[:200]))
            else:
                outcomes += invoke_init_project(os.path.abspath(args.sam), project, env, errors, env_vars, pull)
    finally:
        if podman is not None:
            # sam rebuilds the image of a template-local layer on every invoke; drop the untagged ones.
            subprocess.run(["podman", "image", "prune", "--force"], cwd=ROOT, env=env, check=False,
                           capture_output=True, timeout=300)
            subprocess.run(["bash", str(podman), "stop"], cwd=ROOT, env=env, check=False, timeout=120)
            print("podman stopped", flush=True)
    return None


if __name__ == "__main__":
    sys.exit(main())
