"""``python -m benchmarks.first_pull``: how long ``serverless-worker local`` takes from
process start to the first request the job server receives.

It is the wait a developer sees on every start, and what the local runner spends before
it does any work: imports, the handler module, the state store, and (only when a handler
is long-running) moto with the state machine. For each protocol and each path, a sandbox
starts in this process with one latency fault of 0 ms on every endpoint, which only
records when the first request arrived (the sandbox's fault log, read through its admin
API); the command starts as a subprocess right after ``time.time()`` is read, and is
stopped (SIGTERM, which drains) once that first request is in. The figure is the
difference, median and range over ``--repeat`` starts. A figure, not a test: nothing here
passes or fails.

``--cli`` runs another build of the command (a checkout of an earlier commit, for a
before/after figure)::

    git archive e107cd2 | tar -x -C /tmp/before
    python -m benchmarks.first_pull --cwd /tmp/before --cli "env PYTHONPATH=/tmp/before/layers/runtime \\
        .venv/bin/python -c 'from serverless_worker.cli import main; main()'"
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

__all__ = ["main", "measure_first_pull", "time_to_first_pull"]

PROTOCOLS = ("pipelogiq", "priostack", "claimqueue")
CLI = str(Path(sys.executable).with_name("serverless-worker"))
ROOT = Path(__file__).resolve().parent.parent
KEY = "bench-first-pull-key"
KEYS: dict[str, dict[str, Any]] = {
    "pipelogiq": {"api_keys": {KEY: 12}},
    "priostack": {"api_keys": [KEY]},
    "claimqueue": {"tokens": [KEY]},
}
# One short handler; the long path adds a sliced one, which makes the runner start moto.
HANDLERS = {
    "short": '''
from serverless_worker import handler


@handler("bench.echo")
def echo(job):
    return {"echo": job.input}
''',
    "long": '''
from serverless_worker import handler


@handler("bench.echo")
def echo(job):
    return {"echo": job.input}


@handler("bench.sliced", mode="slices", timeout=60)
def sliced(job):
    return {"done": True}
''',
}


def time_to_first_pull(protocol: str, path: str, *, cli: list[str], cwd: Path, workdir: Path,
                       timeout: float = 120.0) -> float:
    """Seconds from starting the command to the sandbox's first request, one start."""
    from serverless_worker.sandbox import create_sandbox
    from serverless_worker.sandbox._server import SandboxServer
    from serverless_worker.sandbox.admin import SandboxAdmin

    module = workdir / f"bench_{path}_handlers.py"
    module.write_text(HANDLERS[path])
    state = workdir / f"state-{protocol}-{path}-{time.monotonic_ns()}.sqlite3"
    server = SandboxServer(create_sandbox(protocol, **KEYS[protocol])).start()
    admin = SandboxAdmin(server.url)
    try:
        admin.faults([{"kind": "latency", "endpoint": "*", "latency_ms": 0, "count": 1}])
        env = {k: v for k, v in os.environ.items() if not k.startswith("SW_")}
        env["BENCH_KEY"] = KEY
        args = [*cli, "local", "--protocol", protocol, "--url", server.url, "--api-key-env", "BENCH_KEY",
                "--handler-module", str(module)]
        if "--state" in _help(cli, cwd):  # an earlier build had no state file: leave it out
            args += ["--state", str(state)]
        started = time.time()
        proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
        try:
            deadline = time.monotonic() + timeout
            fired: list[dict[str, Any]] = []
            while not fired:
                if proc.poll() is not None:
                    raise RuntimeError(f"the worker exited ({proc.returncode}) before its first request: "
                                       f"{(proc.stderr.read() if proc.stderr else '')[-2000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no request within {timeout} s")
                fired = admin._call("GET", "faults")["fired"]
                if not fired:
                    time.sleep(0.005)  # polling the admin API; the figure comes from the sandbox's clock
            return float(fired[0]["at"]) - started
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
    finally:
        admin.close()
        server.stop()


_HELP: dict[str, str] = {}


def _help(cli: list[str], cwd: Path) -> str:
    key = shlex.join(cli)
    if key not in _HELP:
        _HELP[key] = subprocess.run([*cli, "local", "--help"], cwd=cwd, capture_output=True, text=True,
                                    timeout=60).stdout
    return _HELP[key]


def measure_first_pull(protocols: Iterable[str], paths: Iterable[str], *, repeat: int, cli: list[str] | None = None,
                       cwd: Path = ROOT, say: Callable[[str, str, dict[str, Any]], None] | None = None,
                       ) -> dict[str, dict[str, dict[str, Any]]]:
    """Per protocol and path: the median, least and most seconds to the first pull over
    ``repeat`` starts, and each start's; ``say`` hears each row as it is measured."""
    figures: dict[str, dict[str, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="first-pull-") as tmp:
        for protocol in protocols:
            for path in paths:
                runs = [time_to_first_pull(protocol, path, cli=cli or [CLI], cwd=cwd, workdir=Path(tmp))
                        for _ in range(repeat)]
                row = {"median_s": round(statistics.median(runs), 3), "min_s": round(min(runs), 3),
                       "max_s": round(max(runs), 3), "runs": [round(r, 3) for r in runs]}
                figures.setdefault(protocol, {})[path] = row
                if say:
                    say(protocol, path, row)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.first_pull", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5, help="starts per protocol and path (default 5)")
    parser.add_argument("--protocol", choices=PROTOCOLS, action="append", help="default: all three")
    parser.add_argument("--path", choices=tuple(HANDLERS), action="append", help="default: short and long")
    parser.add_argument("--cli", help="the command to run instead of this environment's serverless-worker")
    parser.add_argument("--cwd", type=Path, default=ROOT,
                        help="working directory of the command (default: this repository)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)

    def say(protocol: str, path: str, row: dict[str, Any]) -> None:
        print(f"{protocol:<11} {path:<5} first pull after {row['median_s']:.2f} s "
              f"(median of {len(row['runs'])}; {row['min_s']:.2f}-{row['max_s']:.2f} s)", flush=True)

    figures = measure_first_pull(args.protocol or PROTOCOLS, args.path or tuple(HANDLERS), repeat=args.repeat,
                                 cli=shlex.split(args.cli) if args.cli else None, cwd=args.cwd, say=say)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
