"""Handlers that declare a timeout a live lease fits, on the short path and in slices: the
lease tests of test_poison.py. Loaded by path (``handler_module=LEASE_HANDLERS_PATH``) and
cached under one module name, so every test in a process registers them once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from serverless_worker import Job, handler

__all__ = ["LEASE_HANDLERS_PATH"]

LEASE_HANDLERS_PATH = str(Path(__file__).resolve())


@handler("lease.timed", timeout=10)
def timed(job: Job[Any]) -> Any:
    return {"n": job.input["n"]}


@handler("lease.sliced", timeout=10, mode="slices")
def sliced(job: Job[Any]) -> Any:
    return {"n": job.input["n"]}
