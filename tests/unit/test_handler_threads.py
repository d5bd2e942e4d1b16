"""Unit tier: handler threads are reused, named for what they run, and bounded when idle."""

from __future__ import annotations

import threading

from serverless_worker.handler_threads import HandlerThreads
from support.waiting import HANG_SECONDS, wait_for


def _run_and_wait(pool: HandlerThreads, name: str) -> tuple[str, int]:
    seen: list[tuple[str, int]] = []
    done = threading.Event()

    def task() -> None:
        current = threading.current_thread()
        seen.append((current.name, current.ident or 0))
        done.set()

    pool.run(name, task)
    assert done.wait(HANG_SECONDS)
    return seen[0]


def _wait_idle(pool: HandlerThreads, count: int) -> None:
    wait_for(lambda: pool.idle() == count, what=f"{count} idle threads", interval=0.01)


def test_a_finished_run_leaves_its_thread_to_the_next_under_the_next_name() -> None:
    pool = HandlerThreads()
    first_name, first_thread = _run_and_wait(pool, "sw-handler-a")
    _wait_idle(pool, 1)

    second_name, second_thread = _run_and_wait(pool, "sw-handler-b")

    assert (first_name, second_name) == ("sw-handler-a", "sw-handler-b")
    assert second_thread == first_thread
    _wait_idle(pool, 1)
    assert any(t.name == "sw-handler-idle" for t in threading.enumerate())


def test_a_busy_thread_is_not_given_more_work_and_idle_threads_are_bounded() -> None:
    # given a pool keeping at most one idle thread, and a run that blocks
    pool = HandlerThreads(max_idle=1)
    release = threading.Event()
    blocked = threading.Event()

    def stuck() -> None:
        blocked.set()
        release.wait(HANG_SECONDS)  # busy until the test releases it

    pool.run("sw-handler-stuck", stuck)
    assert blocked.wait(HANG_SECONDS)

    # when another run comes while it is busy, it gets a thread of its own
    _, other = _run_and_wait(pool, "sw-handler-other")
    assert other != next(t.ident for t in threading.enumerate() if t.name == "sw-handler-stuck")
    _wait_idle(pool, 1)

    # and when the stuck one finishes too, only one thread stays idle
    release.set()
    wait_for(lambda: not any(t.name == "sw-handler-stuck" for t in threading.enumerate()),
             what="the stuck run to finish", interval=0.01)
    assert pool.idle() == 1
