"""Defaults the local command uses instead of the model's (the Lambda stack's) ones.

They apply only where neither a flag nor an ``SW_*`` variable sets the value, and the
settings table (``serverless-worker config``) lists them, so nothing here is hidden.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEMO_DEFAULTS", "LOCAL_DEFAULTS", "LOCAL_LEDGER_RETENTION_SECONDS", "LOCAL_STATE_PATH",
           "TTL_SWEEP_SECONDS"]

# The local worker's state, relative to the working directory: a restart in the same
# directory finds what a killed run left (docs/ledger.md, "The local worker").
LOCAL_STATE_PATH = ".serverless-worker/state.sqlite3"

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
    "state_path": LOCAL_STATE_PATH,
}

# The built-in demo finishes by itself, a few seconds after its last job: short long polls
# (so a drain starts at once), a renew loop that notices the long-running job's end
# quickly, and an idle timeout. Its sandbox lives in memory and dies with the run, so its
# state does too: a temporary file (a kept one would hold ledger ids the next demo's
# fresh sandbox hands out again).
DEMO_DEFAULTS: dict[str, Any] = {
    "state_path": None,
    "until_idle_seconds": 3,
    "wait_seconds_long_poll": 2,
    "lease_renew_seconds": 2,
}

# How long a settled ledger item stays in the local state file (the stack keeps seven days):
# long enough to recognise a redelivery of a job settled minutes ago (visibility timeouts,
# lost answers) within a local run, short enough that a run of days keeps the file small.
# The summary counts the deliveries still in the ledger, so a run longer than this sees the
# last ten minutes' jobs there (the status line counts all of them).
LOCAL_LEDGER_RETENTION_SECONDS = 600
# How often expired items are deleted (the SQLite store's sweep, which stands in for DynamoDB's TTL).
TTL_SWEEP_SECONDS = 60.0
