"""(d) Cold start: a fresh process imports a function's entry point (``functions/<fn>/app.py``,
with ``functions/`` on the path as Lambda's code root) and builds the runtime
(``services_from_environment()`` and the protocol client), next to ``python -c "import boto3"``.

The environment points at dummy loopback values and the API key comes from ``SW_API_KEY``,
so nothing touches the network (in AWS the key is read from Secrets Manager on the first
call instead, one request more). Both sides are timed the same way, as the wall time of the
whole process, interleaved round by round so a busy machine skews both alike; the medians
are compared. Each process's CPU time (user + system) is recorded too: on a shared machine it
moves less than wall time.

Both sides run with compiled bytecode, as boto3 has it in site-packages: one unmeasured
warm-up round writes every module's ``.pyc`` to a private cache (``PYTHONPYCACHEPREFIX``),
so a ``PYTHONDONTWRITEBYTECODE`` environment or sources edited since the last run do not
make our side compile its modules while boto3's side does not.

AWS clients are built on first use, so the runtime built here has none yet. A separate,
untimed run of each probe then also builds the DynamoDB client, which every function does
on its first call (``first_client_s``): what the cold start no longer pays, but the first
invocation does.

Run alone: ``python -m benchmarks.coldstart [--rounds N] [--protocols ...]``; with
``--instructions`` it counts CPU instructions under valgrind instead, which a shared machine's
load does not move. With ``--built .aws-sam/build`` it measures what ``sam build`` ships, as
Lambda runs it: each function's code root and the layer's ``python/`` on the path, and no
bytecode written (Lambda's code directories are read-only), so a module the build left
without bytecode is compiled in every measured run, as in every real cold start.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["FUNCTIONS", "PROTOCOLS", "count_instructions", "measure_coldstart", "probe_environment"]

ROOT = Path(__file__).resolve().parent.parent
FUNCTIONS = ("scheduler", "executor", "steps", "drain")
PROTOCOLS = ("pipelogiq", "priostack", "claimqueue")
PYCACHE = Path(tempfile.gettempdir()) / "serverless-worker-coldstart-pycache"

_PROBE = """
import importlib.util, json, sys, time
t0 = time.perf_counter()
root, fn = sys.argv[1], sys.argv[2]
sys.path.insert(0, root)
spec = importlib.util.spec_from_file_location(fn + "_app", f"{root}/{fn}/app.py")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
t1 = time.perf_counter()
from serverless_worker.runtime.entry import services_from_environment
services = services_from_environment()
services.protocol
t2 = time.perf_counter()
out = {"import_s": t1 - t0, "init_s": t2 - t1, "modules": len(sys.modules)}
if sys.argv[3:] == ["first-client"]:  # a separate, untimed run: what the first call adds
    client = getattr(services.store, "_client", None)
    getattr(client, "client", client)  # a LazyClient builds the real one here
    out["first_client_s"] = time.perf_counter() - t2
print(json.dumps(out))
"""
_BASELINE = "import boto3"


def probe_environment(protocol: str) -> dict[str, str]:
    """The probe's environment: dummy loopback settings, no network, a private bytecode cache."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SW_", "AWS_", "POWERTOOLS_", "PYDANTIC_"))
           and k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    env.update({
        "PYTHONPYCACHEPREFIX": str(PYCACHE),
        "SW_PROTOCOL": protocol,
        "SW_BASE_URL": "http://127.0.0.1:9",
        "SW_API_KEY": "coldstart-dummy-key",
        "SW_HANDLER_MODULE": "handlers",  # template.yaml's default, relative to the code root
        "SW_INSTANCE_ID": "coldstart",
        "SW_TABLE_NAME": "coldstart-table",
        "SW_EXECUTOR_FUNCTION_NAME": "coldstart-executor",
        "SW_STATE_MACHINE_ARN": "arn:aws:states:us-east-1:123456789012:stateMachine:coldstart-worker",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "coldstart",
        "AWS_SECRET_ACCESS_KEY": "coldstart",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
        "POWERTOOLS_SERVICE_NAME": "serverless-worker",
        "POWERTOOLS_METRICS_NAMESPACE": "ServerlessWorker",
    })
    return env


