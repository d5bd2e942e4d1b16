"""Worker-session lifecycle: restore, re-bootstrap before expiry, recover from a
replaced or expired session.

Two concurrent bootstraps of one instance invalidate each other's token (the server
replaces it), so bootstrapping happens only under a DynamoDB lock; whoever loses the
race waits for the winner's session instead of bootstrapping again.

A server that rejects the sessions it has just issued (``401 session expired`` on every
lease acquire) would otherwise be bootstrapped at full speed: a session rejected before
any call with it went through (here), within ``RECOVERY_QUICK_SECONDS`` of its issue, is
replaced only after a jittered wait counted from that issue, doubling per such rejection
in a row up to ``RECOVERY_MAX_SECONDS`` (``SessionRecoveryPausedError`` until then). A
session that worked and then expired is replaced at once. The wait counts from the
stored session's issue time, so every container sharing the session keeps to it.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import SessionRecoveryPausedError, SessionUnavailableError
from ..model import SessionState
from ..protocols.base import WorkerIdentity, WorkerProtocol
from .polling import backoff_step, upper_half

if TYPE_CHECKING:
    from ..state.base import StateStore

__all__ = ["RECOVERY_FIRST_SECONDS", "RECOVERY_MAX_SECONDS", "RECOVERY_QUICK_SECONDS", "SessionKeeper",
           "needs_refresh", "same_session"]

log = logging.getLogger("serverless_worker.session")

# A session the server rejects within this long of issuing it, before any call that checks
# it went through, counts as a quick rejection:
# the next bootstrap waits (from the rejected session's issue) the first step, doubled per
# quick rejection in a row, up to the maximum; each wait drawn from the step's upper half.
RECOVERY_QUICK_SECONDS = 60.0
RECOVERY_FIRST_SECONDS = 1.0
RECOVERY_MAX_SECONDS = 30.0


class SessionKeeper:
    """Keeps ``protocol`` supplied with a live session, cached per process.

    ``refresh_margin`` seconds before expiry a new session is bootstrapped, so no call
    ever races the expiry.
    """

    def __init__(self, *, store: StateStore, protocol_name: str, instance: str, identity: WorkerIdentity,
                 refresh_margin: float, lock_ttl: float = 30.0, wait_for_peer: float = 10.0,
                 clock: Callable[[], float] = time.time, rng: Callable[[], float] = random.random) -> None:
        self._store = store
        self._protocol_name = protocol_name
        self._instance = instance
        self._identity = identity
        self._margin = refresh_margin
        self._lock_ttl = lock_ttl
        self._wait_for_peer = wait_for_peer
        self._clock = clock
        self._owner = f"{instance}:{uuid.uuid4()}"
        self._session: SessionState | None = None
        self._version: int | None = None
        self._mutex = threading.Lock()
        self._rng = rng
        self._quick_rejections = 0  # sessions rejected soon after their issue, in a row
        self._recovery_wait: tuple[str, float] | None = None  # (rejected session, its drawn wait)
        self.bootstraps = 0

    @property
    def session(self) -> SessionState | None:
        return self._session

    def ensure(self, protocol: WorkerProtocol, *, bootstrap: bool = True) -> SessionState | None:
        """Give ``protocol`` a session that will not expire within the margin. With
        ``bootstrap=False`` only a fresh session already held or stored is used, ``None``
        otherwise: an executor that keeps pulling never bootstraps, which would replace the
        token every other container of the instance uses."""
        if not protocol.needs_session:
            return None
        with self._mutex:
            if self._fresh(self._session):
                protocol.use_session(self._session)
                return self._session
            loaded = self._store.load_session(self._protocol_name, self._instance)
            if loaded is not None:
                self._session, self._version = loaded
                if self._fresh(self._session):
                    protocol.use_session(self._session)
                    return self._session
            if not bootstrap:
                return None
            return self._bootstrap(protocol, stale=self._session)

    def recover(self, protocol: WorkerProtocol, failed: SessionState | None = None) -> SessionState | None:
        """After a 401 for the session: adopt a newer stored session or bootstrap a new one."""
        if not protocol.needs_session:
            return None
        with self._mutex:
            stale = failed or self._session
            loaded = self._store.load_session(self._protocol_name, self._instance)
            if loaded is not None and not same_session(loaded[0], stale) and self._fresh(loaded[0]):
                self._session, self._version = loaded
                protocol.use_session(self._session)
                return self._session
            if loaded is not None:
                self._version = loaded[1]
            self._pace_recovery(protocol, stale)
            return self._bootstrap(protocol, stale=stale)

    def recovery_pause(self, failed: SessionState | None, protocol: WorkerProtocol | None = None) -> float:
        """Seconds until a session rejected as ``failed`` may be replaced by a bootstrap
        (none when ``protocol`` says a call with it went through: that is an expiry)."""
        if failed is None or (protocol is not None and protocol.session_confirmed(failed)):
            return 0.0
        age = self._clock() - failed.issued_at
        if age >= RECOVERY_QUICK_SECONDS:
            return 0.0
        fingerprint = _fingerprint(failed)
        if self._recovery_wait is None or self._recovery_wait[0] != fingerprint:
            # Drawn once per rejected session: asking again must not roll the dice again.
            step = backoff_step(RECOVERY_FIRST_SECONDS, RECOVERY_MAX_SECONDS, self._quick_rejections + 1)
            self._recovery_wait = (fingerprint, upper_half(step, self._rng))
        return max(0.0, self._recovery_wait[1] - age)

    def _pace_recovery(self, protocol: WorkerProtocol, stale: SessionState | None) -> None:
        """Before bootstrapping to replace ``stale``: wait out a quick rejection's back-off
        (raising ``SessionRecoveryPausedError`` until it is over)."""
        if stale is None or protocol.session_confirmed(stale) or \
                self._clock() - stale.issued_at >= RECOVERY_QUICK_SECONDS:
            self._quick_rejections = 0
            return
        pause = self.recovery_pause(stale, protocol)
        if pause > 0:
            raise SessionRecoveryPausedError(
                f"the server rejected worker session {stale.worker_id} "
                f"{self._clock() - stale.issued_at:.1f} s after issuing it; the next bootstrap is due "
                f"in {pause:.1f} s (a session rejected before any call with it went through is replaced "
                f"after a wait doubling up to {RECOVERY_MAX_SECONDS:g} s)")
        self._quick_rejections += 1

    def _fresh(self, session: SessionState | None) -> bool:
        return not needs_refresh(session, self._margin, self._clock())

    def _bootstrap(self, protocol: WorkerProtocol, stale: SessionState | None) -> SessionState | None:
        lock = f"bootstrap#{self._protocol_name}#{self._instance}"
        deadline = self._clock() + self._wait_for_peer
        while not self._store.acquire_lock(lock, self._owner, self._lock_ttl):
            # A peer is bootstrapping: wait for its session rather than replacing it.
            time.sleep(0.2)
            loaded = self._store.load_session(self._protocol_name, self._instance)
            if loaded is not None and not same_session(loaded[0], stale) and self._fresh(loaded[0]):
                self._session, self._version = loaded
                protocol.use_session(self._session)
                return self._session
            if self._clock() > deadline:
                raise SessionUnavailableError(
                    f"another worker holds the bootstrap lock for {self._instance} and produced no session")
        try:
            # Re-read under the lock: a peer may have finished just before we got it.
            loaded = self._store.load_session(self._protocol_name, self._instance)
            if loaded is not None and not same_session(loaded[0], stale) and self._fresh(loaded[0]):
                self._session, self._version = loaded
                protocol.use_session(self._session)
                return self._session
            version = loaded[1] if loaded is not None else None
            session = protocol.open_session(self._identity)
            if session is None:
                return None
            self._version = self._store.save_session(self._protocol_name, self._instance, session, version)
            self._session = session
            self.bootstraps += 1
            log.info("worker session bootstrapped", extra={"worker_id": session.worker_id})
            return session
        finally:
            self._store.release_lock(lock, self._owner)


def needs_refresh(session: SessionState | None, margin: float, now: float) -> bool:
    """Whether ``session`` must be replaced before use: missing, or expiring within
    ``margin`` seconds of ``now`` (refreshing early means no call races the expiry)."""
    return session is None or session.expires_within(margin, now)


def _fingerprint(session: SessionState) -> str:
    """What identifies a session here without keeping its token."""
    return hashlib.sha256(session.token.get_secret_value().encode()).hexdigest()[:16]


def same_session(a: SessionState | None, b: SessionState | None) -> bool:
    """One session, though perhaps two loads of it: the same token."""
    if a is None or b is None:
        return a is b
    return a.token.get_secret_value() == b.token.get_secret_value()
