"""Handlers for the reliability suite, loaded by path (``SW_HANDLER_MODULE``) by the AWS tier.

Names start with ``rel-`` so they never collide with the example handlers in the shared
default registry.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from serverless_worker import Continue, Job, handler

__all__ = ["CALLS", "Order", "Report", "echo", "huge", "huge_item", "slow_report", "strict"]

# Handler calls per name, so a test can prove a handler never ran.
CALLS: dict[str, int] = {}
# Over Pipelogiq's 262,144-byte result cap, but well inside a DynamoDB item.
HUGE_RESULT_BYTES = 300_000
# Over DynamoDB's 400 KB item limit: the outcome cannot even be stored as it is.
HUGE_ITEM_BYTES = 500_000


def _count(name: str) -> None:
    CALLS[name] = CALLS.get(name, 0) + 1


class Order(BaseModel):
    orderId: str = Field(min_length=1)
    amount: float = Field(gt=0)


@handler("rel-echo")
def echo(job: Job[Any]) -> Any:
    _count("rel-echo")
    return job.input


@handler("rel-strict", input=Order)
def strict(job: Job[Order]) -> dict[str, Any]:
    _count("rel-strict")
    return {"orderId": job.input.orderId, "charged": job.input.amount}


@handler("rel-huge")
def huge(job: Job[Any]) -> str:
    _count("rel-huge")
    return "x" * HUGE_RESULT_BYTES


@handler("rel-huge-item")
def huge_item(job: Job[Any]) -> str:
    _count("rel-huge-item")
    return "y" * HUGE_ITEM_BYTES


class Report(BaseModel):
    pages: int = Field(default=2, ge=1, le=50)


@handler("rel-slow-report", input=Report, long_running=True)
def slow_report(job: Job[Report]) -> Any:
    """One page per slice, so the job runs through the state machine's loop."""
    _count("rel-slow-report")
    state = job.checkpoint or {"page": 0}
    state = {"page": state["page"] + 1}
    if state["page"] < job.input.pages:
        return Continue(state)
    return {"pages": state["page"]}
