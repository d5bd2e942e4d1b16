"""The outcomes the runtime itself gives a delivery (never a handler's own), built once.

Each names the error code a job server receives (``docs/outcomes.md``); the executor and
the state machine's steps meet the same situations, so they take the same outcome here.
"""

from __future__ import annotations

from ..errors import UnknownHandlerError
from ..model import Outcome, OutcomeKind

__all__ = ["executor_lost", "lease_lost", "no_outcome", "result_too_large", "unknown_handler"]


def unknown_handler(err: UnknownHandlerError) -> Outcome:
    """No handler of the delivery's name is registered here: a failure naming the known ones."""
    return Outcome(kind=OutcomeKind.FAILURE, error_code="UNKNOWN_HANDLER", message=str(err))


def no_outcome() -> Outcome:
    """The handler ended without one (a Continue from a short handler is made a failure)."""
    return Outcome(kind=OutcomeKind.FAILURE, error_code="NO_OUTCOME", message="handler produced no outcome")


def lease_lost(reason: str) -> Outcome:
    """The lease was refused or lost while the job ran: no result is reported, the job is discarded."""
    return Outcome(kind=OutcomeKind.LEASE_LOST, error_code="LEASE_LOST", message=reason)


def result_too_large(message: str) -> Outcome:
    """The handler's outcome does not fit the ledger item or the server: a failure saying so."""
    return Outcome(kind=OutcomeKind.FAILURE, error_code="RESULT_TOO_LARGE", message=message)


def executor_lost() -> Outcome:
    """A retried executor invocation found its own earlier run died mid-handler: never run twice."""
    return Outcome(kind=OutcomeKind.TIMEOUT, error_code="EXECUTOR_LOST",
                   message="a previous attempt of this invocation died mid-handler")
