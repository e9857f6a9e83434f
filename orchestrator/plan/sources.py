"""A workload's own data: a prompts file or a request trace, named by path and sha256 (pure).

Prompts (JSONL, one object a line; or one JSON array of such objects, as ShareGPT ships), any of:
  {"prompt": "text"}                                   a completion prompt
  {"messages": [{"role": "user", "content": "..."}]}   a chat conversation (its last turn is sent)
  {"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}]}
                                                       ShareGPT: the first human turn (with any
                                                       system turn before it) is the prompt, the
                                                       gpt reply after it gives the output length
  an optional "output_tokens" on any line sets that request's reply length.
  Replayed as live sessions (``workload.sessions``), each conversation is one session: every
  user turn is sent after the reply before it (``read_conversations``); a recorded reply gives
  its turn's reply length.
Trace (JSONL, the Mooncake trace's shape): {"timestamp": ms, "input_length": n,
  "output_length": n, "hash_ids": [block ids]}; requests sharing a hash id share that block of
  their prompt (``block_tokens`` tokens each, 512 in Mooncake's traces). Multi-turn traces (as
  AIPerf's Mooncake reader takes them) add "session_id" (the turns of one session, in file
  order) and, on a later turn, "delay" (ms the user waits after the reply before it; such a
  turn may leave out its timestamp).

The file's sha256 is part of the registered plan (filled in when the plan is loaded): an edited
file is a different plan, and a run refuses a file whose hash no longer matches.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import stat
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from pydantic import Field

from orchestrator.plan.base import StrictModel

MAX_FILE_BYTES = 256 << 20  # bounded time and memory for any plan: 256 MiB at most
MAX_LINES = 2_000_000
SHA256 = r"^[0-9a-f]{64}$"


class DataSource(StrictModel):
    """The workload's data file, by path (relative to the working directory) and content hash."""

    kind: Literal["prompts", "trace"] = Field(
        description="prompts: JSONL prompts or chat conversations (ShareGPT accepted); trace: "
        "JSONL of timestamp (ms), input_length, output_length, hash_ids (and session_id, delay "
        "for a multi-turn trace replayed with `sessions`)."
    )
    path: str = Field(min_length=1, max_length=4096, description="Path of the file.")
    sha256: str | None = Field(
        default=None, pattern=SHA256,
        description="sha256 of the file; filled in from the file when the plan is loaded, so the "
        "registered plan pins the data (a run refuses a file that no longer matches).",
    )
    block_tokens: int = Field(
        default=512, ge=16, le=65_536,
        description="trace: tokens per hash id block (512 in Mooncake's traces; at most 65536).",
    )


@dataclass(frozen=True, slots=True)
class PromptEntry:
    """One line of a prompts file: a completion prompt or chat messages (role, content)."""

    prompt: str
    messages: tuple[tuple[str, str], ...]  # empty for a completion prompt
    output_tokens: int | None


@dataclass(frozen=True, slots=True)
class TraceEntry:
    """One request of a trace: arrival (s from the trace's start), lengths, shared blocks."""

    t_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]
    session: str | None = None  # the record's session id, if it has one
    delay_s: float | None = None  # a later turn's stated think time after the reply before it


@dataclass(frozen=True, slots=True)
class ConversationTurn:
    """One user turn of a conversation: the messages it adds (its user message, with any system
    or tool message before it) and the length of the reply the file recorded after it."""

    messages: tuple[tuple[str, str], ...]
    reply_tokens: int | None  # None: the file records no reply to this turn


@dataclass(frozen=True, slots=True)
class Conversation:
    """A conversation of a prompts file, turn by turn (``at``: where it is in the file)."""

    turns: tuple[ConversationTurn, ...]
    at: str


class DataFileError(ValueError):
    """A data file that is missing, too large or not in its format (one line says why)."""


