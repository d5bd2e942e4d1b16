"""AWS tier: the real functions and ASL inside moto, against sandbox servers on loopback."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from serverless_worker.sandbox import create_sandbox
from serverless_worker.sandbox._server import SandboxServer
from serverless_worker.sandbox.admin import SandboxAdmin
from support.aws import WorkerStack

CREDENTIALS = {"pipelogiq": "sandbox-api-key", "priostack": "sandbox-api-key", "claimqueue": "sandbox-token"}
# Short timeouts so nothing in this tier waits long. A Pipelogiq lease of 10 s (renewed every
# second, SW_LEASE_RENEW_SECONDS): on a loaded machine a 3 s one could be granted with too
# little left to run under, or lapse between two late renewals, and the job would run again;
# a test about leases lapsing asks for its own.
SANDBOX_CONFIG: dict[str, dict[str, Any]] = {
    "pipelogiq": {"lease_seconds": 10, "visibility_timeout": 30, "poll_interval": 0.05},
    "priostack": {},
    "claimqueue": {"lease_seconds": 30},
}


@dataclass
class Env:
    protocol: str
    server: SandboxServer
    admin: SandboxAdmin
    stack: WorkerStack

    def seed(self, handler: str, inputs: list[Any], **options: Any) -> Any:
        """Seed jobs for ``handler`` in the protocol's own admin format. ``retries`` is
        Priostack's count; the other options are Pipelogiq's (its sandbox refuses unknown ones)."""
        retries = options.pop("retries", 3)
        if self.protocol == "pipelogiq":
            return self.admin.seed({"handler": handler, "inputs": inputs, "options": options})
        if self.protocol == "priostack":
            return self.admin.seed({"jobs": [{"type": handler, "variables": v, "retries": retries}
                                             for v in inputs]})
        return self.admin.seed({"queue": handler, "items": inputs})

    def tick(self, window: float = 2.0) -> dict[str, Any]:
        return self.stack.invoke("SchedulerFunction", {"poll_window_seconds": window})


@pytest.fixture
def worker_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Env]]:
    made: list[Env] = []

    def _make(protocol: str, *, handlers: list[str] | None = None, sandbox: dict[str, Any] | None = None,
              settings: dict[str, Any] | None = None, handler_module: str | None = None) -> Env:
        config = {**SANDBOX_CONFIG[protocol], **(sandbox or {})}
        server = SandboxServer(create_sandbox(protocol, **config)).start()
        admin = SandboxAdmin(server.url)
        stack = WorkerStack.start(monkeypatch, protocol=protocol, base_url=server.url,
                                  api_key=CREDENTIALS[protocol], handlers=handlers, settings=settings,
                                  handler_module=handler_module)
        env = Env(protocol, server, admin, stack)
        made.append(env)
        return env

    yield _make
    for env in made:
        try:
            env.stack.close()
        finally:
            env.admin.close()
            env.server.stop()


@pytest.fixture
def recorder() -> Any:
    """The run recorder of tests/aws/handlers_e2e.py, reset: the same module object the
    executors load by path (``load_handlers`` caches it under its private name). Shared
    with the reliability suite, hence the import through the ``aws`` directory."""
    from aws.e2e_support import HANDLERS_PATH
    from serverless_worker.registry import load_handlers

    module = load_handlers(HANDLERS_PATH)
    module.RECORDER.reset()
    return module.RECORDER
