"""Unit tier: the local executors' pool runs at most its size at once, on daemon threads
(one stuck call cannot keep the process alive), and refuses work once shut down."""

from __future__ import annotations

import functools
import subprocess
import sys
import threading

import pytest

from serverless_worker.local.daemon_pool import DaemonPool
from support.waiting import HANG_SECONDS


def test_at_most_the_pool_s_size_runs_at_once_and_the_rest_wait_their_turn() -> None:
    # given a pool of two and four calls that block until released
    pool = DaemonPool(2, name="test")
    release = threading.Event()
    started: list[str] = []
    lock = threading.Lock()
    two_started, all_done = threading.Semaphore(0), threading.Semaphore(0)

    def call(name: str) -> None:
        with lock:
            started.append(name)
        two_started.release()
        release.wait(HANG_SECONDS)  # busy until the test releases it
        all_done.release()

    for name in "abcd":
        pool.submit(functools.partial(call, name))

    # then two start, on daemon threads, and the others only once those finish
    assert two_started.acquire(timeout=HANG_SECONDS) and two_started.acquire(timeout=HANG_SECONDS)
    threads = [t for t in threading.enumerate() if t.name.startswith("test_")]
    assert len(threads) == 2 and all(t.daemon for t in threads)
    assert sorted(started) == ["a", "b"]  # both threads are busy: c and d wait (a and b in either order)
    release.set()
    for _ in range(4):
        assert all_done.acquire(timeout=HANG_SECONDS)
    assert sorted(started[:2]) == ["a", "b"] and sorted(started[2:]) == ["c", "d"]
    pool.shutdown(wait=True)
    assert not [t for t in threading.enumerate() if t.name.startswith("test_")]


def test_a_failing_call_does_not_stop_the_next_and_a_shut_down_pool_refuses_work() -> None:
    pool = DaemonPool(1, name="failing")
    ran = threading.Event()

    def fail() -> None:
        raise RuntimeError("boom")

    pool.submit(fail)
    pool.submit(ran.set)
    assert ran.wait(HANG_SECONDS)
    pool.shutdown(wait=True)
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(ran.set)


def test_a_call_that_never_returns_does_not_keep_the_process_alive() -> None:
    # given a process whose pool runs a call that never returns
    script = ("import threading\n"
              "from serverless_worker.local.daemon_pool import DaemonPool\n"
              "pool = DaemonPool(1, name='stuck')\n"
              "started = threading.Event()\n"
              "pool.submit(lambda: (started.set(), threading.Event().wait()))\n"
              "assert started.wait(10)\n"
              "pool.shutdown(wait=False)\n"
              "print('end of main')\n")

    # when its main thread ends, then the process exits (a hang fails on the timeout)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout) == (0, "end of main\n"), result.stderr
