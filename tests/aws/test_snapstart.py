"""SnapStart: a runtime warmed by real work keeps nothing per-environment after the
restore hook, and works on afterwards.

Environments restored from one snapshot start with the same memory. The hook
(``runtime/snapstart.renew``) must leave none of the warmed runtime's connections, AWS
clients, credentials, random stream, cached session token or ids to be shared. Each test
warms the runtime with a real tick against a sandbox (HTTP connections pooled, the
worker session bootstrapped, boto3 clients built), runs the hook, and looks.
"""

from __future__ import annotations

import random
import sys
import types
from typing import Any

import boto3
import pytest
from e2e_support import HANDLERS_PATH, PROTOCOLS, done, wait_for

from serverless_worker.awsclients import LazyClient
from serverless_worker.protocols import _http
from serverless_worker.runtime import snapstart

pytestmark = pytest.mark.aws


def _warm(worker_env: Any, protocol: str) -> Any:
    env = worker_env(protocol, handlers=["e2e.echo"], handler_module=HANDLERS_PATH)
    env.seed("e2e.echo", [{"n": 1}, {"n": 2}])
    env.tick(1.5)
    env.stack.wait_idle()
    wait_for(lambda: all(done(protocol, job) for job in env.admin.jobs()), what="the warm-up jobs done")
    return env


def _pooled_connections(transport: Any) -> int:
    return int(transport.pooled_connections)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_nothing_per_environment_survives_the_restore_hook(worker_env: Any, recorder: Any, protocol: str) -> None:
    env = _warm(worker_env, protocol)
    services = env.stack.services()
    protocol_client = services.protocol
    (transport,) = [t for t in list(_http._TRANSPORTS) if t.base_url == env.server.url.rstrip("/")]
    old_pool = transport._pool
    assert _pooled_connections(transport) > 0, "the warm-up left a pooled connection to the job server"
    store_client: LazyClient = services.store._client
    assert store_client.built
    old_dynamodb = store_client.client
    old_boto3_session = boto3.DEFAULT_SESSION
    keeper = services.keeper
    old_owner = keeper._owner
    token = keeper.session.token if keeper.session is not None else None
    assert (token is not None) == (protocol == "pipelogiq"), "only Pipelogiq has a worker session"
    snapshot_random = random.getstate()
    without_hook = [random.random() for _ in range(4)]
    random.setstate(snapshot_random)  # as a restored environment finds it

    snapstart.renew()

    # random: the stream differs from the one every restored environment would share
    assert [random.random() for _ in range(4)] != without_hook
    # HTTP: the old pool is cleared of its connections, and the transport has a new one
    assert transport._pool is not old_pool
    assert _http.open_connections(old_pool) == 0
    assert _pooled_connections(transport) == 0
    # AWS: no client and no session (credentials) of before
    assert not store_client.built
    assert boto3.DEFAULT_SESSION is None or boto3.DEFAULT_SESSION is not old_boto3_session
    # the cached runtime, its session token and owner id are gone: the next invocation builds anew
    renewed = env.stack.services()
    assert renewed is not services
    assert renewed.client._protocol is None and renewed.client._keeper is None and renewed.client._credential is None
    assert renewed.keeper._owner != old_owner
    assert renewed.keeper.session is None

    # and the restored runtime works: new jobs are done with new clients and connections
    env.seed("e2e.echo", [{"n": 3}, {"n": 4}])
    env.tick(1.5)
    env.stack.wait_idle()
    wait_for(lambda: all(done(protocol, job) for job in env.admin.jobs()), what="the jobs after the restore done")
    assert env.stack.services().protocol is not protocol_client
    assert env.stack.services().store._client.client is not old_dynamodb


class _RuntimeHooks(types.ModuleType):
    """What the python3.12+ Lambda runtime provides as ``snapshot_restore_py``."""

    def __init__(self) -> None:
        super().__init__("snapshot_restore_py")
        self.after_restore: list[Any] = []

    def register_after_restore(self, hook: Any) -> None:
        self.after_restore.append(hook)


def test_a_snapshot_init_primes_without_a_call_and_registers_the_hook(worker_env: Any, recorder: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    env = worker_env("pipelogiq", handlers=["e2e.echo"], handler_module=HANDLERS_PATH)
    hooks = _RuntimeHooks()
    monkeypatch.setitem(sys.modules, "snapshot_restore_py", hooks)
    monkeypatch.setenv("AWS_LAMBDA_INITIALIZATION_TYPE", "snap-start")
    calls_before = env.admin.stats()["calls"]

    snapstart.install("scheduler")

    assert hooks.after_restore == [snapstart.renew]
    services = env.stack.services()
    assert "serverless_worker.runtime.scheduler" in sys.modules
    assert "serverless_worker.protocols.pipelogiq" in sys.modules
    assert services.store._client.built, "the snapshot holds the DynamoDB client's service model"
    # nothing reached the job server or read the API key: no connection, no secret in the snapshot
    assert services.client._protocol is None and services.client._credential is None
    assert env.admin.stats()["calls"] == calls_before


def test_an_ordinary_init_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_LAMBDA_INITIALIZATION_TYPE", "on-demand")
    monkeypatch.delitem(sys.modules, "snapshot_restore_py", raising=False)
    snapstart.install("executor")  # would raise ImportError if it looked for the runtime's hooks
    assert "snapshot_restore_py" not in sys.modules
