"""Progress of an experiment for people: a bar per block and point on a TTY, plain lines otherwise.

Every line is an INFO record of the ``orchestrator.progress`` logger, carrying the run's context
(``orchestrator.logs``); the terminal handler prints it on stderr (so --json stdout stays
clean), above the bars when they are shown.
"""

from __future__ import annotations

import sys
from typing import Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from orchestrator import logs

log = logs.get_logger("orchestrator.progress")


class ProgressSink(Protocol):
    def blocks(self, total: int) -> None: ...
    def run_started(self, block: int, arm: str, attempt: int) -> None: ...
    def point_started(self, label: str, seconds: float) -> None: ...
    def point_done(self, line: str) -> None: ...
    def run_done(self, line: str) -> None: ...
    def block_done(self) -> None: ...
    def note(self, line: str) -> None: ...
    def close(self) -> None: ...


class PlainProgress:
    """One line per event, for logs and pipes."""

    def __init__(self) -> None:
        logs.ensure_configured()

    def _say(self, line: str) -> None:
        log.info(line)

    def blocks(self, total: int) -> None:
        self._say(f"{total} block(s) to run")

    def run_started(self, block: int, arm: str, attempt: int) -> None:
        self._say(f"block {block} arm {arm}" + (f" (attempt {attempt + 1})" if attempt else "") + ": deploying")

    def point_started(self, label: str, seconds: float) -> None:
        self._say(f"  point {label} ({seconds:.0f}s)")

    def point_done(self, line: str) -> None:
        self._say(f"    {line}")

    def run_done(self, line: str) -> None:
        self._say(f"  {line}")

    def block_done(self) -> None:
        pass

    def note(self, line: str) -> None:
        self._say(line)

    def close(self) -> None:
        pass


class RichProgress(PlainProgress):
    """Bars for blocks and the current point; event lines printed above them."""

    def __init__(self) -> None:
        self.console = Console(stderr=True)
        super().__init__()
        self.bar = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=self.console, transient=True,
        )
        self.bar.start()
        self.block_task: TaskID | None = None
        self.point_task: TaskID | None = None

    def blocks(self, total: int) -> None:
        self.block_task = self.bar.add_task("blocks", total=total)

    def point_started(self, label: str, seconds: float) -> None:
        super().point_started(label, seconds)
        if self.point_task is not None:
            self.bar.remove_task(self.point_task)
        self.point_task = self.bar.add_task(f"point {label}", total=None)

    def block_done(self) -> None:
        if self.block_task is not None:
            self.bar.advance(self.block_task)

    def close(self) -> None:
        self.bar.stop()


def progress_for_terminal() -> ProgressSink:
    """Rich bars when stderr is a terminal, plain lines otherwise."""
    return RichProgress() if sys.stderr.isatty() else PlainProgress()
