"""The restart scenario as a user runs it: a Priostack sandbox with 150 short jobs and 3 long
ones (9 s), ``serverless-worker local --concurrency 8`` against it, and the server restarted
6 s after the first activation (while the long jobs run). Prints what the server ended with.

    .venv/bin/python scripts/restart_scenario.py            # with the restart
    .venv/bin/python scripts/restart_scenario.py --no-restart
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import requests

from serverless_worker.sandbox import create_sandbox
from serverless_worker.sandbox._server import SandboxServer

HANDLERS = '''
import time
from serverless_worker import handler


@handler("aquick")
def quick(job):
    time.sleep(0.05)
    return {"n": job.input.get("n")}


@handler("zlong")
def slow(job):
    time.sleep(9)
    return {"n": job.input.get("n")}
'''
KEY = "scenario-key"


def _restart_after_first_activation(url: str, delay: float, done: threading.Event) -> None:
    while not done.is_set():
        jobs = requests.get(f"{url}/_admin/jobs", timeout=5).json()["jobs"]
        if any(job["activations"] for job in jobs):
            break
        time.sleep(0.05)
    if not done.wait(delay):
        requests.post(f"{url}/_admin/restart", timeout=5).raise_for_status()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-restart", action="store_true")
    parser.add_argument("--delay", type=float, default=6.0, help="seconds after the first activation")
    args = parser.parse_args()
    server = SandboxServer(create_sandbox("priostack", api_keys=[KEY])).start()
    try:
        requests.post(f"{server.url}/_admin/jobs", timeout=5, json={"jobs": [
            {"type": "aquick", "variables": {"n": 1}, "count": 150},
            {"type": "zlong", "variables": {"n": 2}, "count": 3}]}).raise_for_status()
        done = threading.Event()
        restarter = None
        if not args.no_restart:
            restarter = threading.Thread(target=_restart_after_first_activation,
                                         args=(server.url, args.delay, done), daemon=True)
            restarter.start()
        with tempfile.TemporaryDirectory() as tmp:
            module = Path(tmp) / "scenario_handlers.py"
            module.write_text(HANDLERS)
            cli = Path(sys.executable).with_name("serverless-worker")
            env = {**{k: v for k, v in os.environ.items() if not k.startswith("SW_")}, "SCENARIO_KEY": KEY}
            result = subprocess.run([str(cli), "local", "--protocol", "priostack", "--url", server.url,
                                     "--api-key-env", "SCENARIO_KEY", "--handler-module", str(module),
                                     "--concurrency", "8", "--until-idle", "5"],
                                    env=env, capture_output=True, text=True, timeout=600)
        done.set()
        jobs = requests.get(f"{server.url}/_admin/jobs", timeout=5).json()["jobs"]
        print(result.stdout[-3000:])
        print(json.dumps({
            "exit": result.returncode,
            "server states": dict(Counter(job["state"] for job in jobs)),
            "jobs restarted": sum(bool(job["restarts"]) for job in jobs),
            "activations per job": dict(Counter(len(job["activations"]) for job in jobs)),
        }))
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
