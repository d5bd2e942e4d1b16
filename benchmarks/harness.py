"""What every benchmark shares: sandbox job servers in their own processes, the bench
handler that notes when each job started, and counters of HTTP calls and DynamoDB requests.

The sandbox runs in a separate process (``serverless-worker sandbox``), as a real job
server is elsewhere: its CPU never competes with the worker under test for the GIL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CREDENTIALS",
    "HANDLER",
    "PROTOCOLS",
    "SANDBOX_CONFIG",
    "CallCounter",
    "EmbeddedDynamoCpu",
    "HandlerClock",
    "MotoProcess",
    "SandboxProcess",
    "counter_delta",
    "minimum_calls",
    "percentile",
    "seed_body",
]

PROTOCOLS = ("pipelogiq", "priostack", "claimqueue")
HANDLER = "bench"
# The sandboxes' own test credentials (their defaults).
CREDENTIALS = {"pipelogiq": "sandbox-api-key", "priostack": "sandbox-api-key", "claimqueue": "sandbox-token"}
# The sandbox's long poll re-checks its queue every ``poll_interval`` (0.25 s by default), a
# sandbox artefact a real server does not have (it answers when work is published).
SANDBOX_CONFIG: dict[str, dict[str, Any]] = {
    "pipelogiq": {"poll_interval": 0.01},
    "priostack": {},
    "claimqueue": {},
}


def minimum_calls(protocol: str, batch: int, jobs: int) -> dict[str, float]:
    """HTTP calls per job the protocol itself requires, for a backlog of ``jobs``: Pipelogiq
    bootstraps once; Priostack activates a batch of ``batch`` at a time."""
    if protocol == "pipelogiq":
        return {"bootstrap": 1.0 / jobs, "pull": 1.0, "lease.acquire": 1.0, "result": 1.0, "ack": 1.0}
    if protocol == "priostack":
        return {"activate": 1.0 / batch, "complete": 1.0}
    return {"claim": 1.0, "result": 1.0}


def seed_body(protocol: str, inputs: list[dict[str, Any]]) -> dict[str, Any]:
    """An admin seed body creating one ``bench`` job per input, in the sandbox's own format."""
    if protocol == "pipelogiq":
        return {"handler": HANDLER, "inputs": inputs}
    if protocol == "priostack":
        return {"jobs": [{"type": HANDLER, "variables": v, "retries": 3} for v in inputs]}
    return {"queue": HANDLER, "items": inputs}


def counter_delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in sorted(set(after) | set(before))
            if after.get(k, 0) - before.get(k, 0)}


def percentile(values: Iterable[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100); ``None`` for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


_CLI = "import sys; from serverless_worker.cli import main; sys.exit(main(sys.argv[1:]))"


class SandboxProcess:
    """``serverless-worker sandbox PROTOCOL`` on a free loopback port, in a child process."""

    def __init__(self, protocol: str, **config: Any) -> None:
        import subprocess

        from serverless_worker.sandbox.admin import SandboxAdmin

        self.protocol = protocol
        settings = {**SANDBOX_CONFIG[protocol], **config}
        args = [sys.executable, "-c", _CLI, "sandbox", protocol, "--port", "0"]
        for key, value in settings.items():
            args += ["--set", f"{key}={json.dumps(value)}"]
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the process; stop() closes it
        self._proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self._stderr, text=True)
        assert self._proc.stdout is not None
        banner = self._proc.stdout.readline()
        url = next((part[4:] for part in banner.split() if part.startswith("url=")), None)
        if url is None:
            self.stop()
            self._stderr.seek(0)
            raise RuntimeError(f"{protocol} sandbox did not start: {banner!r} "
                               f"{self._stderr.read().decode(errors='replace')[-2000:]}")
        self.url = url
        self.admin = SandboxAdmin(url, timeout=60)
        self._wait_serving()

    def _wait_serving(self, timeout: float = 20.0) -> None:
        """The banner comes when the port is bound, a moment before uvicorn accepts on it."""
        import requests

        deadline = time.monotonic() + timeout
        while True:
            try:
                self.admin.stats()
                return
            except requests.ConnectionError:
                if time.monotonic() > deadline or self._proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"{self.protocol} sandbox never accepted connections") from None
                time.sleep(0.02)

    @property
    def credential(self) -> str:
        return CREDENTIALS[self.protocol]

    def seed(self, inputs: list[dict[str, Any]]) -> Any:
        return self.admin.seed(seed_body(self.protocol, inputs))

    def calls(self) -> dict[str, int]:
        """HTTP calls served so far, per endpoint label (``/_admin/stats``)."""
        return dict(self.admin.stats()["calls"])

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
        _reap(self._proc, self._stderr)
        if hasattr(self, "admin"):
            self.admin.close()

    def __enter__(self) -> SandboxProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# The DynamoDB a benchmark's runtime talks to: moto's server in its own process, with the
