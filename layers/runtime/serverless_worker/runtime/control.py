"""How soon a running scheduler tick sees the control flags (draining, stopped, unfit), and
so how long a drain waits before "nothing in flight" also means "nothing more will be
pulled" (docs/operating.md, drain and resume).

A tick reads the control item before a pull whenever its last read is older than
:data:`CONTROL_CHECK_SECONDS`, and again after a pull that brought work once its read has
aged that long; what it pulled after the flag was set it records and hands back unstarted.
A pull that began before the tick could see the flag may still return work, for at most the
longest pull the tick makes: the drain waits out both before it trusts an empty count.
"""

from __future__ import annotations

from ..settings import Settings

__all__ = ["CONTROL_CHECK_SECONDS", "PULL_SLACK_SECONDS", "pull_quiet_seconds"]

# A tick re-reads the control item before pulling once its last read is this old: a GetItem
# at most this often per tick (about 25 per 50 s window), against pulls for up to this long
# after a drain began.
CONTROL_CHECK_SECONDS = 2.0
# A pull's own round trip on top of its long-poll wait, and the ledger write after it.
PULL_SLACK_SECONDS = 1.0


def pull_quiet_seconds(settings: Settings, *, long_poll: bool) -> float:
    """How long after the draining flag is set a tick that read the control item before it
    can still bring new work into the ledger: its next read, plus the longest pull it may
    already have sent (the long-poll wait where the protocol long-polls) and the write after."""
    longest_pull = settings.wait_seconds_long_poll if long_poll else 0.0
    return CONTROL_CHECK_SECONDS + longest_pull + PULL_SLACK_SECONDS
