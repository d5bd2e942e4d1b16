"""Worker-session lifecycle: restore, re-bootstrap before expiry, recover from a
replaced or expired session.

Two concurrent bootstraps of one instance invalidate each other's token (the server
replaces it), so bootstrapping happens only under a DynamoDB lock; whoever loses the
race waits for the winner's session instead of bootstrapping again.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import ServerlessWorkerError
from ..protocols.base import SessionState, WorkerIdentity, WorkerProtocol

if TYPE_CHECKING:
    from ..state.contract import StateStore

__all__ = ["SessionKeeper", "SessionUnavailableError", "needs_refresh"]

log = logging.getLogger("serverless_worker.session")


class SessionUnavailableError(ServerlessWorkerError):
    """No usable worker session could be obtained (the lock holder never produced one)."""


class SessionKeeper:
    """Keeps ``protocol`` supplied with a live session, cached per process.

    ``refresh_margin`` seconds before expiry a new session is bootstrapped, so no call
    ever races the expiry.
    """

    def __init__(self, *, store: StateStore, protocol_name: str, instance: str, identity: WorkerIdentity,
                 refresh_margin: float, lock_ttl: float = 30.0, wait_for_peer: float = 10.0,
                 clock: Callable[[], float] = time.time) -> None:
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
        self.bootstraps = 0

    @property
    def session(self) -> SessionState | None:
        return self._session

    def ensure(self, protocol: WorkerProtocol) -> SessionState | None:
        """Give ``protocol`` a session that will not expire within the margin."""
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
            return self._bootstrap(protocol, stale=self._session)

    def recover(self, protocol: WorkerProtocol, failed: SessionState | None = None) -> SessionState | None:
        """After a 401 for the session: adopt a newer stored session or bootstrap a new one."""
        if not protocol.needs_session:
            return None
        with self._mutex:
            stale = failed or self._session
            loaded = self._store.load_session(self._protocol_name, self._instance)
            if loaded is not None and not _same(loaded[0], stale) and self._fresh(loaded[0]):
                self._session, self._version = loaded
                protocol.use_session(self._session)
                return self._session
            if loaded is not None:
                self._version = loaded[1]
            return self._bootstrap(protocol, stale=stale)

    def _fresh(self, session: SessionState | None) -> bool:
        return not needs_refresh(session, self._margin, self._clock())

    def _bootstrap(self, protocol: WorkerProtocol, stale: SessionState | None) -> SessionState | None:
        lock = f"bootstrap#{self._protocol_name}#{self._instance}"
        deadline = self._clock() + self._wait_for_peer
        while not self._store.acquire_lock(lock, self._owner, self._lock_ttl):
            # A peer is bootstrapping: wait for its session rather than replacing it.
            time.sleep(0.2)
            loaded = self._store.load_session(self._protocol_name, self._instance)
            if loaded is not None and not _same(loaded[0], stale) and self._fresh(loaded[0]):
                self._session, self._version = loaded
                protocol.use_session(self._session)
                return self._session
            if self._clock() > deadline:
                raise SessionUnavailableError(
                    f"another worker holds the bootstrap lock for {self._instance} and produced no session")
        try:
            # Re-read under the lock: a peer may have finished just before we got it.
            loaded = self._store.load_session(self._protocol_name, self._instance)
            if loaded is not None and not _same(loaded[0], stale) and self._fresh(loaded[0]):
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


def _same(a: SessionState | None, b: SessionState | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.token.get_secret_value() == b.token.get_secret_value()
