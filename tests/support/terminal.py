"""A real pseudo-terminal for tests of what people read (issue 32): a command runs with its
stdin, stdout and stderr on a pty of a given size (as in a terminal window: `isatty()` is true
and the window size is what the kernel reports), and everything it writes goes to a ``pyte``
screen (a VT100 emulator: cursor moves, erases and wraps as a terminal does them) and, raw, to
``text`` (escape sequences removed) for the lines as the program wrote them."""

from __future__ import annotations

import fcntl
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pyte
from rich.cells import cell_len

ROOT = Path(__file__).resolve().parents[2]
# CSI sequences (colours, cursor moves, erases), OSC sequences, and lone ESC + one character.
ESCAPES = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def orch_command(*args: str) -> list[str]:
    """`orch ARGS` as installed (the venv's console script), else the module."""
    script = Path(sys.executable).with_name("orch")
    return [str(script), *args] if script.exists() else [sys.executable, "-m", "orchestrator.cli.main", *args]


class Terminal:
    """One command in a ``cols`` x ``rows`` pseudo-terminal (rows enough that nothing scrolls)."""

    def __init__(self, argv: Sequence[str], env: dict[str, str] | None = None, cols: int = 80, rows: int = 300):
        self.cols = cols
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        child_env = {**os.environ, **(env or {}), "TERM": "xterm-256color"}
        for name in ("COLUMNS", "LINES", "FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "ORCH_DEBUG"):
            child_env.pop(name, None)  # the window size and the terminal are the pty's
        self.proc = subprocess.Popen(list(argv), stdin=slave, stdout=slave, stderr=slave, env=child_env, cwd=ROOT,
                                     start_new_session=True)
        os.close(slave)
        self.master = master
        self.screen = pyte.Screen(cols, rows)
        self.stream = pyte.ByteStream(self.screen)
        self.raw = bytearray()
        self.closed = False

    def _pump(self, wait_s: float) -> None:
        if self.closed:
            time.sleep(min(wait_s, 0.05))
            return
        ready, _, _ = select.select([self.master], [], [], wait_s)
        if not ready:
            return
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: every writer of the pty has closed it
            data = b""
        if not data:
            self.closed = True
            return
        self.raw.extend(data)
        self.stream.feed(data)

    def wait_for(self, predicate: Callable[[Terminal], bool], timeout: float = 120.0, what: str = "") -> None:
        """Read until ``predicate(self)`` holds; fail with the screen after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not predicate(self):
            if time.monotonic() > deadline:
                raise AssertionError(f"not seen within {timeout:.0f}s: {what}\n" + "\n".join(self.display()))
            if self.closed and self.proc.poll() is not None:
                raise AssertionError(f"the command ended (exit {self.proc.returncode}) before: {what}\n"
                                     + "\n".join(self.display()))
            self._pump(0.1)

    def wait_for_text(self, text: str, timeout: float = 120.0) -> None:
        self.wait_for(lambda t: text in "\n".join(t.display()), timeout, repr(text))

    def finish(self, timeout: float = 120.0) -> int:
        """Read to the end; the exit code."""
        deadline = time.monotonic() + timeout
        while not (self.closed and self.proc.poll() is not None):
            if time.monotonic() > deadline:
                self.close()
                raise AssertionError(f"still running after {timeout:.0f}s\n" + "\n".join(self.display()))
            self._pump(0.1)
        return self.proc.returncode

    def send(self, data: bytes) -> None:
        os.write(self.master, data)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.master >= 0:
            os.close(self.master)
            self.master = -1
            self.closed = True

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def display(self) -> list[str]:
        """The screen's rows now, trailing blanks and blank rows at the end removed."""
        rows = [row.rstrip() for row in self.screen.display]
        while rows and not rows[-1]:
            rows.pop()
        return rows

    @property
    def text(self) -> str:
        """What the command wrote, escape sequences removed (lines as it wrote them)."""
        return ESCAPES.sub("", self.raw.decode("utf-8", "replace")).replace("\r\n", "\n")

    def long_lines(self) -> list[str]:
        """Each line the command wrote wider than the terminal (the terminal had to wrap it)."""
        return [ln for line in self.text.split("\n") for ln in [line.split("\r")[-1]] if cell_len(ln) > self.cols]
