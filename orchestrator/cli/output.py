"""How commands speak: one JSON document with --json, readable lines otherwise."""

from __future__ import annotations

import json
import sys
from typing import Any


def emit_json(doc: Any) -> None:
    """Print exactly one JSON document on stdout."""
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def say(line: str = "") -> None:
    """A line for people (stdout)."""
    sys.stdout.write(line + "\n")


def warn(line: str) -> None:
    """A warning for people (stderr, so --json stdout stays one document)."""
    sys.stderr.write(f"warning: {line}\n")
