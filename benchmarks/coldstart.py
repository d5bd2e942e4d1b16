"""(d) Cold start: a fresh process imports a function's entry point (``functions/<fn>/app.py``,
with ``functions/`` on the path as Lambda's code root) and builds the runtime
(``services_from_environment()`` and the protocol client), next to ``python -c "import boto3"``.

The environment points at dummy loopback values and the API key comes from ``SW_API_KEY``,
so nothing touches the network (in AWS the key is read from Secrets Manager on the first
call instead, one request more). Both sides are timed the same way, as the wall time of the
whole process, interleaved round by round so a busy machine skews both alike; the medians
are compared.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["FUNCTIONS", "measure_coldstart"]

ROOT = Path(__file__).resolve().parent.parent
FUNCTIONS = ("scheduler", "executor", "steps", "drain")

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
print(json.dumps({"import_s": t1 - t0, "init_s": t2 - t1, "modules": len(sys.modules)}))
"""
_BASELINE = "import boto3"


def _environment(protocol: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SW_", "AWS_", "POWERTOOLS_"))}
    env.update({
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


def _timed(args: list[str], env: dict[str, str]) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"cold-start probe failed: {done.stderr.strip()[-1500:]}")
    lines = done.stdout.strip().splitlines()
    return wall, (json.loads(lines[-1]) if lines else {})


def measure_coldstart(rounds: int, cases: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    """``cases``: (function, protocol) pairs; each one's median next to boto3's."""
    cases = cases or [(fn, "pipelogiq") for fn in FUNCTIONS]
    functions_dir = str(ROOT / "functions")
    baseline: list[float] = []
    walls: dict[str, list[float]] = {f"{fn}/{p}": [] for fn, p in cases}
    inner: dict[str, list[dict[str, Any]]] = {key: [] for key in walls}
    env0 = _environment("pipelogiq")
    for _ in range(rounds):
        baseline.append(_timed([sys.executable, "-c", _BASELINE], env0)[0])
        for fn, protocol in cases:
            wall, detail = _timed([sys.executable, "-c", _PROBE, functions_dir, fn], _environment(protocol))
            walls[f"{fn}/{protocol}"].append(wall)
            inner[f"{fn}/{protocol}"].append(detail)
    boto3 = statistics.median(baseline)
    results = {}
    for key, values in walls.items():
        median = statistics.median(values)
        results[key] = {
            "median_s": median,
            "ratio_to_boto3": median / boto3,
            "import_s": statistics.median(d["import_s"] for d in inner[key]),
            "init_s": statistics.median(d["init_s"] for d in inner[key]),
            "modules": inner[key][-1].get("modules"),
        }
    return {"rounds": rounds, "boto3_import_median_s": boto3, "functions": results}
