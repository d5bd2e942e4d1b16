"""Example handlers, one idea each. They are documentation: copy one and change it.

- ``echo``: the smallest handler; returns its input.
- ``payment-processor``: a validated input model and a business rejection.
- ``sleepy``: cooperative waiting with progress; stops promptly when cancelled.
- ``slow-report``: a long-running job split into slices with ``Continue`` checkpoints.

They are also the built-in demo's handlers (``make run``): the marker below keeps
``serverless-worker local`` from running them against any server but its own sandbox
unless it is given ``--demo-handlers``. Your own modules carry no marker.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from serverless_worker import BusinessError, Continue, Job, handler

__all__ = ["Nap", "Payment", "Report", "charge", "echo", "sleepy", "slow_report"]

DECLINED_CARD = "4000000000000002"  # the usual "generic decline" test card number
__serverless_worker_demo__ = True  # the built-in demo's handlers (see above)


@handler("echo")
def echo(job: Job[Any]) -> Any:
    """Return the input unchanged."""
    return job.input


class Payment(BaseModel):
    """The job's variables (Priostack) or stage input (Pipelogiq); extra fields are ignored."""

    orderId: str = Field(min_length=1)
    amount: float = Field(gt=0)
    currency: str = Field(pattern=r"^[A-Z]{3}$")
    cardNumber: str = "4242424242424242"


@handler("payment-processor", timeout=30)
def charge(job: Job[Payment]) -> dict[str, Any]:
    """Charge a card. A declined card is a business outcome, not a failure: it is reported
    as such (Priostack completes with the variables, so the process can branch on them)."""
    payment = job.input
    if payment.cardNumber == DECLINED_CARD:
        raise BusinessError("CARD_DECLINED", "the card was declined",
                            {"paymentStatus": "declined", "declineReason": "card_declined"})
    job.log(f"charged {payment.amount:.2f} {payment.currency} for order {payment.orderId}")
    return {"paymentStatus": "success", "transactionId": f"txn_{payment.orderId}"}


class Nap(BaseModel):
    seconds: float = Field(default=1.0, ge=0, le=600)


@handler("sleepy")
def sleepy(job: Job[Nap]) -> dict[str, Any]:
    """Wait in one-second steps, reporting progress; ``job.wait`` wakes at once on cancellation."""
    total, slept = job.input.seconds, 0.0
    while slept < total:
        step = min(1.0, total - slept)
        if job.wait(step):
            job.raise_if_cancelled()  # lease lost, budget spent or shutdown: stop here
        slept += step
        job.progress({"percent": round(100 * slept / total)})
    return {"slept": total}


class Report(BaseModel):
    pages: int = Field(default=3, ge=1, le=1000)


@handler("slow-report", mode="slices")
def slow_report(job: Job[Report]) -> Any:
    """Render one page per slice and carry the running totals in the checkpoint.

    Each slice is a fresh Lambda invocation, so a report of any length never meets the
    15-minute limit. A real handler would do as many pages as ``job.remaining()`` allows.
    """
    state = job.checkpoint or {"page": 0, "rows": 0}
    job.raise_if_cancelled()
    state = {"page": state["page"] + 1, "rows": state["rows"] + 100}  # "render" one page
    if state["page"] < job.input.pages:
        return Continue(state)
    return {"pages": state["page"], "rows": state["rows"]}
