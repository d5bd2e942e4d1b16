"""The local command's settings: the runtime's (``settings.py``) and those only a long-lived
process on one machine has: its state file, the claim queue's socket transport, when to stop
and how long a drain waits.

The Lambda functions read the runtime's model, which ignores these variables quietly;
``serverless-worker config`` lists both, and every field is ``SW_<NAME>`` and a flag of the
local command alike (``cli/_flags.py``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..settings import Settings

__all__ = ["LocalSettings"]


class LocalSettings(Settings):
    """The worker's settings in the local command (and ``doctor``, ``drain``): the runtime's and these."""

    transport: Literal["http", "socket"] = Field(
        "http", description="Claim-queue transport of the local command: http, or socket (the work "
                            "WebSocket; one process claims and runs). Lambda always uses http.")
    until_idle_seconds: float | None = Field(
        None, gt=0, description="Local command: drain and exit once nothing runs and no job arrived for "
                                "this long; unset runs until Ctrl-C (the built-in demo defaults to 3).")
    drain_grace_seconds: float = Field(60, ge=0, description="How long a drain waits for running jobs "
                                                             "before giving up on them.")
    state_path: str | None = Field(
        None, min_length=1, description="Local command: the SQLite file holding the worker's state (ledger, session, "
                          "counters); run again with the same file, a killed run's deliveries are settled. "
                          "Default .serverless-worker/state.sqlite3 in the working directory; the built-in "
                          "demo's is a temporary file, removed at the end.")
