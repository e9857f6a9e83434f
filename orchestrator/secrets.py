"""Secrets never leave the process in clear (issue 30): the values of the request headers a
plan reads from the environment (an external endpoint's API key) are registered here when they
are resolved, and every text that is stored, printed or logged passes through ``scrub``: an
endpoint that echoes the key in an error body must not get it into ``requests.error``, a run's
reason, a verdict's evidence, the exports, the report or the log. Anything shaped like a bearer
token or an OpenAI-style key is scrubbed too, registered or not. Standard library only: every
layer may use it."""

from __future__ import annotations

import re
from typing import Any

REDACTED = "[redacted]"
MIN_SECRET_CHARS = 6  # shorter values would scrub ordinary words
_SECRETS: set[str] = set()
# "Bearer <token>", "api_key=<token>", "x-api-key: <token>": the token part, 12+ characters.
_LABELLED = re.compile(r"(?i)\b(bearer|token|api[_-]?key|authorization)(\"?\s*[:=]?\s*\"?\s*)([A-Za-z0-9._~+/=-]{12,})")
_KEY_SHAPED = re.compile(r"\bsk-[A-Za-z0-9_-]{12,}")


def register(value: str) -> None:
    """A value that must never be stored or printed (and, for ``Scheme token``, its token)."""
    for v in (value, *value.split()[1:]):
        if len(v) >= MIN_SECRET_CHARS:
            _SECRETS.add(v)


def scrub(text: str) -> str:
    """``text`` with every registered secret and every token-shaped value replaced."""
    if not text:
        return text
    for s in sorted(_SECRETS, key=len, reverse=True):
        if s in text:
            text = text.replace(s, REDACTED)
    text = _LABELLED.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)
    return _KEY_SHAPED.sub(REDACTED, text)


def scrub_value(value: Any) -> Any:
    """A JSON-like value with every string in it scrubbed (a verdict's evidence, a fingerprint)."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {k: scrub_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(scrub_value(v) for v in value)
    return value
