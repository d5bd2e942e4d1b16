"""``make sam-local-invoke``: every function of the built stack, in a Lambda container, with
every sample event in events/, checked.

Steps: ``sam build``; start a container engine (podman through
``../shared/tools/sam-local-podman.sh``, which gives ``sam local`` a Docker API and a
python3.13 Lambda image on machines without Docker); ``sam local invoke`` each function
with each of its events (``events/<handler dir>[-<variant>].json``); stop the engine.

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

The containers get placeholder AWS credentials and a closed loopback port as their AWS
endpoint (``AwsEndpointUrl``), so a run never sends anything towards AWS.

Usage (the Makefile passes these)::

    .venv/bin/python scripts/sam_local_invoke.py --sam .venv-sam/bin/sam --sam-python .venv-sam/bin/python
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PODMAN_SCRIPT = ROOT.parent / "shared" / "tools" / "sam-local-podman.sh"
PODMAN_SOCKET = "unix:///run/podman/podman.sock"
# The job server a developer runs on the host: the container cannot reach it.
HOST_JOB_SERVER = "http://127.0.0.1:8081"
MISCONFIGURED_JOB_SERVER = "http://jobs.example.com"
PLACEHOLDER_SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:sam-local-placeholder"
# Every AWS call of the functions goes here (the AwsEndpointUrl parameter): a closed port on
# the container's own loopback, so each is refused at once and none is sent towards AWS.
CLOSED_AWS_ENDPOINT = "http://127.0.0.1:9"
INVOKE_TIMEOUT = 240
# The Lambda runtime of template.yaml: the podman shim builds that image.
LAMBDA_PYTHON_VERSION = "3.13"


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


def run(cmd: list[str], *, env: dict[str, str], timeout: float) -> tuple[Completed, float]:
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)
    return proc, time.monotonic() - started


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
    parser.add_argument("--podman-script",
                        default=os.environ.get("SAM_LOCAL_PODMAN", str(DEFAULT_PODMAN_SCRIPT)),
                        help="the podman shim; an empty value uses the Docker engine already running")
    parser.add_argument("--skip-build", action="store_true")
    args = parser.parse_args(argv)

    podman = Path(args.podman_script) if args.podman_script else None
    if podman is not None and not podman.is_file():
        print(f"sam-local-invoke: the podman shim is not at {podman}. It comes from the shared/ checkout "
              "beside this repository (../shared/tools/sam-local-podman.sh); set SAM_LOCAL_PODMAN=PATH, or "
              "SAM_LOCAL_PODMAN= (empty) to use a Docker engine that is already running.", file=sys.stderr)
        return 2
    errors = project_error_names()
    pairs = functions_and_events()
    env = sam_env(PODMAN_SOCKET if podman is not None else os.environ.get("DOCKER_HOST"))
    timings: dict[str, float] = {}
    outcomes: list[Outcome] = []

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
                       "--skip-pull-image", "--parameter-overrides", f"BaseUrl={base_url}",
                       f"ApiKeySecretArn={PLACEHOLDER_SECRET}", "PollWindowSeconds=2",
                       f"AwsEndpointUrl={CLOSED_AWS_ENDPOINT}"]
                proc, seconds = run(cmd, env=env, timeout=INVOKE_TIMEOUT)
                ok, summary = check(function, scenario, proc, errors)
                outcomes.append(Outcome(function, event.name, scenario, seconds, ok, summary))
                print(f"{'ok  ' if ok else 'FAIL'} {scenario:13} {function:17} {event.name:34} "
                      f"{seconds:5.1f} s  {summary}", flush=True)
                if not ok:
                    print(proc.stderr[-4000:], file=sys.stderr)
    finally:
        if podman is not None:
            # sam rebuilds the image of a template-local layer on every invoke; drop the untagged ones.
            subprocess.run(["podman", "image", "prune", "--force"], cwd=ROOT, env=env, check=False,
                           capture_output=True, timeout=300)
            subprocess.run(["bash", str(podman), "stop"], cwd=ROOT, env=env, check=False, timeout=120)
            print("podman stopped", flush=True)

    failed = [o for o in outcomes if not o.ok]
    total = sum(o.seconds for o in outcomes)
    print(f"sam local invoke: {len(outcomes) - len(failed)}/{len(outcomes)} ok in {total:.0f} s "
          f"({total / max(1, len(outcomes)):.1f} s each)"
          + "".join(f"; {name} {seconds:.0f} s" for name, seconds in timings.items()))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
