"""The shapes of the state machine's step events and answers (``runtime/steps.py``).

``functions/statemachine/worker.asl.json`` fixes them: each Task's ``Parameters`` (or its
``Payload``) is a step's event, and the states after it read the step's answer under the
Task's ``ResultPath``. A test holds these types against the ASL (tests/unit/test_step_events.py),
so the two cannot drift apart; mypy holds the steps to them.
"""

# No ``from __future__ import annotations``: TypedDict reads NotRequired from live annotations.
from typing import Any, Literal, NotRequired, TypedDict

__all__ = ["STEP_EVENTS", "STEP_RESULTS", "AckEvent", "AckResult", "AcquireDone", "AcquireEvent", "AcquireRun",
           "CallbackStarted", "ContinueAsNewEvent", "FinishCallbackEvent", "GiveBackEvent", "GiveBackResult",
           "HandoverResult", "RenewEvent", "RenewResult", "ReportEvent", "ReportResult", "RunSliceEvent",
           "SliceResult", "StartCallbackEvent", "StateError"]


class StateError(TypedDict):
    """A caught error as the state machine passes it on (a Catch's ResultPath)."""

    Error: str
    Cause: NotRequired[str]


# -- events: what each Task passes -------------------------------------------------------------------
class AcquireEvent(TypedDict):
    step: Literal["acquire"]
    ledger_key: str
    execution_id: str
    handover_epoch: str | None  # the predecessor's successor epoch; null for a first execution


class RunSliceEvent(TypedDict):
    step: Literal["run_slice"]
    ledger_key: str
    epoch: str


class StartCallbackEvent(TypedDict):
    step: Literal["start_callback"]
    ledger_key: str
    epoch: str
    task_token: str


class FinishCallbackEvent(TypedDict):
    """The callback's output when it succeeded, or the error that ended its task."""

    step: Literal["finish_callback"]
    ledger_key: str
    epoch: str
    output: NotRequired[Any]
    error: NotRequired[StateError]


class RenewEvent(TypedDict):
    step: Literal["renew"]
    ledger_key: str
    epoch: str


class ReportEvent(TypedDict):
    step: Literal["report"]
    ledger_key: str
    epoch: str


class AckEvent(TypedDict):
    step: Literal["ack"]
    ledger_key: str
    epoch: str


class ContinueAsNewEvent(TypedDict):
    step: Literal["continue_as_new"]
    ledger_key: str
    epoch: str


class GiveBackEvent(TypedDict):
    """From the acquire phase (HandBack: the execution's id and handover epoch) or the run
    phase (GiveBack: the run's epoch)."""

    step: Literal["give_back"]
    phase: Literal["acquire", "run"]
    ledger_key: str
    error: StateError
    epoch: NotRequired[str | None]
    execution_id: NotRequired[str]
    handover_epoch: NotRequired[str | None]


# -- answers: what the states after each Task read ---------------------------------------------------
class AcquireRun(TypedDict):
    """Acquired: how to run (slices or a callback) and how often to renew."""

    action: Literal["run"]
    epoch: str
    mode: Literal["callback", "slice"]
    renew_seconds: int
    callback_timeout_seconds: int
    callback_heartbeat_seconds: int


class AcquireDone(TypedDict):
    """Nothing to run: not ours, refused, lapsed, or handed back."""

    action: Literal["done"]
    epoch: str
    reason: str


# ``continue`` is a keyword: the functional form names it.
SliceResult = TypedDict("SliceResult", {"continue": bool, "handover": bool, "delay_seconds": int})


class CallbackStarted(TypedDict):
    started: bool


class RenewResult(TypedDict):
    finished: bool
    refused: NotRequired[bool]


class ReportResult(TypedDict):
    reported: bool
    handover: bool
    accepted: NotRequired[bool]
    status: NotRequired[str]


class AckResult(TypedDict):
    acknowledged: bool


class HandoverResult(TypedDict):
    handed_over: bool


class GiveBackResult(TypedDict):
    action: str
    reason: NotRequired[str]
    status: NotRequired[str | None]


STEP_EVENTS: dict[str, type] = {
    "acquire": AcquireEvent,
    "run_slice": RunSliceEvent,
    "renew": RenewEvent,
    "start_callback": StartCallbackEvent,
    "finish_callback": FinishCallbackEvent,
    "report": ReportEvent,
    "ack": AckEvent,
    "give_back": GiveBackEvent,
    "continue_as_new": ContinueAsNewEvent,
}

# Each step's answer; a step with two kinds of answer has both.
STEP_RESULTS: dict[str, tuple[type, ...]] = {
    "acquire": (AcquireRun, AcquireDone),
    "run_slice": (SliceResult,),
    "renew": (RenewResult,),
    "start_callback": (CallbackStarted,),
    "finish_callback": (SliceResult,),
    "report": (ReportResult,),
    "ack": (AckResult,),
    "give_back": (GiveBackResult,),
    "continue_as_new": (HandoverResult,),
}
