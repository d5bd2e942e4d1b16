"""A short handler with a declared timeout, the kind executors keep pulling for, counting
its runs per job. The harness loads this file by path; a test gets the same module object
back from ``load_handlers(FANOUT_HANDLERS)``, so ``RUNS`` is shared with the executors."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

from serverless_worker import Job, handler

__all__ = ["FANOUT_HANDLERS", "RUNS"]

FANOUT_HANDLERS = str(Path(__file__).resolve())
RUNS: Counter[str] = Counter()  # job id -> runs
_lock = threading.Lock()


@handler("fanout.echo", timeout=10)
def echo(job: Job[Any]) -> Any:
    with _lock:
        RUNS[job.job_id or ""] += 1
    return job.input
