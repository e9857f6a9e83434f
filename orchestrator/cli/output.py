"""How commands speak: one JSON document with --json, readable lines otherwise.

On a terminal a line folds at its width between words, the rest indented under its start (the
terminal itself would cut words anywhere); piped or redirected output keeps each line whole."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from typing import IO, Any


def emit_json(doc: Any) -> None:
    """Print exactly one JSON document on stdout."""
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def fold(line: str, width: int) -> str:
    """``line`` folded to ``width`` columns between words (a word longer than a row is cut):
    continuation rows are indented two columns past the line's own indent."""
    if len(line) <= width:
        return line
    indent = line[: len(line) - len(line.lstrip(" "))]
    rows = textwrap.wrap(line, width=width, subsequent_indent=indent + "  ", break_on_hyphens=False,
                         break_long_words=True)
    return "\n".join(rows) if rows else line


def _write(stream: IO[str], line: str, whole: bool = False) -> None:
    if line and not whole and stream.isatty():
        line = fold(line, shutil.get_terminal_size().columns)
    stream.write(line + "\n")


def say(line: str = "", whole: bool = False) -> None:
    """A line for people (stdout); ``whole``: a line to copy (a command to paste), never folded."""
    _write(sys.stdout, line, whole)


def warn(line: str) -> None:
    """A warning for people (stderr, so --json stdout stays one document)."""
    _write(sys.stderr, f"warning: {line}")