def _built_environment(protocol: str, built: Path) -> dict[str, str]:
    """The probe's environment for a ``sam build`` output: its layer, only its own bytecode."""
    env = probe_environment(protocol)
    del env["PYTHONPYCACHEPREFIX"]
    env.update({"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(built / "RuntimeLayer" / "python")})
    return env


def _case(fn: str, protocol: str, built: Path | None) -> tuple[list[str], dict[str, str]]:
    """The probe's command line and environment for one function: from the source tree, or
    from a ``sam build`` output (``<Function>Function/`` as the code root)."""
    if built is None:
        return [sys.executable, "-c", _PROBE, str(ROOT / "functions"), fn], probe_environment(protocol)
    root = built / f"{fn.capitalize()}Function"
    return [sys.executable, "-c", _PROBE, str(root), fn], _built_environment(protocol, built)


def _timed(args: list[str], env: dict[str, str]) -> tuple[float, float, dict[str, Any]]:
    """Wall time, CPU time (user + system) and the probe's own JSON line of one process."""
    before = os.times()
    started = time.perf_counter()
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120, check=False)
    wall = time.perf_counter() - started
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    if done.returncode != 0:
        raise RuntimeError(f"cold-start probe failed: {done.stderr.strip()[-1500:]}")
    lines = done.stdout.strip().splitlines()
    return wall, cpu, (json.loads(lines[-1]) if lines else {})


def measure_coldstart(rounds: int, cases: list[tuple[str, str]] | None = None,
                      built: Path | None = None) -> dict[str, Any]:
    """``cases``: (function, protocol) pairs; each one's median next to boto3's. ``built``: a
    ``sam build`` output to measure instead of the source tree."""
    cases = cases or [(fn, "pipelogiq") for fn in FUNCTIONS]
    baseline: list[tuple[float, float]] = []
    runs: dict[str, list[tuple[float, float, dict[str, Any]]]] = {f"{fn}/{p}": [] for fn, p in cases}
    env0 = probe_environment("pipelogiq")
    for round_ in range(rounds + 1):  # round 0 warms the bytecode cache and is not counted
        wall, cpu, _ = _timed([sys.executable, "-c", _BASELINE], env0)
        if round_:
            baseline.append((wall, cpu))
        for fn, protocol in cases:
            args, env = _case(fn, protocol, built)
            run = _timed(args, env)
            if round_:
                first = _timed([*args, "first-client"], env)[2]
                runs[f"{fn}/{protocol}"].append((run[0], run[1], {**run[2], "first_client_s": first["first_client_s"]}))
    boto3 = statistics.median(w for w, _ in baseline)
    boto3_cpu = statistics.median(c for _, c in baseline)
    results = {}
    for key, values in runs.items():
        median = statistics.median(w for w, _, _ in values)
        cpu = statistics.median(c for _, c, _ in values)
        results[key] = {
            "median_s": median,
            "ratio_to_boto3": median / boto3,
            "cpu_s": cpu,
            "cpu_ratio_to_boto3": cpu / boto3_cpu if boto3_cpu else None,
            "import_s": statistics.median(d["import_s"] for _, _, d in values),
            "init_s": statistics.median(d["init_s"] for _, _, d in values),
            "first_client_s": statistics.median(d.get("first_client_s", 0.0) for _, _, d in values),
            "modules": values[-1][2].get("modules"),
        }
    return {"rounds": rounds, "built": str(built) if built else None, "boto3_import_median_s": boto3,
            "boto3_cpu_median_s": boto3_cpu, "load_average": "/".join(f"{x:.1f}" for x in os.getloadavg()),
            "functions": results}


def count_instructions(cases: list[tuple[str, str]], built: Path | None = None) -> dict[str, Any]:
    """CPU instructions (valgrind's callgrind ``Ir``) of ``import boto3`` and of each probe, once
    each: slow (a minute a case) but the same on a busy machine, where wall times are not."""
    import re

    def instructions(args: list[str], env: dict[str, str]) -> int:
        done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *args],
                              env={**env, "PYTHONHASHSEED": "0"}, capture_output=True, text=True, check=False)
        found = re.search(r"Collected : (\d+)", done.stderr)
        if done.returncode != 0 or not found:
            raise RuntimeError(f"callgrind failed: {done.stderr.strip()[-1500:]}")
        return int(found.group(1))

    for fn, protocol in cases:  # compile every module's bytecode first, as measure_coldstart does
        _timed(*_case(fn, protocol, built))
    boto3 = instructions([sys.executable, "-c", _BASELINE], probe_environment("pipelogiq"))
    counts = {f"{fn}/{p}": instructions(*_case(fn, p, built)) for fn, p in cases}
    return {"boto3_instructions": boto3,
            "functions": {key: {"instructions": n, "ratio_to_boto3": n / boto3} for key, n in counts.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.coldstart", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--functions", nargs="+", choices=FUNCTIONS, default=list(FUNCTIONS))
    parser.add_argument("--protocols", nargs="+", choices=PROTOCOLS, default=["pipelogiq"])
    parser.add_argument("--instructions", action="store_true",
                        help="count CPU instructions under valgrind instead of timing (one run per case)")
    parser.add_argument("--built", type=Path, metavar="DIR",
                        help="measure a `sam build` output (e.g. .aws-sam/build) as Lambda runs it")
    args = parser.parse_args(argv)
    if args.built and not (args.built / "RuntimeLayer" / "python").is_dir():
        parser.error(f"{args.built} is not a `sam build` output (no RuntimeLayer/python); run `make sam-build`")
    if args.instructions:
        counted = count_instructions([(fn, p) for fn in args.functions for p in args.protocols], args.built)
        print(f"python -c 'import boto3': {counted['boto3_instructions'] / 1e6:.0f} M instructions")
        for key, f in counted["functions"].items():
            print(f"{key:24} {f['instructions'] / 1e6:6.0f} M  {f['ratio_to_boto3']:.2f}")
        return 0
    result = measure_coldstart(args.rounds, [(fn, p) for fn in args.functions for p in args.protocols],
                               built=args.built)
    built = f"built by sam: {args.built}; " if args.built else ""
    print(f"{built}{args.rounds} rounds, load average {result['load_average']}; python -c 'import boto3': "
          f"{result['boto3_import_median_s']:.3f} s wall, {result['boto3_cpu_median_s']:.3f} s CPU")
    print(f"{'function/protocol':24} {'wall s':>7} {'ratio':>6} {'CPU s':>6} {'ratio':>6} {'import':>7} "
          f"{'build':>6} {'1st client':>10} {'modules':>7}")
    for key, f in result["functions"].items():
        print(f"{key:24} {f['median_s']:7.3f} {f['ratio_to_boto3']:6.2f} {f['cpu_s']:6.3f} "
              f"{f['cpu_ratio_to_boto3'] or 0:6.2f} {f['import_s']:7.3f} {f['init_s']:6.3f} "
              f"{f['first_client_s']:10.3f} {f['modules']:7}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
