"""``python -m benchmarks.stop``: how long ``serverless-worker local`` takes to exit after
SIGTERM or Ctrl-C (SIGINT), whatever the job server answers.

The aim is 5 s plus one in-flight request's timeout. For each protocol and each way a
server can answer, a sandbox starts in this process, the command runs as a subprocess with
a drain grace of 600 s (a stop that waited for the grace would show at once), and once
the server has answered as the case says (read through its admin API) and a second more
has passed, the signal goes; the figure is the time from the signal to the process's exit,
with the exit status. The cases:

- ``idle``: a server with no work (Pipelogiq's long poll is in flight: the baseline);
- ``pulls told to wait a day``: every pull answered ``429 Retry-After: 86400``;
- ``report told to wait a year``: one job, its report answered 429 with an HTTP date a
  year ahead;
- ``pull held``: every pull held 120 s (the request's own timeout ends it: 10 s, Pipelogiq
  its long poll's wait more).

``bound`` is 5 s plus the longest one request may take for that protocol with the default
settings (connect and read timeouts; a Pipelogiq pull's read timeout is its 20 s long poll's
wait more). A figure, not a test: nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from email.utils import formatdate
from pathlib import Path
from typing import Any

from .first_pull import CLI, KEY, KEYS, PROTOCOLS
from .harness import HANDLER, seed_body

__all__ = ["CASES", "bound_seconds", "main", "time_to_exit"]

PULL = {"pipelogiq": "pull", "priostack": "activate", "claimqueue": "claim"}
REPORT = {"pipelogiq": "result", "priostack": "complete", "claimqueue": "result"}
STOP_AIM_SECONDS = 5.0
HANDLERS = f'''
from serverless_worker import handler


@handler("{HANDLER}")
def echo(job):
    return {{"echo": job.input}}
'''


def bound_seconds(protocol: str) -> float:
    """The aim: 5 s plus the longest one request may take with the default settings (its
    connect and read timeouts; a Pipelogiq pull's read timeout is its long poll's wait more)."""
    from serverless_worker.settings import Settings

    fields = Settings.model_fields
    connect, read = float(fields["connect_timeout"].default), float(fields["read_timeout"].default)
    if protocol == "pipelogiq":
        read += float(fields["wait_seconds_long_poll"].default)
    return STOP_AIM_SECONDS + connect + read


def _answer(protocol: str, case: str, admin: Any) -> Callable[[dict[str, Any]], bool]:
    """Set the server up for ``case``; returns when, from its stats, it has answered so."""
    if case == "pulls told to wait a day":
        admin.faults([{"kind": "rate_limit", "endpoint": PULL[protocol], "retry_after": "86400"}])
    elif case == "report told to wait a year":
        ahead = formatdate(time.time() + 365 * 86400, usegmt=True)
        admin.faults([{"kind": "rate_limit", "endpoint": REPORT[protocol], "retry_after": ahead}])
        admin.seed(seed_body(protocol, [{"n": 0}]))
        return lambda stats: stats["calls"].get(REPORT[protocol], 0) >= 1
    elif case == "pull held":
        admin.faults([{"kind": "latency", "endpoint": PULL[protocol], "latency_ms": 120_000}])
        return lambda stats: stats["faults_fired"] >= 1
    return lambda stats: stats["calls"].get(PULL[protocol], 0) >= 1


CASES = ("idle", "pulls told to wait a day", "report told to wait a year", "pull held")


def time_to_exit(protocol: str, case: str, sig: signal.Signals, *, workdir: Path,
                 timeout: float = 300.0) -> tuple[float, int]:
    """Seconds from ``sig`` to the worker's exit, and its exit status, one run."""
    from serverless_worker.sandbox import create_sandbox
    from serverless_worker.sandbox._server import SandboxServer
    from serverless_worker.sandbox.admin import SandboxAdmin

    module = workdir / "bench_stop_handlers.py"
    module.write_text(HANDLERS)
    state = workdir / f"state-{time.monotonic_ns()}.sqlite3"
    server = SandboxServer(create_sandbox(protocol, **KEYS[protocol])).start()
    admin = SandboxAdmin(server.url)
    try:
        answered = _answer(protocol, case, admin)
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("SW_")}, "BENCH_KEY": KEY}
        proc = subprocess.Popen([CLI, "local", "--protocol", protocol, "--url", server.url, "--api-key-env",
                                 "BENCH_KEY", "--handler-module", str(module), "--state", str(state),
                                 "--drain-grace-seconds", "600"], cwd=workdir, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + timeout
            while not answered(admin.stats()):
                if proc.poll() is not None:
                    raise RuntimeError(f"the worker exited ({proc.returncode}) before the server answered")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not answer as '{case}' says within {timeout} s")
                time.sleep(0.05)
            time.sleep(1.0)  # the worker acts on the answer (its pause, its give-up) before the signal
            signalled = time.monotonic()
            proc.send_signal(sig)
            status = proc.wait(timeout=timeout)
            return time.monotonic() - signalled, status
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        admin.close()
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stop", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocol", choices=PROTOCOLS, action="append", help="default: all three")
    parser.add_argument("--case", choices=CASES, action="append", help="default: all four")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    figures: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-stop-") as tmp:
        for protocol in args.protocol or PROTOCOLS:
            bound = bound_seconds(protocol)
            for case in args.case or CASES:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    seconds, status = time_to_exit(protocol, case, sig, workdir=Path(tmp))
                    figures.append({"protocol": protocol, "case": case, "signal": sig.name,
                                    "seconds": round(seconds, 2), "exit": status, "bound_s": bound})
                    print(f"{protocol:<11} {case:<27} {sig.name:<8} exit {status:>3} after {seconds:5.2f} s "
                          f"(bound {bound:g} s)", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
