"""Requests from a workload's own data (pure): a prompts file or a replayed trace.

Prompts file: a point takes the file's prompts in an order drawn from its seed, cycling if it
needs more. Each prompt gets a 5-word nonce right after the part it shares with other lines of
the file (completion prompts: the longest beginning it has in common with another line; chat:
every message before the last), so the sharing the file has is kept and nothing else repeats:
not when a point cycles the file, nor when later points of a run send the same lines to a server
whose cache still holds them (the repeat guard and the prefix cache stay honest).

Trace: the trace's own arrival pattern, time-scaled so its mean rate is the point's rate
(cycled if the point is longer than the scaled trace); each request's prompt is built from its
hash ids: a hash id is a block of ``block_tokens`` words drawn from (seed, copy, id), so requests
that share an id in the file share that block, and nothing else is shared; the last 5 words are
a nonce. Tokens are words (as everywhere in the load generator: a stated approximation).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from functools import lru_cache

import numpy as np

from orchestrator.loadgen.schedules import derive_seed, open_loop_offsets
from orchestrator.loadgen.workloads import (
    BLOCK_TOKENS,
    NONCE_WORDS,
    RequestSpec,
    _encode,
    _hash,
    _words,
    iter_requests,
)
from orchestrator.plan.sources import (
    DataFileError,
    DataSource,
    PromptEntry,
    TraceEntry,
    file_sha256,
    read_prompts,
    read_trace,
)
from orchestrator.plan.workload import Workload


@lru_cache(maxsize=8)
def _prompts(path: str, sha256: str) -> tuple[PromptEntry, ...]:
    return tuple(read_prompts(path))


@lru_cache(maxsize=8)
def _trace(path: str, sha256: str) -> tuple[TraceEntry, ...]:
    return tuple(read_trace(path))


def verified(source: DataSource) -> str:
    """The file's sha256, checked against the registered one: a run never measures data other
    than the data its plan was registered with."""
    now = file_sha256(source.path)
    if source.sha256 is not None and now != source.sha256:
        raise DataFileError(f"{source.path} changed since the plan was registered (sha256 {now[:12]}, "
                            f"registered {source.sha256[:12]}): restore the file, or register the "
                            "plan again (a changed file is a different plan)")
    return now


def _nonce(i: int, seed: int) -> list[str]:
    return _encode(i, 3) + _encode(derive_seed(seed, "data-nonce"), 2)


@lru_cache(maxsize=8)
def _shared_words(path: str, sha256: str) -> tuple[int, ...]:
    """Per completion prompt of the file: words at its start it shares with another line."""
    entries = _prompts(path, sha256)
    words = [tuple(e.prompt.split()) for e in entries]
    order = sorted(range(len(words)), key=lambda k: words[k])  # neighbours share the most
    out = [0] * len(words)
    for a, b in itertools.pairwise(order):
        x, y = words[a], words[b]
        n = 0
        while n < min(len(x), len(y)) and x[n] == y[n]:
            n += 1
        out[a], out[b] = max(out[a], n), max(out[b], n)
    return tuple(out)


def _from_prompt(entry: PromptEntry, shared: int, i: int, seed: int, workload: Workload) -> RequestSpec:
    nonce = " ".join(_nonce(i, seed))
    max_tokens = entry.output_tokens or workload.output_tokens
    if entry.messages:
        msgs = list(entry.messages)
        role, content = msgs[-1]
        msgs[-1] = (role, f"{nonce} {content}")
        prompt = " ".join(c for _, c in msgs)
        messages: tuple[tuple[str, str], ...] = tuple(msgs)
    else:
        head = entry.prompt.split()
        prompt, messages = " ".join([*head[:shared], nonce, *head[shared:]]), ()
    words = prompt.split()
    return RequestSpec(request_id=i, conversation_id=i, turn=0, prompt=" ".join(words),
                       prompt_tokens=len(words), shared_prefix_tokens=0, max_tokens=max_tokens,
                       prompt_hash=_hash(words), messages=messages)


def _iter_prompts(workload: Workload, seed: int) -> Iterator[RequestSpec]:
    src = workload.source
    assert src is not None
    sha = verified(src)
    entries, shared = _prompts(src.path, sha), _shared_words(src.path, sha)
    for i in itertools.count():
        cycle, k = divmod(i, len(entries))
        order = np.random.default_rng(derive_seed(seed, "data-order", cycle)).permutation(len(entries))
        j = int(order[k])
        yield _from_prompt(entries[j], shared[j], i, seed, workload)


def requests_iter(workload: Workload, seed: int) -> Iterator[RequestSpec]:
    """The point's requests without end (a closed loop's source): synthetic or from the file."""
    if workload.source is None:
        return iter_requests(workload, seed)
    if workload.source.kind == "trace":
        raise ValueError("a trace is replayed on its own clock, not taken by closed-loop users")
    return _iter_prompts(workload, seed)


def trace_offsets(trace: Sequence[TraceEntry], rate: float, duration_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(send offsets, row of the trace, copy number) of a point: the trace's arrivals scaled so
    its mean rate is ``rate``, repeated back to back until ``duration_s``."""
    return scaled_times(np.array([r.t_s for r in trace], dtype=np.float64), rate, duration_s)


