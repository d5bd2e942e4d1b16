"""Everything one Lambda container (or the local runner) needs, built once.

Clients are created lazily on first use and kept for the life of the container:
never a new boto3 or HTTP client per invocation.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pydantic import SecretStr

from ..errors import DispatchError, InvalidApiKeyError, SessionExpiredError, SessionRecoveryPausedError
from ..protocols.base import Delivery, WorkerIdentity, WorkerProtocol
from .dispatch import Dispatcher
from .events import EventBuffer
from .refusals import JobRefusals
from .session import SessionKeeper

if TYPE_CHECKING:  # types only: the runtime must not pay for these imports before it needs them
    from ..registry import HandlerRegistry
    from ..settings import Settings
    from ..state.contract import StateStore
    from .counters import CounterBuffer

__all__ = ["DeliveryWatcher", "Services"]

log = logging.getLogger("serverless_worker.runtime")
T = TypeVar("T")


class DeliveryWatcher(Protocol):
    """Told of each delivery as it is recorded and as it settles, in this process, with no
    I/O: the local runner's live status counts jobs from it. Lambda has none."""

    def recorded(self, delivery: Delivery) -> None:
        """The delivery is in the ledger and about to be dispatched."""

    def settled(self, delivery: Delivery, how: str) -> None:
        """It settled: ``done``, ``failed`` (a result reported), ``handed_back`` or ``discarded``."""

    def unsettled(self, job_id: str, reason: str) -> None:
        """The delivery of ``job_id`` could not be recorded nor given an outcome
        (``runtime/poison.py``): left to the server's timeout, never to be settled by this run."""


@dataclass
class Services:
    """The runtime's dependencies. ``protocol`` is built on first use with the credential."""

    settings: Settings
    store: StateStore
    registry: HandlerRegistry
    dispatcher: Dispatcher | None = None
    credential_source: Callable[[bool], SecretStr] | None = None
    clock: Callable[[], float] = time.time
    events: EventBuffer = field(default_factory=EventBuffer)
    client_overrides: dict[str, Any] = field(default_factory=dict)
    watcher: DeliveryWatcher | None = None
    refusals: JobRefusals = field(default_factory=JobRefusals)  # jobs handed back or refused: paced
    sleep: Callable[[float], None] = time.sleep  # waits of the runtime's own pacing (refusals)
    _protocol: WorkerProtocol | None = field(default=None, init=False, repr=False)
    _credential: SecretStr | None = field(default=None, init=False, repr=False)
    _keeper: SessionKeeper | None = field(default=None, init=False, repr=False)
    _counters: CounterBuffer | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    # -- identity ------------------------------------------------------------
    @property
    def protocol_name(self) -> str:
        return str(self.settings.protocol)

    @property
    def instance(self) -> str:
        return str(self.settings.instance_id)

    def handler_names(self) -> list[str]:
        return list(self.settings.handlers) or list(self.registry.names())

    def identity(self) -> WorkerIdentity:
        from .. import __version__

        return WorkerIdentity(worker_name="serverless-worker", instance_id=self.instance,
                              handlers=self.handler_names(), version=__version__)

    # -- protocol client -------------------------------------------------------
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

    def _build_protocol(self, refresh: bool) -> WorkerProtocol:
        from ..protocols.factory import create_client

        self._credential = self._read_credential(refresh)
        client = create_client(self.settings, self._credential, **self.client_overrides)
        if self._keeper is not None and self._keeper.session is not None:
            client.use_session(self._keeper.session)
        return client

    def _read_credential(self, refresh: bool) -> SecretStr:
        if self.credential_source is not None:
            return self.credential_source(refresh)
        from ..credentials import resolve_api_key

        return resolve_api_key(self.settings, refresh=refresh)

    @property
    def keeper(self) -> SessionKeeper:
        if self._keeper is not None:  # built once, never replaced
            return self._keeper
        with self._lock:
            if self._keeper is None:
                self._keeper = SessionKeeper(
                    store=self.store, protocol_name=self.protocol_name, instance=self.instance,
                    identity=self.identity(), refresh_margin=self.settings.session_refresh_margin_seconds,
                    clock=self.clock)
            return self._keeper

    @property
    def dispatch(self) -> Dispatcher:
        """The dispatcher; a DispatchError (handled as a failed dispatch) when none is configured."""
        if self.dispatcher is None:
            raise DispatchError("no dispatcher configured")
        return self.dispatcher

    @property
    def counters(self) -> CounterBuffer:
        """This container's counter buffer (``runtime.counters.CounterBuffer``): counts are
        written in batches, at most every ``counters_flush_seconds``, not once per job."""
        with self._lock:
            if self._counters is None:
                from .counters import CounterBuffer

                self._counters = CounterBuffer(self.store, self.protocol_name, self.instance,
                                               flush_seconds=self.settings.counters_flush_seconds,
                                               clock=self.clock)
            return self._counters

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
            log.warning("worker session rejected; recovered")
            self.events.add("worker.session_recovered", "worker session expired or replaced; re-bootstrapped",
                            level="WARN")
            return fn(self.protocol)
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
        log.warning("API key rejected; using the re-read key")
        with self._lock:
            if self._protocol is not None:
                self._protocol.close()
            self._credential = fresh
            from ..protocols.factory import create_client

            self._protocol = create_client(self.settings, fresh, **self.client_overrides)
            if self._keeper is not None and self._keeper.session is not None:
                self._protocol.use_session(self._keeper.session)
        return True

    @contextmanager
    def flushing_events(self) -> Iterator[None]:
        """Send buffered worker events when the block ends (one call per invocation at most)."""
        try:
            yield
        finally:
            if len(self.events):
                try:
                    self.events.flush(self.protocol)
                except Exception:  # events are best effort; never fail an invocation for them
                    log.warning("worker events could not be flushed", exc_info=True)

    def close(self) -> None:
        with self._lock:
            if self._protocol is not None:
                self._protocol.close()
                self._protocol = None