# Not data a plan may name: kernel and device files (a /proc file says size 0 and never ends,
# a FIFO or a device blocks the reader). Refused by where they resolve to and by their type.
SPECIAL_ROOTS = ("/proc/", "/sys/", "/dev/")
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def open_regular(path: str | Path) -> io.BufferedReader:
    """Open a file the user named for reading, refusing anything but a regular file before a
    byte is read: opened non-blocking (a FIFO does not hang the open), its type read from the
    open file (no race with a swapped path), kernel and device trees refused by where the path
    resolves. Raises DataFileError with one line."""
    real = os.path.realpath(path)
    if real.startswith(SPECIAL_ROOTS) or real in ("/proc", "/sys", "/dev"):
        raise DataFileError(f"{path} is a kernel or device file ({real}), not a data file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise DataFileError(f"no such file: {path} (paths are relative to the working directory)") from None
    except OSError as e:
        raise DataFileError(f"cannot read {path}: {e.strerror or e}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise DataFileError(f"{path} is {kind}, not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_bounded(path: str | Path, limit: int = MAX_FILE_BYTES) -> bytes:
    """A regular file's bytes, at most ``limit`` (counted while reading: a file's stated size is
    not trusted)."""
    with open_regular(path) as f:
        raw = f.read(limit + 1)
    if len(raw) > limit:
        raise DataFileError(f"{path} is larger than {_size(limit)}")
    return raw


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n} bytes"


def file_sha256(path: str | Path) -> str:
    h, n = hashlib.sha256(), 0
    with open_regular(path) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            n += len(chunk)
            if n > MAX_FILE_BYTES:
                raise DataFileError(f"{path} is larger than {_size(MAX_FILE_BYTES)}")
            h.update(chunk)
    return h.hexdigest()


def _lines(path: str | Path) -> list[dict]:
    """The file's records: JSONL (one object a line), or one JSON array of objects (ShareGPT's
    own files); ``__line`` its line or element number, ``__at`` that in words for messages."""
    out: list[dict] = []
    try:
        text = read_bounded(path).decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataFileError(f"{path}: not UTF-8 text (byte {e.start})") from None
    if text.lstrip().startswith("["):
        return _array(path, text)
    with io.StringIO(text) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            if len(out) >= MAX_LINES:
                raise DataFileError(f"{path}: more than {MAX_LINES} lines")
            try:
                doc = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataFileError(f"{path} line {n}: not JSON ({e.msg})") from None
            out.append(_record(path, doc, n, f"line {n}"))
    if not out:
        raise DataFileError(f"{path}: no records")
    return out


def _record(path: str | Path, doc: object, n: int, at: str) -> dict:
    """A record of the file (a JSON object), marked with where it is (``at``: for messages)."""
    if not isinstance(doc, dict):
        raise DataFileError(f"{path} {at}: expected a JSON object")
    doc["__line"], doc["__at"] = n, at
    return doc


def _array(path: str | Path, text: str) -> list[dict]:
    """A JSON array of objects, read element by element (a bad element is named by number)."""
    decoder = json.JSONDecoder()
    out: list[dict] = []
    i = text.index("[") + 1
    n = 0
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text):
            raise DataFileError(f"{path}: the JSON array is not closed")
        if text[i] == "]":
            break
        n += 1
        if len(out) >= MAX_LINES:
            raise DataFileError(f"{path}: more than {MAX_LINES} elements")
        try:
            doc, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError as e:
            raise DataFileError(f"{path} element {n}: not JSON ({e.msg}, line {e.lineno})") from None
        out.append(_record(path, doc, n, f"element {n}"))
    if text[i + 1:].strip():
        raise DataFileError(f"{path}: text after the JSON array")
    if not out:
        raise DataFileError(f"{path}: no records")
    return out


_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                   "chatgpt": "assistant", "bing": "assistant", "bard": "assistant", "system": "system"}


def _prompt_entry(path: str | Path, doc: dict) -> PromptEntry | None:
    n = doc["__at"]
    out = doc.get("output_tokens")
    if out is not None and (not isinstance(out, int) or isinstance(out, bool) or not 1 <= out <= 1_000_000):
        raise DataFileError(f"{path} {n}: output_tokens must be an integer in [1, 1000000]")
    if isinstance(doc.get("prompt"), str):
        return PromptEntry(doc["prompt"], (), out) if doc["prompt"].strip() else None
    if isinstance(doc.get("messages"), list):
        msgs = []
        for m in doc["messages"]:
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise DataFileError(f"{path} {n}: each message needs a string role and content")
            msgs.append((m["role"], m["content"]))
        if not msgs:
            return None
        return PromptEntry(" ".join(c for _, c in msgs), tuple(msgs), out)
    if isinstance(doc.get("conversations"), list):
        msgs, reply = [], None
        for turn in doc["conversations"]:
            if not isinstance(turn, dict):
                continue
            role = _SHAREGPT_ROLES.get(str(turn.get("from", "")).lower())
            value = turn.get("value")
            if role is None or not isinstance(value, str):
                continue
            if role == "assistant":
                if msgs and msgs[-1][0] == "user":
                    reply = value
                    break
                continue
            msgs.append((role, value))
        if not msgs or msgs[-1][0] != "user":
            return None  # no human turn to send: skipped, as benchmarks do
        if out is None and reply is not None:
            out = max(1, len(reply.split()))
        return PromptEntry(" ".join(c for _, c in msgs), tuple(msgs), out)
    raise DataFileError(f"{path} {n}: expected `prompt`, `messages` or ShareGPT `conversations`")


def read_prompts(path: str | Path) -> list[PromptEntry]:
    """Every usable prompt of a prompts file, in file order (lines without a prompt skipped)."""
    entries = [e for doc in _lines(path) if (e := _prompt_entry(path, doc)) is not None]
    if not entries:
        raise DataFileError(f"{path}: no usable prompt")
    return entries


