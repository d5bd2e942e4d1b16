"""The built-in sandbox: a job server of our own on a free loopback port, seeded with jobs
for the handlers being run. The built-in demo's handlers (functions/handlers, the
examples) get their demo jobs, every outcome once; any other handler, such as the one
``serverless-worker init`` writes, gets the sample inputs its project keeps in
``events/<handler>.json`` (a JSON object, or a list of them), so a new project's
``serverless-worker local`` works its own handler at once.

Two of those outcomes are failures on purpose (a declined card, an invalid payment): the
sandbox tells which job ids they got (:attr:`OwnSandbox.deliberate`), so the summary
labels them as the demo's deliberate failures instead of leaving a newcomer to wonder.

The sandbox is configured to accept only this run's API key, so the demo exercises the
same credential path as a real server (and proves the key never reaches the output).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError
from ..sandbox import create_sandbox

__all__ = ["DELIBERATE_FAILURES", "DEMO_JOBS", "SAMPLES_DIRECTORY", "OwnSandbox", "SampleJobs", "demo_seeds",
           "job_creation_times", "new_key", "sample_jobs", "sandbox_credential_config"]

DECLINED_CARD = "4000000000000002"  # functions/handlers/examples.py declines this card

# handler -> inputs, one per job; every outcome the examples can produce, once.
DEMO_JOBS: dict[str, list[dict[str, Any]]] = {
    "echo": [{"message": "hello"}, {"message": "from serverless-worker"}],
    "payment-processor": [
        {"orderId": "A-1001", "amount": 25.0, "currency": "EUR"},                            # charged
        {"orderId": "A-1002", "amount": 99.5, "currency": "USD", "cardNumber": DECLINED_CARD},  # declined
        {"orderId": "", "amount": -1, "currency": "euro"},                                   # bad input
    ],
    "sleepy": [{"seconds": 1.5}],
    "slow-report": [{"pages": 3}],
}
# handler -> index in DEMO_JOBS -> why that job fails, on purpose.
DELIBERATE_FAILURES: dict[str, dict[int, str]] = {
    "payment-processor": {1: "the demo's declined card, on purpose", 2: "the demo's invalid payment, on purpose"},
}

_SEED_FORMATS = {
    "pipelogiq": lambda handler, inputs: {"handler": handler, "inputs": inputs},
    "priostack": lambda handler, inputs: {"jobs": [{"type": handler, "variables": v, "retries": 3}
                                                   for v in inputs]},
    "claimqueue": lambda handler, inputs: {"queue": handler, "items": inputs},
}


def sandbox_credential_config(protocol: str, key: str) -> dict[str, Any]:
    """Sandbox config accepting exactly ``key`` (each sandbox names its credential list its own way)."""
    configs: dict[str, dict[str, Any]] = {"pipelogiq": {"api_keys": {key: 12}},
                                          "priostack": {"api_keys": [key]},
                                          "claimqueue": {"tokens": [key]}}
    return configs[protocol]


def demo_seeds(protocol: str, handlers: Iterable[str]) -> list[tuple[dict[str, Any], str | None]]:
    """Admin seed bodies for the demo jobs of ``handlers`` (those the demo has jobs for), each
    with why its jobs fail on purpose (``None`` for the others): a deliberate failure is a
    body of its own, so the ids the sandbox gives it are known."""
    seeds: list[tuple[dict[str, Any], str | None]] = []
    for name in handlers:
        if name not in DEMO_JOBS:
            continue
        notes = DELIBERATE_FAILURES.get(name, {})
        plain = [job for index, job in enumerate(DEMO_JOBS[name]) if index not in notes]
        if plain:
            seeds.append((_SEED_FORMATS[protocol](name, plain), None))
        seeds += [(_SEED_FORMATS[protocol](name, [DEMO_JOBS[name][index]]), note) for index, note in notes.items()]
    return seeds


SAMPLES_DIRECTORY = "events"


@dataclass
class SampleJobs:
    """What the built-in sandbox is seeded with: the admin seed bodies (each with why its
    jobs fail on purpose, or ``None``), where each handler's jobs came from, and the
    handlers that have none (the banner says how to give them some)."""

    seeds: list[tuple[dict[str, Any], str | None]] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)   # handler -> "the demo" or "events/x.json"
    missing: list[str] = field(default_factory=list)


def sample_jobs(protocol: str, names: Iterable[str], demo: Iterable[str], project_root: Path) -> SampleJobs:
    """The jobs to seed for ``names``: the demo's for the built-in demo's handlers (``demo``),
    ``events/<handler>.json`` of the project for any other; ConfigurationError (one line)
    for a sample file that is not a JSON object or a list of them."""
    found = SampleJobs()
    demo_names = set(demo)
    for name in names:
        if name in demo_names and name in DEMO_JOBS:
            found.seeds += demo_seeds(protocol, [name])
            found.sources[name] = "the demo"
            continue
        path = project_root / SAMPLES_DIRECTORY / f"{name}.json"
        if not path.is_file():
            found.missing.append(name)
            continue
        inputs = _sample_inputs(path)
        found.seeds.append((_SEED_FORMATS[protocol](name, inputs), None))
        found.sources[name] = f"{SAMPLES_DIRECTORY}/{path.name}"
    return found


def _sample_inputs(path: Path) -> list[dict[str, Any]]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ConfigurationError(f"{path}: not readable as JSON ({err}); it holds a sample job's input for "
                                 "the built-in sandbox") from None
    inputs = value if isinstance(value, list) else [value]
    if not inputs or not all(isinstance(item, dict) for item in inputs):
        raise ConfigurationError(f"{path}: a sample job's input is a JSON object, or a list of them")
    return inputs


@dataclass
class OwnSandbox:
    """A sandbox this run started and stops; ``url`` is its loopback address."""

    server: Any
    protocol: str
    seeded: int = 0
    deliberate: dict[str, str] = field(default_factory=dict)  # job id -> why it fails on purpose

    @property
    def url(self) -> str:
        return str(self.server.url)

    @classmethod
    def start(cls, protocol: str, key: str) -> OwnSandbox:
        from ..sandbox import SandboxServer

        sandbox = create_sandbox(protocol, **sandbox_credential_config(protocol, key))
        return cls(server=SandboxServer(sandbox).start(), protocol=protocol)

    def seed(self, seeds: list[tuple[dict[str, Any], str | None]]) -> int:
        """Create the jobs through the admin API (the sandbox's state lives on its event loop);
        seeded when the worker is ready, so latencies measure the worker, not its start-up.
        The ids a body with a note created are those new after it: :attr:`deliberate`."""
        from ..sandbox.admin import SandboxAdmin, job_id

        admin = SandboxAdmin(self.url)
        try:
            def ids() -> set[str]:
                return {job_id(self.protocol, job) for job in admin.jobs()}

            for body, note in seeds:
                before = ids() if note is not None else set()
                admin.seed(body)
                if note is not None:
                    self.deliberate.update(dict.fromkeys(ids() - before, note))
            self.seeded = len(admin.jobs())
        finally:
            admin.close()
        return self.seeded

    def server_view(self) -> tuple[dict[str, float], dict[str, int]]:
        """Job id -> creation time, and the server's calls per endpoint, from the admin API:
        what the run's summary sets beside the worker's own view."""
        from ..sandbox.admin import SandboxAdmin

        admin = SandboxAdmin(self.url)
        try:
            return job_creation_times(admin.jobs()), dict(admin.stats().get("calls", {}))
        finally:
            admin.close()

    def stop(self) -> None:
        self.server.stop()


def job_creation_times(jobs: list[dict[str, Any]]) -> dict[str, float]:
    """Job id -> creation time, from a sandbox's ``GET /_admin/jobs``.

    Each sandbox names its id field its own way (``job_id``, ``key``, ``id``); the time is
    ``created_at``, or the first history entry's ``at``.
    """
    created: dict[str, float] = {}
    for job in jobs:
        job_id = job.get("job_id") or job.get("key") or job.get("id")
        when = job.get("created_at")
        if when is None and job.get("history"):
            when = job["history"][0].get("at")
        if job_id is not None and isinstance(when, int | float):
            created[str(job_id)] = float(when)
    return created


def new_key() -> str:
    """A fresh credential for our own sandbox, valid for one run."""
    return f"local-{secrets.token_urlsafe(18)}"
