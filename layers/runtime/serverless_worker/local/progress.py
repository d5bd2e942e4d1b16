"""Live progress of a local run: a rich spinner line on a terminal, plain lines otherwise
(a pipe, a CI log), printed when something changed and at most once a second.

The display only shows the last :class:`Status` it was given; the runner computes it
(from the process's own counter totals), so drawing never touches the network.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["Progress", "Status"]


@dataclass(frozen=True)
class Status:
    """Jobs, counted as the summary counts them (``observe.JobCounts``): ``taken`` is the
    summary's "taken", a job delivered twice is one job."""

    taken: int = 0
    running: int = 0
    done: int = 0
    failed: int = 0
    handed_back: int = 0
    discarded: int = 0

    def line(self) -> str:
        extra = f" discarded={self.discarded}" if self.discarded else ""
        return (f"jobs taken={self.taken} running={self.running} done={self.done} failed={self.failed} "
                f"handed_back={self.handed_back}{extra}")


class Progress:
    """``update(status)`` as often as you like; ``phase(text)`` for what the runner is doing."""

    def __init__(self, console: Any, *, live: bool) -> None:
        self._console = console
        self._live_enabled = live
        self._live: Any = None
        self._status = Status()
        self._phase = "starting"
        self._lock = threading.Lock()
        self._printed: tuple[Status, str] | None = None
        self._last_print = 0.0
        self._stopped = False

    # -- the renderable (rich calls this on its refresh thread) ----------------------------
    def __rich__(self) -> Any:
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
        return Spinner("dots", text=text)

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
        now = time.monotonic()
        with self._lock:
            current = (self._status, self._phase)
            due = force or now - self._last_print >= 1.0
            if current == self._printed or not due:
                return
            self._printed, self._last_print = current, now
        self._console.print(f"{current[1]}: {current[0].line()}", highlight=False, markup=False)

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