def _int_field(path: str | Path, doc: dict, key: str, lo: int) -> int:
    v = doc.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= 1_000_000:
        raise DataFileError(f"{path} {doc['__at']}: {key} must be an integer in [{lo}, 1000000]")
    return v


def _session_id(path: str | Path, doc: dict) -> str | None:
    sid = doc.get("session_id")
    if sid is None:
        return None
    if isinstance(sid, bool) or not isinstance(sid, str | int) or (isinstance(sid, str) and not sid.strip()):
        raise DataFileError(f"{path} {doc['__at']}: session_id must be a non-empty string or an integer")
    return str(sid)


def _ms(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v == v and 0 <= v < float("inf")


def read_trace(path: str | Path, sessions: bool = False) -> list[TraceEntry]:
    """A trace's requests in arrival order, times in seconds from its first request. A trace
    is replayed as recorded: one whose timestamps go back is refused at the line (sorting it
    silently would replay another trace). Read for sessions, a later turn of a session may give
    ``delay`` instead of a timestamp (its time is then the turn before's plus the delay)."""
    rows: list[TraceEntry] = []
    last: tuple[float, str] | None = None
    seen: dict[str, float] = {}  # session -> time of its latest turn, ms
    for doc in _lines(path):
        at, sid, ts, delay = doc["__at"], _session_id(path, doc), doc.get("timestamp"), doc.get("delay")
        if delay is not None and not _ms(delay):
            raise DataFileError(f"{path} {at}: delay must be a number >= 0 (ms)")
        if delay is not None and (sid is None or sid not in seen):
            raise DataFileError(f"{path} {at}: delay is the wait after the reply before it: only a later "
                                "turn of a session (an earlier line with its session_id) has one")
        if ts is None and delay is not None and sid is not None and sessions:
            ts = seen[sid] + float(delay)  # not an arrival of the file: no order to check
        elif not _ms(ts):
            raise DataFileError(f"{path} {at}: timestamp must be a number >= 0 (ms)")
        else:
            assert isinstance(ts, int | float)
            if last is not None and ts < last[0]:
                raise DataFileError(f"{path} {at}: timestamp {ts:g} ms is earlier than {last[1]}'s "
                                    f"{last[0]:g} ms; a trace is replayed in its own order: sort it by timestamp")
            last = (float(ts), str(at))
        if sid is not None:
            seen[sid] = float(ts)
        ids = doc.get("hash_ids", [])
        if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
            raise DataFileError(f"{path} {at}: hash_ids must be a list of integers")
        rows.append(TraceEntry(float(ts) / 1000.0, _int_field(path, doc, "input_length", 1),
                               _int_field(path, doc, "output_length", 1), tuple(ids), sid,
                               None if delay is None else float(delay) / 1000.0))
    t0 = min(r.t_s for r in rows)
    return [replace(r, t_s=r.t_s - t0) for r in rows]


def _message_list(path: str | Path, doc: dict) -> list[tuple[str, str]]:
    """A record's messages (role, content) in order: chat ``messages`` or ShareGPT
    ``conversations`` (its roles mapped to user/assistant/system; entries of no known role
    skipped, as benchmarks do), or a ``prompt`` (one user message)."""
    n = doc["__at"]
    if isinstance(doc.get("prompt"), str):
        return [("user", doc["prompt"])] if doc["prompt"].strip() else []
    if isinstance(doc.get("messages"), list):
        msgs = []
        for k, m in enumerate(doc["messages"], 1):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise DataFileError(f"{path} {n}: message {k} needs a string role and content")
            msgs.append((m["role"], m["content"]))
        return msgs
    if isinstance(doc.get("conversations"), list):
        out = []
        for turn in doc["conversations"]:
            role = _SHAREGPT_ROLES.get(str(turn.get("from", "")).lower()) if isinstance(turn, dict) else None
            if role is not None and isinstance(turn.get("value"), str):
                out.append((role, turn["value"]))
        return out
    raise DataFileError(f"{path} {n}: expected `prompt`, `messages` or ShareGPT `conversations`")


def _conversation(path: str | Path, doc: dict) -> Conversation | None:
    """A record as turns: each user message (with what came since the reply before it) is a
    turn; the assistant messages after it are its recorded reply (their length in words)."""
    out_tokens = doc.get("output_tokens")
    if out_tokens is not None and (not isinstance(out_tokens, int) or isinstance(out_tokens, bool)
                                   or not 1 <= out_tokens <= 1_000_000):
        raise DataFileError(f"{path} {doc['__at']}: output_tokens must be an integer in [1, 1000000]")
    turns: list[ConversationTurn] = []
    pending: list[tuple[str, str]] = []
    reply: list[str] | None = None
    for role, content in _message_list(path, doc):
        if role == "assistant" and any(r == "user" for r, _ in pending):  # the turn's reply
            turns.append(ConversationTurn(tuple(pending), None))
            pending, reply = [], content.split()
            continue
        if role == "assistant" and reply is not None:  # consecutive assistant messages: one reply
            reply.extend(content.split())
            continue
        if reply is not None:
            turns[-1] = replace(turns[-1], reply_tokens=max(1, len(reply)))
            reply = None
        pending.append((role, content))  # system, tool, or a greeting before the first user turn
    if reply is not None:
        turns[-1] = replace(turns[-1], reply_tokens=max(1, len(reply)))
    if any(r == "user" for r, _ in pending):
        turns.append(ConversationTurn(tuple(pending), None))
    if not turns:
        return None  # no user turn to send: skipped, as benchmarks do
    if out_tokens is not None:
        turns = [t if t.reply_tokens is not None else replace(t, reply_tokens=out_tokens) for t in turns]
    return Conversation(tuple(turns), str(doc["__at"]))


def read_conversations(path: str | Path) -> list[Conversation]:
    """Every conversation of a prompts file with a user turn, in file order (as live sessions
    replay them); a line with a ``prompt`` is a one-turn conversation."""
    out = [c for doc in _lines(path) if (c := _conversation(path, doc)) is not None]
    if not out:
        raise DataFileError(f"{path}: no conversation with a user turn")
    return out


@dataclass(frozen=True)
class SourceStats:
    """What a file implies for the plan's own lengths (used where the plan gives none)."""

    records: int
    mean_input_tokens: float
    mean_output_tokens: float | None


def source_stats(source: DataSource) -> SourceStats:
    if source.kind == "trace":
        rows = read_trace(source.path)
        return SourceStats(len(rows), sum(r.input_tokens for r in rows) / len(rows),
                           sum(r.output_tokens for r in rows) / len(rows))
    prompts = read_prompts(source.path)
    outs = [p.output_tokens for p in prompts if p.output_tokens is not None]
    return SourceStats(len(prompts), sum(len(p.prompt.split()) for p in prompts) / len(prompts),
                       sum(outs) / len(outs) if outs else None)


@dataclass(frozen=True, slots=True)
class TraceSession:
    """A session of a multi-turn trace: its turns in file order (the first at ``turns[0].t_s``)."""

    turns: tuple[TraceEntry, ...]


def trace_sessions(rows: list[TraceEntry]) -> list[TraceSession]:
    """A trace's sessions in the order they start: the records sharing a session id, in file
    order; a record without one is a session of one turn."""
    groups: dict[str, list[TraceEntry]] = {}
    order: list[list[TraceEntry]] = []
    for r in rows:
        if r.session is None:
            order.append([r])
        elif r.session in groups:
            groups[r.session].append(r)
        else:
            groups[r.session] = [r]
            order.append(groups[r.session])
    return [TraceSession(tuple(g)) for g in order]


@dataclass(frozen=True)
class SessionStats:
    """What a file replayed as sessions implies for the plan's own lengths and turns."""

    sessions: int
    mean_turns: float
    mean_first_tokens: float
    mean_followup_tokens: float | None  # new user tokens a later turn adds (None: no later turn)
    mean_output_tokens: float | None


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def session_stats(source: DataSource) -> SessionStats:
    """The file's sessions; refused (one line) when none has a second turn: such a file is
    replayed as requests, not sessions."""
    if source.kind == "trace":
        groups = [s.turns for s in trace_sessions(read_trace(source.path, sessions=True))]
        if all(len(g) < 2 for g in groups):
            raise DataFileError(f"{source.path}: no session_id has a second turn, so there are no sessions to "
                                "replay: remove `sessions` to replay the trace as requests")
        first = [float(g[0].input_tokens) for g in groups]
        follow = [float(max(1, b.input_tokens - a.input_tokens - a.output_tokens))
                  for g in groups for a, b in itertools.pairwise(g)]
        outs: list[float] = [float(r.output_tokens) for g in groups for r in g]
        turns = [len(g) for g in groups]
    else:
        convs = read_conversations(source.path)
        if all(len(c.turns) < 2 for c in convs):
            raise DataFileError(f"{source.path}: no conversation has a second user turn, so there are no sessions "
                                "to replay: remove `sessions` to replay its prompts as requests")
        first = [float(sum(len(c.split()) for _, c in conv.turns[0].messages)) for conv in convs]
        follow = [float(sum(len(c.split()) for _, c in t.messages)) for conv in convs for t in conv.turns[1:]]
        outs = [float(t.reply_tokens) for conv in convs for t in conv.turns if t.reply_tokens is not None]
        turns = [len(c.turns) for c in convs]
    return SessionStats(len(turns), sum(turns) / len(turns), sum(first) / len(first), _mean(follow), _mean(outs))
