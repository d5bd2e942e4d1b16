"""``python -m benchmarks.state_file_writes``: CPU per job of the local worker's state file
alone, the ledger's four transitions a job, on one thread and among many.

A job's four guarded writes (record, claim, stored outcome, acknowledged) go through
``SqliteStateStore`` exactly as the executor makes them, ``--jobs`` times, from 1, 8 and
50 threads (the executors), on a fresh file each. The figures are the process's CPU time
per job, and how many transactions carried the writes: among threads, the writes queued
while one commits share the next transaction (``state/group_commit.py``). ``--one-at-a-time``
holds one lock across each job's four writes, so no other thread's work comes between
them: what is left above the one-thread figure without it is the threads' hand-offs. A
figure, not a test: nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from serverless_worker.model import Delivery, Outcome, OutcomeKind
from serverless_worker.state import SqliteStateStore

__all__ = ["main", "measure"]


def _job(store: SqliteStateStore, index: int) -> None:
    delivery = Delivery(protocol="priostack", handler="echo", job_id=f"j{index}", ledger_id=f"j{index}:r0",
                        payload={"n": index}, wire={"key": f"j{index}"})
    key = store.record_delivery(delivery, instance="bench", deadline=time.time() + 420, dispatch_mode="invoke")
    assert key is not None
    epoch = f"run-{index}"
    store.start_run(key, epoch=epoch, deadline=time.time() + 60)
    store.store_outcome(key, epoch, Outcome(kind=OutcomeKind.SUCCESS, result={"n": index}))
    store.mark_acknowledged(key)


def measure(jobs: int, threads: int, *, one_at_a_time: bool = False) -> dict[str, float]:
    """CPU ms per job, and writes per transaction, for ``jobs`` jobs on ``threads`` threads."""
    turn = threading.Lock()

    def job(store: SqliteStateStore, index: int) -> None:
        if one_at_a_time:
            with turn:
                _job(store, index)
        else:
            _job(store, index)

    with tempfile.TemporaryDirectory(prefix="bench-state-") as tmp:
        store = SqliteStateStore(Path(tmp) / "state.sqlite3")
        try:
            commits_before = store.commits
            cpu = time.process_time()
            if threads == 1:  # in this thread: no hand-off at all
                for index in range(jobs):
                    job(store, index)
            else:
                with ThreadPoolExecutor(threads) as pool:
                    list(pool.map(lambda index: job(store, index), range(jobs)))
            cpu = time.process_time() - cpu
            commits = store.commits - commits_before
            return {"cpu_ms_per_job": 1000 * cpu / jobs, "writes_per_commit": store.ops["write"] / max(1, commits)}
        finally:
            store.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.state_file_writes",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--one-at-a-time", action="store_true",
                        help="one lock held across each job's four writes")
    args = parser.parse_args(argv)
    measure(200, 1)  # warm-up: imports, the first file
    print(f"{'threads':>7s} {'CPU ms/job':>11s} {'writes/commit':>14s}")
    for threads in (1, 8, 50):
        result = measure(args.jobs, threads, one_at_a_time=args.one_at_a_time)
        print(f"{threads:7d} {result['cpu_ms_per_job']:11.3f} {result['writes_per_commit']:14.2f}")


if __name__ == "__main__":
    main()
