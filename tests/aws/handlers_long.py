"""Long-running handlers for tests/aws/test_long_running.py; every run is recorded in ``RUNS``.

The test process imports this module by name (``handlers_long``) and the steps Lambda
loads it through ``SW_HANDLER_MODULE=handlers_long``, so both see the same ``RUNS``.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import boto3

from serverless_worker import Continue, Job, handler

__all__ = ["RELEASE", "RUNS", "callback", "pages", "patient_callback", "runs_of", "steady"]

RUNS: list[dict[str, Any]] = []
# Ends the work of a handler asked to wait for it (long-steady's ``until_released``, the first
# slice of long-pages' ``first_slice_until_released``): the test sets it at a counted point
# (so many renewals), never after a time.
RELEASE = threading.Event()
_RELEASE_LIMIT = 60.0  # seconds: only bounds a hang


def _until_released(job: Job[Any]) -> bool:
    """Wait for ``RELEASE`` (at most ``_RELEASE_LIMIT``); ``True`` if cancelled meanwhile."""
    end = time.monotonic() + _RELEASE_LIMIT
    while not RELEASE.is_set() and time.monotonic() < end:
        if job.wait(0.1):
            return True
    return False
_lock = threading.Lock()
_sfn: list[Any] = []


def _record(job: Job[Any], **extra: Any) -> dict[str, Any]:
    entry = {"handler": job.handler, "job_id": job.job_id, "ledger_id": job.ledger_id,
             "checkpoint": job.checkpoint, "callback_token": job.callback_token, "cancelled": False,
             "cancel_reason": None, "started": time.time(), **extra}
    with _lock:
        RUNS.append(entry)
    return entry


def runs_of(name: str) -> list[dict[str, Any]]:
    with _lock:
        return [dict(r) for r in RUNS if r["handler"] == name]


@handler("long-steady", mode="slices")
def steady(job: Job[Any]) -> Any:
    """Work ``seconds`` (``retry_seconds`` on a later attempt) in small cooperative steps, then
    with ``until_released`` until the test sets ``RELEASE``; stop at once when cancelled."""
    entry = _record(job, attempt=job.attempt)
    seconds = float(job.input.get("seconds", 1))
    if job.attempt > 1 and "retry_seconds" in job.input:
        seconds = float(job.input["retry_seconds"])
    end = time.monotonic() + seconds
    cancelled = False
    while time.monotonic() < end and not cancelled:
        cancelled = job.wait(min(0.1, max(0.0, end - time.monotonic())))
    if not cancelled and job.input.get("until_released"):
        cancelled = _until_released(job)
    if cancelled:
        entry.update(cancelled=True, cancel_reason=str(job.cancel_reason), cancelled_at=time.time())
        job.raise_if_cancelled()
    entry["finished"] = time.time()
    return {"slept": seconds, "tag": job.input.get("tag")}


@handler("long-pages", mode="slices")
def pages(job: Job[Any]) -> Any:
    """One page per slice: ``Continue`` with the pages so far until all are done.

    ``first_slice_seconds`` makes the first slice slow (renewals pile up meanwhile), and
    ``first_slice_until_released`` holds it until the test sets ``RELEASE``; ``delay`` asks for a pause between slices.
    """
    _record(job)
    state = job.checkpoint or {"page": 0, "parts": []}
    if state["page"] == 0 and job.input.get("first_slice_seconds"):
        job.wait(float(job.input["first_slice_seconds"]))
        job.raise_if_cancelled()
    if state["page"] == 0 and job.input.get("first_slice_until_released"):
        _until_released(job)
        job.raise_if_cancelled()
    page = state["page"] + 1
    parts = [*state["parts"], f"{job.input.get('tag', 'p')}-{page}"]
    if page < int(job.input["pages"]):
        return Continue({"page": page, "parts": parts}, delay_seconds=float(job.input.get("delay", 0)))
    return {"pages": page, "parts": parts}


def _client() -> Any:
    with _lock:
        if not _sfn:
            _sfn.append(boto3.client("stepfunctions", region_name="us-east-1"))
        return _sfn[0]


@handler("long-callback", mode="callback", timeout=4)
def callback(job: Job[Any]) -> Any:
    """Start "external work" that answers through the task token after ``delay`` seconds:
    ``mode`` success (SendTaskSuccess), failure (SendTaskFailure) or never (no answer)."""
    _record(job)
    mode, delay, token = job.input.get("mode", "success"), float(job.input.get("delay", 0.5)), \
        job.callback_token
    assert token, "a callback handler gets job.callback_token"
    client = _client()

    def external() -> None:
        time.sleep(delay)  # the behaviour under test: the external system answers later
        if mode == "success":
            client.send_task_success(taskToken=token, output=json.dumps({"external": "done",
                                                                         "tag": job.input.get("tag")}))
        elif mode == "failure":
            client.send_task_failure(taskToken=token, error="ExternalFailed",
                                     cause="the external system said no")

    if mode != "never":
        threading.Thread(target=external, daemon=True, name="external-work").start()
    return {"started": True}


@handler("long-callback-patient", mode="callback", timeout=60)
def patient_callback(job: Job[Any]) -> Any:
    """Start external work that never answers; only the run's end (or 60 s) stops the wait."""
    _record(job)
    return {"started": True}
