"""Progress on stderr that reaches terminals, log files and pipes alike; every long stage uses this module.

In a terminal a bar per task moves as work is done, with the rate and the time left. When stderr is not a
terminal (a Slurm log, `2> file`, a pipe) bars would print nothing until the end, so a plain line per running
task is printed instead every `interval` seconds (default 20, `COSEARCH_PROGRESS_SECONDS`), whether or not
work finished since the last line, and one when a task ends:

    12:03:04 rollout: 10/21 questions (48%), 1.7/min, 6:00 elapsed, ~6:28 left; 3,120 tokens generated

The time left is the remaining work at the average rate since the task started, not at the rate of the last
few seconds: rollouts finish questions in bursts (a whole batch at once), and a recent-rate estimate then
jumps to "1 s left" halfway through. A task can carry `live`, read at every refresh, that describes work
below its unit (trajectories finished, tokens generated so far), so a bar moves within seconds even when
questions take minutes, and gives the share of work done in that finer unit, which then sets the rate.

Stage functions stay free of printing: they take plain callbacks (`on_progress(done, total)`) and the CLI
layer connects those to a `Progress`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from rich.console import Console
from rich.progress import BarColumn, ProgressColumn, SpinnerColumn, TextColumn
from rich.progress import Progress as RichProgress
from rich.text import Text

INTERVAL = 20.0  # seconds between plain lines when stderr is not a terminal
INTERVAL_VARIABLE = "COSEARCH_PROGRESS_SECONDS"


def interval_from_env() -> float:
    """Seconds between plain progress lines: $COSEARCH_PROGRESS_SECONDS if set (and positive), else 20."""
    try:
        value = float(os.environ.get(INTERVAL_VARIABLE, INTERVAL))
    except ValueError:
        return INTERVAL
    return value if value > 0 else INTERVAL


def duration(seconds: float) -> str:
    """4:05 or 1:02:03."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def rate_text(per_second: float) -> str:
    """A rate in the unit that gives a readable number: 12.3/s, 1.7/min or 2.0/h."""
    if per_second >= 1:
        return f"{per_second:.1f}/s"
    if per_second * 60 >= 1:
        return f"{per_second * 60:.1f}/min"
    return f"{per_second * 3600:.1f}/h"


class Live(Protocol):
    """Work below a task's unit, read at every refresh: a text for the line, and the share of the work done
    (0..1, or None when unknown)."""

    def text(self) -> str: ...

    def share(self) -> float | None: ...


@dataclass
class Task:
    """One piece of work: `done` of `total` units (total None when unknown) since `started`."""

    label: str
    total: float | None
    unit: str
    started: float
    done: float = 0
    ended: float | None = None
    live: Live | Callable[[], Live | str | None] | None = None

    def rate(self, now: float) -> float | None:
        """Units per second, averaged since the start."""
        elapsed = (self.ended or now) - self.started
        return self.done / elapsed if self.done > 0 and elapsed > 0 else None

    def remaining(self, now: float) -> float | None:
        """Seconds left at the average rate since the start; None before any work is done. When `live` also
        knows the share of the work done in a finer unit (trajectories, when all questions are in flight
        together), that gives a second estimate, elapsed x (1 - share) / share, and the longer one is shown:
        trajectories that finish last are the long ones (more searches), so the finer estimate alone runs
        short (measured: 2:42 left at 25 of 32 trajectories, 17 min in fact; by questions 29 min)."""
        if self.total is None:
            return None
        estimates = []
        rate = self.rate(now)
        if rate is not None:
            estimates.append(max(0.0, self.total - self.done) / rate)
        live = self._live()
        share = live.share() if hasattr(live, "share") else None
        if share and self.done < self.total:
            estimates.append(((self.ended or now) - self.started) * (1 - share) / share)
        return max(estimates) if estimates else None

    def _live(self):
        """The live object (or text) now: `live` itself, or what calling it returns."""
        live = self.live
        return live() if callable(live) and not hasattr(live, "text") else live

    def status(self, now: float) -> str:
        """Rate, elapsed and remaining time (what a bar shows beside itself)."""
        parts = []
        rate = self.rate(now)
        if rate is not None:
            parts.append(rate_text(rate))
        parts.append(f"{duration((self.ended or now) - self.started)} elapsed")
        if self.ended is None and self.total is not None:
            left = self.remaining(now)
            parts.append(f"~{duration(left)} left" if left is not None else "time left unknown yet")
        text = ", ".join(parts)
        live = self._live()
        live = live.text() if hasattr(live, "text") else live
        return f"{text}; {live}" if live else text

    def line(self, now: float) -> str:
        """The whole plain line (without the clock time)."""
        unit = f" {self.unit}" if self.unit else ""
        parts = []
        if self.total is not None:
            share = f" ({self.done / self.total:.0%})" if self.total else ""
            parts.append(f"{_count(self.done)}/{_count(self.total)}{unit}{share}")
        elif self.done:
            parts.append(f"{_count(self.done)}{unit}")
        if self.ended is not None:
            parts.append("done")
        elif not parts:
            parts.append("running")
        return f"{self.label}: {', '.join(parts)}, {self.status(now)}"


