"""Everything one Lambda container (or the local runner) needs, built once.

Clients are created lazily on first use and kept for the life of the container:
never a new boto3 or HTTP client per invocation. The job server's client, with its
session and key recovery, is ``runtime/protocol_client.py``; the reaper has its own, with a
one-attempt retry policy, sharing the session (docs/retries.md).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import SecretStr

from ..errors import DispatchError
from ..protocols.base import WorkerIdentity, WorkerProtocol
from .dispatch import Dispatcher
from .events import EventBuffer
from .protocol_client import ProtocolClient
from .refusals import JobRefusals
from .session import SessionKeeper
from .settle import Settler
from .watcher import DeliveryWatcher

if TYPE_CHECKING:  # types only: the runtime must not pay for these imports before it needs them
    from ..registry import HandlerRegistry
    from ..settings import Settings
    from ..state.base import StateStore
    from .counters import CounterBuffer

__all__ = ["Services"]

log = logging.getLogger("serverless_worker.runtime")
T = TypeVar("T")


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
    client: ProtocolClient = field(init=False, repr=False)  # the job server's, with session recovery
    reaper_client: ProtocolClient = field(init=False, repr=False)  # the same, one attempt per call
    _counters: CounterBuffer | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self.client = ProtocolClient(settings=self.settings, new_keeper=self._new_keeper, events=lambda: self.events,
                                     credential_source=self.credential_source, overrides=self.client_overrides)
        self.reaper_client = ProtocolClient(settings=self.settings, new_keeper=lambda: self.client.keeper,
                                            events=lambda: self.events, credential_source=self.credential_source,
                                            overrides=self.client_overrides, one_attempt=True)

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

    # -- protocol client (runtime/protocol_client.py) -----------------------------------
    @property
    def protocol(self) -> WorkerProtocol:
        return self.client.protocol

    @property
    def keeper(self) -> SessionKeeper:
        return self.client.keeper

    def _new_keeper(self) -> SessionKeeper:
        return SessionKeeper(store=self.store, protocol_name=self.protocol_name, instance=self.instance,
                             identity=self.identity(), refresh_margin=self.settings.session_refresh_margin_seconds,
                             clock=self.clock)

    def ensure_session(self) -> None:
        self.client.ensure_session()

    def call(self, fn: Callable[[WorkerProtocol], T]) -> T:
        """Run ``fn(protocol)``, recovering once from a rejected session or API key."""
        return self.client.call(fn)

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

    def settler(self, *, reaping: bool = False) -> Settler:
        """What settling a delivery uses (``runtime/settle.py``); ``reaping``: the reaper's
        one-attempt client, so the ledger's noted retry time is its only back-off."""
        return Settler(store=self.store, client=self.reaper_client if reaping else self.client, events=self.events,
                       counters=lambda: self.counters, clock=self.clock, watcher=self.watcher)

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
        self.client.close()
        self.reaper_client.close()