# patches the local runner applies to its embedded one (requests atomic, as DynamoDB makes
# each conditional write; no per-request directory listing; queries without a full sort).
_MOTO = """
import logging, sys
from contextlib import ExitStack
from moto.server import ThreadedMotoServer
from serverless_worker.local import moto_adapter
for name in ("werkzeug", "moto"):
    logging.getLogger(name).setLevel(logging.CRITICAL)
patches = ExitStack()
moto_adapter.tune_dynamodb(patches, long_lived=False)
moto_adapter.serialize_dynamodb(patches)
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
host, port = server.get_host_and_port()
print(f"url=http://{host}:{port}", flush=True)
sys.stdin.read()  # serve until the parent closes our stdin (or goes away)
"""


class MotoProcess:
    """moto's server in a child process: DynamoDB over loopback HTTP, its CPU apart from the
    runtime's, as DynamoDB is remote from a Lambda function. ``dynamodb`` is a client for it
    (the one attribute :class:`~benchmarks.rig.RuntimeRig` needs of an ``EmbeddedAws``)."""

    def __init__(self, *, pool_size: int = 64) -> None:
        import subprocess

        import boto3
        from botocore.config import Config

        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the process; close() closes it
        self._proc = subprocess.Popen([sys.executable, "-c", _MOTO], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._stderr, text=True)
        assert self._proc.stdout is not None
        banner = self._proc.stdout.readline()
        if not banner.startswith("url="):
            self.close()
            self._stderr.seek(0)
            raise RuntimeError(f"moto server did not start: {banner!r} "
                               f"{self._stderr.read().decode(errors='replace')[-2000:]}")
        self.endpoint = banner.strip()[4:]
        session = boto3.session.Session(aws_access_key_id="local", aws_secret_access_key="local",
                                        region_name="us-east-1")
        # As the state store's own client in Lambda (state/store.py): no client-side validation.
        config = Config(max_pool_connections=pool_size, connect_timeout=3, read_timeout=30,
                        retries={"mode": "standard", "max_attempts": 3}, parameter_validation=False)
        self.dynamodb = session.client("dynamodb", endpoint_url=self.endpoint, config=config)

    def cpu_seconds(self) -> float | None:
        """CPU time the server process has used so far (user + system); ``None`` off Linux."""
        try:
            with open(f"/proc/{self._proc.pid}/stat", encoding="ascii") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()  # its cue to exit
        _reap(self._proc, self._stderr)

    def __enter__(self) -> MotoProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EmbeddedDynamoCpu:
    """CPU seconds the embedded moto (``EmbeddedAws``, called in-process) spends answering
    DynamoDB requests, summed over the threads that call it: the part of this process's
    CPU that DynamoDB, remote in AWS, would not cost the runtime. Counting starts on enter."""

    def __init__(self) -> None:
        self._seconds = 0.0
        self._lock = threading.Lock()
        self._patches = ExitStack()

    def cpu_seconds(self) -> float:
        with self._lock:
            return self._seconds

    def _add(self, seconds: float) -> None:
        with self._lock:
            self._seconds += seconds

    def __enter__(self) -> EmbeddedDynamoCpu:
        from serverless_worker.local.moto_adapter import time_dynamodb_requests

        time_dynamodb_requests(self._patches, self._add)
        return self

    def __exit__(self, *exc: object) -> None:
        self._patches.close()


@dataclass
class HandlerClock:
    """The ``bench`` handler: returns at once and notes when it started. A job's input may
    carry ``t``, the time it was created, for latency."""

    starts: list[tuple[float | None, float]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _waiters: list[tuple[int, threading.Event]] = field(default_factory=list)

    def note(self, created: float | None) -> None:
        now = time.time()
        with self._lock:
            self.starts.append((created, now))
            count = len(self.starts)
            for target, event in self._waiters:
                if count >= target:
                    event.set()

    def wait_for(self, count: int, timeout: float) -> bool:
        event = threading.Event()
        with self._lock:
            if len(self.starts) >= count:
                return True
            self._waiters.append((count, event))
        return event.wait(timeout)

    def latencies(self) -> list[float]:
        with self._lock:
            return [start - created for created, start in self.starts if created is not None]

    def registry(self) -> Any:
        """A fresh registry holding the ``bench`` handler."""
        from serverless_worker.registry import HandlerRegistry

        registry = HandlerRegistry()
        note = self.note

        @registry.handler(HANDLER)
        def bench(job: Any) -> dict[str, Any]:
            note(_created(job.input))
            return {"ok": True}

        return registry


def _created(data: Any) -> float | None:
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except ValueError:
            return None
    value = data.get("t") if isinstance(data, dict) else None
    return float(value) if isinstance(value, int | float) else None


class CallCounter:
    """Counts calls to selected methods of an object (the state store's operations)."""

    def __init__(self, target: Any, names: Iterable[str]) -> None:
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        for name in names:
            setattr(target, name, self._wrap(name, getattr(target, name)))

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.counts[name] += 1
            return fn(*args, **kwargs)

        return counted

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)


def _reap(proc: subprocess.Popen[Any], stderr: Any) -> None:
    """Wait for a child asked to stop (killing it after 10 s) and close its pipes."""
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    if proc.stdout is not None:
        proc.stdout.close()
    stderr.close()