def _count(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:,.1f}"


class _Status(ProgressColumn):
    """The bar's rate / elapsed / time-left text, computed by the task itself (see Task.remaining)."""

    def __init__(self, owner: "Progress"):
        super().__init__()
        self.owner = owner

    def render(self, task) -> Text:
        ours = task.fields.get("task")
        return Text(ours.status(self.owner.clock()) if ours is not None else "", style="progress.remaining")


class _Count(ProgressColumn):
    def render(self, task) -> Text:
        ours = task.fields.get("task")
        if ours is None:
            return Text("")
        total = f"/{_count(ours.total)}" if ours.total is not None else ""
        unit = f" {ours.unit}" if ours.unit else ""
        return Text(f"{_count(ours.done)}{total}{unit}", style="progress.download")


class Progress:
    """Progress of one command's tasks on stderr: bars in a terminal, plain lines every `interval` seconds
    otherwise. Use as a context manager; `quiet` prints nothing (log lines included)."""

    def __init__(self, quiet: bool = False, *, console: Console | None = None, interval: float | None = None,
                 clock: Callable[[], float] = time.monotonic, plain: bool | None = None, ticker: bool = True):
        self.console = console or Console(stderr=True)
        self.quiet = quiet
        self.interval = interval if interval is not None else interval_from_env()
        self.clock = clock
        self.plain = (not self.console.is_terminal) if plain is None else plain
        self.tasks: list[Task] = []
        self._ticker = ticker
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bars: RichProgress | None = None
        self._bar_ids: dict[int, int] = {}

    # -- lifecycle ----------------------------------------------------------------------------------------

    def __enter__(self) -> "Progress":
        if self.quiet:
            return self
        if self.plain:
            if self._ticker:
                self._thread = threading.Thread(target=self._tick_forever, name="cosearch-progress", daemon=True)
                self._thread.start()
        else:
            self._bars = RichProgress(SpinnerColumn(), TextColumn("[progress.description]{task.description}"),
                                      BarColumn(), _Count(), _Status(self), console=self.console,
                                      transient=False, refresh_per_second=4)
            self._bars.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._bars is not None:
            self._bars.stop()
        elif not self.quiet and exc[0] is None:
            for task in self.tasks:
                if task.ended is None:
                    self.finish(task)

    # -- tasks ----------------------------------------------------------------------------------------------

    def add(self, label: str, total: float | None = None, *, unit: str = "", done: float = 0,
            live: Live | Callable[[], Live | str | None] | None = None) -> Task:
        task = Task(label, total, unit, self.clock(), done=done, live=live)
        with self._lock:
            self.tasks.append(task)
        if self._bars is not None:
            self._bar_ids[id(task)] = self._bars.add_task(label, total=total, completed=done, task=task)
        return task

    def advance(self, task: Task, n: float = 1) -> None:
        self.update(task, done=task.done + n)

    def update(self, task: Task, *, done: float | None = None, total: float | None = None,
               label: str | None = None) -> None:
        if done is not None:
            task.done = done
        if total is not None:
            task.total = total
        if label is not None:
            task.label = label
        if self._bars is not None:
            self._bars.update(self._bar_ids[id(task)], completed=task.done, total=task.total,
                              description=task.label)

    def finish(self, task: Task) -> None:
        """Mark a task ended; in plain mode print its final line now."""
        if task.ended is not None:
            return
        task.ended = self.clock()
        if self._bars is not None:
            self._bars.update(self._bar_ids[id(task)], completed=task.done, total=task.total or task.done)
            self._bars.stop_task(self._bar_ids[id(task)])
        elif not self.quiet:
            self._print(task.line(task.ended))

    def log(self, message: str) -> None:
        """A timestamped line (above the bars in a terminal)."""
        if not self.quiet:
            self._print(message)

    # -- plain lines ------------------------------------------------------------------------------------------

    def tick(self, now: float | None = None) -> list[str]:
        """One plain line per running task (what the ticker prints every `interval` seconds)."""
        now = self.clock() if now is None else now
        with self._lock:
            running = [task for task in self.tasks if task.ended is None]
        lines = [task.line(now) for task in running]
        for line in lines:
            self._print(line)
        return lines

    def _tick_forever(self) -> None:
        while not self._stop.wait(self.interval):
            self.tick()

    def _print(self, message: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        with self._lock:
            self.console.print(f"{stamp} {message}", highlight=False, markup=False, soft_wrap=True)
