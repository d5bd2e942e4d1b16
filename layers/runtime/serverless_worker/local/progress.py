"""Live progress of a local run: a rich spinner line on a terminal (with the last
``job.progress`` of a few running jobs below it), plain lines otherwise (a pipe, a CI log):
one when the counts changed, at most once a second, and one every ``plain_every`` seconds
while nothing changes, so a log shows that jobs are still running.

The display only shows the last :class:`Status` it was given; the runner computes it
(from the process's own counter totals), so drawing never touches the network, and a
progress value is formatted only when it is drawn.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..textforms import clipped_line

if TYPE_CHECKING:
    from .observe import JobProgress

__all__ = ["PROGRESS_SHOWN", "Progress", "Status", "progress_text"]

PROGRESS_SHOWN = 3        # running jobs whose last progress the live view shows
_PROGRESS_MAX = 60        # characters of one progress value shown
PLAIN_EVERY = 10.0        # seconds between plain lines while the counts stay the same


def progress_text(value: Any) -> str:
    """A progress value as one short line: text as it is, anything else as compact JSON."""
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), default=str)
    return clipped_line(text, _PROGRESS_MAX)


@dataclass(frozen=True)
class Status:
    """Jobs, counted as the summary counts them (``observe.JobCounts``): ``taken`` is the
    summary's "taken", a job delivered twice is one job. ``progress``: the last progress
    of the running jobs that reported one most recently (the live view shows them)."""

    taken: int = 0
    running: int = 0
    done: int = 0
    failed: int = 0
    handed_back: int = 0
    discarded: int = 0
    progress: tuple[JobProgress, ...] = ()

    @property
    def counts(self) -> tuple[int, ...]:
        return (self.taken, self.running, self.done, self.failed, self.handed_back, self.discarded)

    def line(self) -> str:
        extra = f" discarded={self.discarded}" if self.discarded else ""
        return (f"jobs taken={self.taken} running={self.running} done={self.done} failed={self.failed} "
                f"handed_back={self.handed_back}{extra}")


class Progress:
    """``update(status)`` as often as you like; ``phase(text)`` for what the runner is doing.

    ``clock`` (monotonic seconds) paces the plain lines; ``plain_every`` is how often one is
    printed while the counts do not change.
    """

    def __init__(self, console: Any, *, live: bool, clock: Callable[[], float] = time.monotonic,
                 plain_every: float = PLAIN_EVERY) -> None:
        self._console = console
        self._live_enabled = live
        self._live: Any = None
        self._status = Status()
        self._phase = "starting"
        self._lock = threading.Lock()
        self._clock = clock
        self._plain_every = plain_every
        self._printed: tuple[tuple[int, ...], str] | None = None
        self._last_print = 0.0
        self._stopped = False

    # -- the renderable (rich calls this on its refresh thread) ----------------------------
    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.spinner import Spinner
        from rich.text import Text

        with self._lock:
            status, phase = self._status, self._phase
        text = Text.assemble(
            (f"{phase}  ", "bold"),
            ("jobs taken ", "dim"), (str(status.taken), "bold"),
            ("  running ", "dim"), (str(status.running), "bold cyan"),
            ("  done ", "dim"), (str(status.done), "bold green"),
            ("  failed ", "dim"), (str(status.failed), "bold red" if status.failed else "bold"),
            ("  handed back ", "dim"), (str(status.handed_back), "bold"),
            ("   Ctrl-C drains", "dim"),
        )
        spinner = Spinner("dots", text=text)
        if not status.progress:
            return spinner
        lines = [Text.assemble(("    job ", "dim"), (entry.job_id, "bold"), (f" {entry.handler}: ", "dim"),
                               ("progress ", "dim"), (progress_text(entry.value), "cyan"))
                 for entry in status.progress]
        return Group(spinner, *lines)

    def start(self) -> Progress:
        if self._live_enabled:
            from rich.live import Live

            self._live = Live(self, console=self._console, refresh_per_second=8, transient=True)
            self._live.start()
        return self

    def update(self, status: Status) -> None:
        with self._lock:
            self._status = status
        if not self._live_enabled:
            self._print_if_changed()

    def phase(self, text: str, note: str | None = None) -> None:
        """Change the phase; ``note`` is printed as a line of its own (also on a terminal)."""
        with self._lock:
            self._phase = text
        if note:
            self._console.print(note, highlight=False, markup=False)
        if not self._live_enabled:
            self._print_if_changed(force=True)

    def _print_if_changed(self, force: bool = False) -> None:
        """A plain line when the counts or the phase changed (at most once a second), and
        every ``plain_every`` seconds when they did not."""
        now = self._clock()
        with self._lock:
            status, phase = self._status, self._phase
            current = (status.counts, phase)
            since = now - self._last_print
            changed = current != self._printed
            if not (force and changed) and not (changed and since >= 1.0) and since < self._plain_every:
                return
            self._printed, self._last_print = current, now
        self._console.print(f"{phase}: {status.line()}", highlight=False, markup=False)

    def abandon(self) -> None:
        """End the display without printing anything more (the run never got going)."""
        self._stopped = True
        if self._live is not None:
            self._live.stop()
            self._live = None

    def stop(self) -> None:
        """End the display (the last status printed, in plain mode); later calls do nothing."""
        if self._stopped:
            return
        self._stopped = True
        if self._live is not None:
            self._live.stop()
            self._live = None
        elif not self._live_enabled:
            self._print_if_changed(force=True)
