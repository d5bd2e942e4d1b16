"""Protocol clients behind one interface (:class:`WorkerProtocol`), looked up by name."""

from __future__ import annotations

import importlib

from .base import PullRequest, WorkerEvent, WorkerIdentity, WorkerProtocol, WorkerStatus

__all__ = [
    "PROTOCOLS",
    "protocol_class",
    "PullRequest",
    "WorkerEvent",
    "WorkerIdentity",
    "WorkerProtocol",
    "WorkerStatus",
]

PROTOCOLS = {
    "pipelogiq": "serverless_worker.protocols.pipelogiq:PipelogiqClient",
    "priostack": "serverless_worker.protocols.priostack:PriostackClient",
    "claimqueue": "serverless_worker.protocols.claimqueue:ClaimQueueClient",
}


def protocol_class(name: str) -> type[WorkerProtocol]:
    """The client class for a protocol name; imported lazily to keep cold starts small."""
    try:
        module_name, _, class_name = PROTOCOLS[name].partition(":")
    except KeyError:
        raise ValueError(f"unknown protocol {name!r}; expected one of {sorted(PROTOCOLS)}") from None
    return getattr(importlib.import_module(module_name), class_name)  # type: ignore[no-any-return]
