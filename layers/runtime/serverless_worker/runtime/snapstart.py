"""SnapStart: what a function does before Lambda snapshots it, and after each restore.

With the stack's ``SnapStart=PublishedVersions``, Lambda initialises each published
version once, snapshots its memory and starts every new execution environment from that
snapshot. The init then runs once instead of per cold start, but whatever it left in memory
is shared by every environment restored from it. So:

- :func:`prime` (at init, only when Lambda initialises for a snapshot) loads what the
  invocations would: settings, the handler module, the runtime and protocol modules, and
  each AWS client's service model. It opens no connection and reads no secret, so neither
  is in the snapshot.
- :func:`renew` (the runtime's after-restore hook) makes everything that must be unique
  per environment anew: pooled HTTP connections of every protocol client, the boto3
  session (credentials) and every client on it, the random generator behind retry and
  polling jitter, the API key cache, and the cached runtime with its worker-session
  token, its session-owner id and the clocks it read when it was built.

``uuid.uuid4`` reads ``os.urandom`` on each call, so ids stay unique without help. This
module imports nothing heavy at import: without SnapStart it costs a cold start nothing.
"""

from __future__ import annotations

import importlib
import logging
import os
import random
import sys

__all__ = ["install", "prime", "renew"]

log = logging.getLogger("serverless_worker.snapstart")

# What each entry point imports on its first invocation (runtime/entry.py), by function.
_FUNCTION_MODULES = {
    "scheduler": ("serverless_worker.runtime.scheduler",),
    "executor": ("serverless_worker.runtime.executor",),
    "steps": ("serverless_worker.runtime.steps",),
    "drain": ("serverless_worker.runtime.drain",),
}


def snapshot_init() -> bool:
    """Whether Lambda is initialising this environment to snapshot it."""
    return os.environ.get("AWS_LAMBDA_INITIALIZATION_TYPE") == "snap-start"


def install(function: str) -> None:
    """Called by each function's module at import: when Lambda initialises for a snapshot,
    prime the runtime and register :func:`renew` to run after every restore."""
    if not snapshot_init():
        return
    from snapshot_restore_py import register_after_restore  # the python3.12+ Lambda runtime's

    register_after_restore(renew)
    prime(function)


def prime(function: str) -> None:
    """Import and build what ``function``'s invocations use, without any network call.

    A configuration error is logged, not raised: the first invocation raises it again,
    as it does without SnapStart, with the one clear message the entry points give.
    """
    from ..awsclients import build_all_clients
    from ..errors import ServerlessWorkerError
    from . import entry

    try:
        services = entry.services_from_environment()
        importlib.import_module(f"serverless_worker.protocols.{services.protocol_name}")
    except ServerlessWorkerError as err:
        log.warning("not primed for the snapshot: %s", err)
        return
    for module in _FUNCTION_MODULES.get(function, ()):
        importlib.import_module(module)
    log.info("primed for the snapshot: %s, %d AWS clients", function, build_all_clients())


def renew() -> None:
    """Make anew what environments restored from one snapshot must not share."""
    from ..awsclients import renew_clients
    from ..protocols.transport import renew_transports

    random.seed()  # from os.urandom: each environment its own jitter
    transports = renew_transports()
    renew_clients()
    parameters = sys.modules.get("aws_lambda_powertools.utilities.parameters")
    if parameters is not None:
        parameters.clear_caches()  # cached values and the providers (their clients) built on the old session
    from . import entry

    entry.reset_services()  # settings, store, dispatcher, protocol client, session token, scheduler clocks
    log.info("renewed after restore: %d HTTP transports, AWS clients, random state, runtime", transports)
