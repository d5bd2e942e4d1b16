"""A Lambda cold start (import ``functions/<fn>/app.py``, build the runtime and the protocol
client) leaves out what it does not need: the modules below, and every AWS client.

Each case runs in a fresh interpreter, the way a new Lambda container starts, with the
environment ``benchmarks/coldstart.py`` measures (dummy loopback values, nothing is called).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # benchmarks/ is a top-level package of the repository
    sys.path.insert(0, str(ROOT))

from benchmarks.coldstart import FUNCTIONS, probe_environment  # noqa: E402

PROTOCOLS = ("pipelogiq", "priostack", "claimqueue")

# Never needed before the first call: settings loading without pydantic-settings, retries
# (stamina/tenacity, and asyncio with them) only when a report is made, the CLI, the local
# runner and the sandboxes (uvicorn, starlette, websockets, rich) never in Lambda, the
# Powertools Parameters utility only when the key is read from AWS.
LAZY = ("pydantic_settings", "dotenv", "stamina", "tenacity", "asyncio", "rich", "uvicorn", "starlette",
        "websockets", "moto", "serverless_worker.cli", "serverless_worker.local", "serverless_worker.sandbox",
        "serverless_worker.protocols.claimqueue_socket", "aws_lambda_powertools.utilities.parameters")

_COLD_START = """
import importlib.util, json, sys
root, fn, lazy = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
sys.path.insert(0, root)
spec = importlib.util.spec_from_file_location(fn + "_app", f"{root}/{fn}/app.py")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
from serverless_worker.runtime.entry import services_from_environment
services = services_from_environment()
services.protocol
dispatcher = services.dispatcher
print(json.dumps({
    "loaded": sorted(name for name in sys.modules if any(name == m or name.startswith(m + ".") for m in lazy)),
    "protocol_modules": sorted(n for n in sys.modules if n.startswith("serverless_worker.protocols.")
                               and n.rsplit(".", 1)[1] in ("pipelogiq", "priostack", "claimqueue")),
    "store_client": repr(services.store._client),
    "dispatcher_clients": [repr(dispatcher._lambda), repr(dispatcher._sfn)],
    "handler": callable(module.lambda_handler),
}))
"""


def _cold_start(function: str, protocol: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _COLD_START, str(ROOT / "functions"), function, json.dumps(LAZY)],
        env=probe_environment(protocol), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("function", FUNCTIONS)
def test_a_cold_start_leaves_out_what_it_does_not_need(function: str) -> None:
    seen = _cold_start(function, "pipelogiq")

    assert seen["handler"] is True
    assert seen["loaded"] == []
    assert seen["protocol_modules"] == ["serverless_worker.protocols.pipelogiq"]
    assert seen["store_client"] == "LazyClient('dynamodb', built=False)"
    assert seen["dispatcher_clients"] == ["LazyClient('lambda', built=False)",
                                          "LazyClient('stepfunctions', built=False)"]


@pytest.mark.parametrize("protocol", PROTOCOLS[1:])
def test_only_the_configured_protocol_is_imported(protocol: str) -> None:
    seen = _cold_start("executor", protocol)

    assert seen["loaded"] == []
    assert seen["protocol_modules"] == [f"serverless_worker.protocols.{protocol}"]


def test_the_benchmark_measures_a_sam_build_output_as_lambda_runs_it(tmp_path: Path) -> None:
    """``--built``: the function's own code root and the layer first on the path, and no
    bytecode written, so what the build left uncompiled is compiled in every measured run."""
    from benchmarks.coldstart import _case, measure_coldstart

    built = tmp_path / "build"
    layer = built / "RuntimeLayer" / "python"
    layer.mkdir(parents=True)
    (layer / "serverless_worker").symlink_to(ROOT / "layers" / "runtime" / "serverless_worker")
    made = subprocess.run(["make", "-s", "-C", str(ROOT / "functions"), "build-ExecutorFunction",
                           f"ARTIFACTS_DIR={built / 'ExecutorFunction'}", f"PYTHON={sys.executable}"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert made.returncode == 0, made.stderr

    args, env = _case("executor", "priostack", built)
    assert args[-2:] == [str(built / "ExecutorFunction"), "executor"]
    assert env["PYTHONPATH"] == str(layer)
    assert env["PYTHONDONTWRITEBYTECODE"] == "1" and "PYTHONPYCACHEPREFIX" not in env
    assert env["SW_PROTOCOL"] == "priostack"

    result = measure_coldstart(1, [("executor", "pipelogiq")], built=built)
    assert result["built"] == str(built)
    executor = result["functions"]["executor/pipelogiq"]
    assert executor["median_s"] > 0 and executor["modules"] > 100