def scaled_times(t: np.ndarray, rate: float, duration_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets, index into ``t``, copy number): sorted times ``t`` (s, from 0) scaled so their
    mean rate is ``rate``, repeated back to back until ``duration_s``."""
    if rate <= 0 or duration_s <= 0:
        raise ValueError("rate and duration_s must be > 0")
    n = len(t)
    span = float(t[-1] - t[0])
    natural = (n - 1) / span if n > 1 and span > 0 else rate
    scale = natural / rate
    # One copy lasts its span plus one mean gap, so copies join at the trace's own pace.
    period = (span + (span / (n - 1) if n > 1 and span > 0 else 1.0 / natural)) * scale
    copies = int(np.ceil(duration_s / period)) if period > 0 else 1
    offs = np.concatenate([(t - t[0]) * scale + c * period for c in range(copies)])
    rows = np.tile(np.arange(n), copies)
    copy = np.repeat(np.arange(copies), n)
    keep = offs < duration_s
    return offs[keep], rows[keep], copy[keep]


def _block(seed: int, copy: int, hash_id: int, size: int) -> list[str]:
    return _words(np.random.default_rng(derive_seed(seed, "trace-block", copy, hash_id)), size)


def trace_request(entry: TraceEntry, i: int, copy: int, seed: int, block_tokens: int,
                  workload: Workload) -> RequestSpec:
    """Request ``i`` of a point from a trace row: its shared blocks, then its own words, then a
    nonce, ``input_tokens`` words in all (at least the nonce)."""
    body = max(0, entry.input_tokens - NONCE_WORDS)
    words: list[str] = []
    for h in entry.hash_ids:
        if len(words) >= body:
            break
        words.extend(_block(seed, copy, h, block_tokens))
    words = words[:body]
    if len(words) < body:  # more tokens than its blocks: the rest is its own
        rng = np.random.default_rng(derive_seed(seed, "trace-own", i))
        words.extend(_words(rng, body - len(words)))
    words.extend(_nonce(i, seed))
    prompt = " ".join(words)
    chat = workload.api == "chat"
    return RequestSpec(request_id=i, conversation_id=i, turn=0, prompt=prompt, prompt_tokens=len(words),
                       shared_prefix_tokens=0, max_tokens=entry.output_tokens, prompt_hash=_hash(words),
                       messages=(("user", prompt),) if chat else ())


def point_load(workload: Workload, rate: float, duration_s: float, seed: int) -> tuple[np.ndarray, list[RequestSpec]]:
    """An open-loop point's send offsets and requests: synthetic, a prompts file's, or a trace's."""
    src = workload.source
    if src is not None and src.kind == "trace":
        trace = _trace(src.path, verified(src))
        offs, rows, copies = trace_offsets(trace, rate, duration_s)
        reqs = [trace_request(trace[int(r)], i, int(c), seed, src.block_tokens, workload)
                for i, (r, c) in enumerate(zip(rows, copies, strict=True))]
        return offs, reqs
    assert workload.arrival is not None  # open loop (the executor routes closed loops elsewhere)
    offs = open_loop_offsets(workload.arrival, rate, duration_s, seed)
    return offs, list(itertools.islice(requests_iter(workload, seed), len(offs)))


def content_prefix_hit_rate(requests: Sequence[RequestSpec], seen: set[int] | None = None) -> float:
    """Upper bound on the prefix-cache hit rate from the prompts' content alone: one unbounded
    cache that sees every request, whole 16-word blocks chained from the start (as vLLM hashes
    them), at least the last token computed. For data whose sharing the file decides. ``seen``:
    the blocks the server was sent before (earlier points of the run), updated in place."""
    seen = set() if seen is None else seen
    hit = total = 0
    for r in requests:
        words = r.prompt.split()
        parent, blocks = 0, 0
        usable = (max(0, len(words) - 1) // BLOCK_TOKENS)
        matched = True
        for b in range(len(words) // BLOCK_TOKENS):
            parent = hash((parent, tuple(words[b * BLOCK_TOKENS:(b + 1) * BLOCK_TOKENS])))
            if matched and parent in seen and b < usable:
                blocks += 1
            else:
                matched = False
            seen.add(parent)
        hit += blocks * BLOCK_TOKENS
        total += len(words)
    return hit / total if total else 0.0
