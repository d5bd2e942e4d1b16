"""Defaults the local command uses instead of the model's (the Lambda stack's) ones.

They apply only where neither a flag nor an ``SW_*`` variable sets the value, and the
settings table (``serverless-worker config``) lists them, so nothing here is hidden.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEMO_DEFAULTS", "LOCAL_DEFAULTS"]

# A laptop or a plain VM: a bounded executor pool, a distinct worker name (a local worker
# must not replace the deployed stack's Pipelogiq session), long polls short enough that
# Ctrl-C starts draining within seconds, a renew loop that notices a long-running job's
# end within seconds (its Wait state), warnings only on the console.
LOCAL_DEFAULTS: dict[str, Any] = {
    "executor_reserved_concurrency": 10,
    "instance_id": "serverless-worker-local",
    "wait_seconds_long_poll": 5,
    "lease_renew_seconds": 5,
    "log_level": "WARNING",
}

# The built-in demo finishes by itself, a few seconds after its last job: short long polls
# (so a drain starts at once), a renew loop that notices the long-running job's end
# quickly, and an idle timeout.
DEMO_DEFAULTS: dict[str, Any] = {
    "until_idle_seconds": 3,
    "wait_seconds_long_poll": 2,
    "lease_renew_seconds": 2,
}
