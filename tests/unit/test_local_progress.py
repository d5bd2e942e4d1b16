"""The local run's live display: on a terminal the spinner line and the last job.progress of
running jobs; otherwise plain lines, when the counts change (at most once a second) and every
few seconds while they do not, so a piped log shows what is running."""

from __future__ import annotations

import io

from rich.console import Console

from serverless_worker.local.observe import JobProgress
from serverless_worker.local.progress import Progress, Status


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def plain(clock: Clock) -> tuple[Progress, io.StringIO]:
    out = io.StringIO()
    return Progress(Console(file=out, width=200), live=False, clock=clock, plain_every=10.0), out


def test_plain_lines_tell_the_true_counts_when_they_change_and_periodically_while_they_do_not() -> None:
    clock = Clock()
    progress, out = plain(clock)
    progress.phase("working")
    running = Status(taken=2, running=2)

    clock.now += 1.5
    progress.update(running)           # changed, a second since the last line: printed
    clock.now += 0.2
    progress.update(Status(taken=3, running=3))  # changed, but within the second: not yet
    clock.now += 5
    progress.update(Status(taken=3, running=3))  # now due
    clock.now += 5
    progress.update(Status(taken=3, running=3))  # unchanged, 5 s: nothing
    clock.now += 5
    progress.update(Status(taken=3, running=3))  # unchanged, 10 s: the periodic line
    progress.stop()

    assert out.getvalue().splitlines() == [
        "working: jobs taken=0 running=0 done=0 failed=0 handed_back=0",
        "working: jobs taken=2 running=2 done=0 failed=0 handed_back=0",
        "working: jobs taken=3 running=3 done=0 failed=0 handed_back=0",
        "working: jobs taken=3 running=3 done=0 failed=0 handed_back=0",
    ]


def test_a_new_progress_value_alone_prints_no_plain_line() -> None:
    clock = Clock()
    progress, out = plain(clock)
    progress.update(Status(taken=1, running=1))
    clock.now += 2
    progress.update(Status(taken=1, running=1, progress=(JobProgress("7", "slow", 50, 1),)))

    assert len(out.getvalue().splitlines()) == 1


def test_the_live_view_shows_the_running_jobs_progress() -> None:
    progress = Progress(Console(file=io.StringIO()), live=True)
    progress.update(Status(taken=2, running=2, progress=(JobProgress("7", "slow", {"page": 3}, 1),
                                                         JobProgress("8", "slow", "x" * 200, 2))))
    console = Console(file=io.StringIO(), width=120, record=True)

    console.print(progress.__rich__())

    text = console.export_text()
    assert "running 2" in text
    assert 'job 7 slow: progress {"page":3}' in text
    assert "job 8 slow: progress " + "x" * 57 + "..." in text
