"""The job server's client for one container, keeping its session and key usable.

Built on first use with the API key, and replaced only whole: when the server rejects a
session it is recovered once, and when it rejects the key the key is re-read once (from
Secrets Manager / SSM: it may have been rotated) and the client rebuilt with it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pydantic import SecretStr

from ..errors import InvalidApiKeyError, SessionExpiredError, SessionRecoveryPausedError
from ..protocols.base import WorkerProtocol
from .events import EventBuffer
from .session import SessionKeeper

if TYPE_CHECKING:  # types only: the runtime must not pay for these imports before it needs them
    from ..settings import Settings

__all__ = ["ProtocolCaller", "ProtocolClient"]

log = logging.getLogger("serverless_worker.runtime")
T = TypeVar("T")


class ProtocolCaller(Protocol):
    """The protocol client as the runtime's steps use it: its capabilities, and calls that
    recover a rejected session or key once (:meth:`ProtocolClient.call`)."""

    @property
    def protocol(self) -> WorkerProtocol: ...

    def call(self, fn: Callable[[WorkerProtocol], T]) -> T: ...


class ProtocolClient:
    """The protocol client of one container (or the local runner) and its session keeper.

    ``new_keeper`` builds the session keeper when a session is first needed; ``events``
    gives the buffer told of a recovered session. ``one_attempt``: each call is tried once
    (``protocols.factory.ONE_ATTEMPT``), for a caller whose retries are paced elsewhere
    (the reaper: docs/retries.md)."""

    def __init__(self, *, settings: Settings, new_keeper: Callable[[], SessionKeeper],
                 events: Callable[[], EventBuffer], credential_source: Callable[[bool], SecretStr] | None = None,
                 overrides: dict[str, Any] | None = None, one_attempt: bool = False) -> None:
        self._settings, self._new_keeper, self._events = settings, new_keeper, events
        self._credential_source = credential_source
        self._overrides = overrides if overrides is not None else {}
        self._one_attempt = one_attempt
        self._protocol: WorkerProtocol | None = None
        self._credential: SecretStr | None = None
        self._keeper: SessionKeeper | None = None
        self._lock = threading.Lock()

    @property
    def protocol(self) -> WorkerProtocol:
        # Built once and replaced only whole (a refreshed key): read without the lock, which
        # every call of every executor thread would otherwise take in turn.
        client = self._protocol
        if client is not None:
            return client
        with self._lock:
            if self._protocol is None:
                self._protocol = self._build_protocol(refresh=False)
            return self._protocol

    def _create(self, credential: SecretStr) -> WorkerProtocol:
        from ..protocols.factory import ONE_ATTEMPT, create_client

        overrides = {**self._overrides, "retry": ONE_ATTEMPT} if self._one_attempt else self._overrides
        return create_client(self._settings, credential, **overrides)

    def _build_protocol(self, refresh: bool) -> WorkerProtocol:
        self._credential = self._read_credential(refresh)
        client = self._create(self._credential)
        if self._keeper is not None and self._keeper.session is not None:
            client.use_session(self._keeper.session)
        return client

    def _read_credential(self, refresh: bool) -> SecretStr:
        if self._credential_source is not None:
            return self._credential_source(refresh)
        from ..credentials import resolve_api_key

        return resolve_api_key(self._settings, refresh=refresh)

    @property
    def keeper(self) -> SessionKeeper:
        if self._keeper is not None:  # built once, never replaced
            return self._keeper
        with self._lock:
            if self._keeper is None:
                self._keeper = self._new_keeper()
            return self._keeper

    def ensure_session(self) -> None:
        self._with_fresh_key(lambda: self.keeper.ensure(self.protocol))

    def call(self, fn: Callable[[WorkerProtocol], T]) -> T:
        """Run ``fn(protocol)``, recovering once from a rejected session and once from a
        rejected API key (re-read from Secrets Manager / SSM: it may have been rotated)."""
        self.ensure_session()
        # The session this call uses: recovery must replace *it*, not whatever another
        # thread of this container has adopted since (see below).
        used = self.keeper.session if self.protocol.needs_session else None
        try:
            return fn(self.protocol)
        except SessionExpiredError:
            # Threads share this keeper (lease renewal beside the result post; every executor
            # in the local runner): when several hit the same 401, the first re-bootstraps and
            # the others must adopt its session. Recovering "the current session" instead
            # made each of them bootstrap again, each replacing the token the previous one got.
            # A session rejected right after its issue is replaced only after a back-off
            # (SessionRecoveryPausedError until then: the caller handles it as the 401 it is).
            try:
                self._with_fresh_key(lambda: self.keeper.recover(self.protocol, failed=used))
            except SessionRecoveryPausedError as paused:
                log.info("worker session rejected; not re-bootstrapping yet: %s", paused)
                raise
            self._events().add("worker.session_recovered", "worker session expired or replaced; re-bootstrapped and "
                               "the call made again: nothing lost",
                               level="WARN")
            result = fn(self.protocol)
            log.warning("the job server rejected the worker session (it expired, or another bootstrap replaced "
                        "it); a new session was opened and the call made again on it: nothing was lost")
            return result
        except InvalidApiKeyError:
            if not self._refresh_credential():
                raise
            return fn(self.protocol)

    def _with_fresh_key(self, fn: Callable[[], T]) -> T:
        """``fn()``, once more after re-reading the key if a bootstrap rejected it: a
        warm container whose session runs out after a key rotation must not stay stuck
        with the old key."""
        try:
            return fn()
        except InvalidApiKeyError:
            if not self._refresh_credential():
                raise
            return fn()

    def _refresh_credential(self) -> bool:
        """Re-read the key once; rebuild the client only when it changed."""
        old = self._credential
        fresh = self._read_credential(True)
        if old is not None and fresh.get_secret_value() == old.get_secret_value():
            return False
        log.warning("the job server rejected the API key; the key was read again (it had changed) and the "
                    "call is made again with it: nothing is lost")
        with self._lock:
            if self._protocol is not None:
                self._protocol.close()
            self._credential = fresh
            self._protocol = self._create(fresh)
            if self._keeper is not None and self._keeper.session is not None:
                self._protocol.use_session(self._keeper.session)
        return True

    def close(self) -> None:
        with self._lock:
            if self._protocol is not None:
                self._protocol.close()
                self._protocol = None
