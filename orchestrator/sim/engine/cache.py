"""KV memory of one worker: prefix-cache blocks (chained hashes, LRU) and private tokens.

vLLM (seed notes, "Prefix caching") keeps KV in 16-token blocks; a full block is named by a
hash chained to the block before it, so equal hashes mean equal prefixes. Blocks referenced
by a running sequence cannot be evicted; unreferenced cached blocks stay (and can be hit)
until memory is needed, then leave least recently used first.

Memory is counted in tokens: shared blocks are 16 tokens each; a sequence's private tokens
(its uncached prompt until its prefill ends, and its output) are counted exactly, plus half a
block of slack per sequence for its last, partly filled block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from orchestrator.sim.model import BLOCK_TOKENS

SLACK_TOKENS = BLOCK_TOKENS // 2


def block_hashes(words: Sequence[str]) -> tuple[int, ...]:
    """Chained hashes of the full 16-token blocks of a prompt (one token = one word)."""
    out: list[int] = []
    parent = 0
    for i in range(0, len(words) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
        parent = hash((parent, *words[i : i + BLOCK_TOKENS]))
        out.append(parent)
    return tuple(out)


def _extend_hashes(parent: int, words: Sequence[str], out: list[int]) -> int:
    """Hash the full blocks of ``words`` after ``parent`` into ``out``; returns the words used."""
    n = len(words) - len(words) % BLOCK_TOKENS
    for i in range(0, n, BLOCK_TOKENS):
        parent = hash((parent, *words[i : i + BLOCK_TOKENS]))
        out.append(parent)
    return n


class PromptHasher:
    """``block_hashes`` of prompt texts, reusing the work done for a known beginning.

    A multi-turn prompt is the previous turn's prompt plus new words, and every first turn
    starts with the shared system prompt: hashing (and splitting) only what is new makes the
    cost per request proportional to its new words, not its whole history (the virtual
    engine's hot path). The hashes are exactly ``block_hashes(text.split())``: a remembered
    text is reused only when the new text starts with it and a word boundary follows.
    """

    def __init__(self) -> None:
        # key -> (text, hashes of its full blocks, its words after the last full block)
        self._known: dict[object, tuple[str, tuple[int, ...], list[str]]] = {}

    def hashes(self, text: str, keys: Sequence[object] = (), remember: object = None,
               shared_words: int = 0) -> tuple[int, ...]:
        """Block hashes of ``text``; ``keys`` name remembered texts that may start it (tried in
        order), ``remember`` stores this text under a key, ``shared_words`` > 0 also stores its
        first words under the key "shared" (the system prompt every request starts with)."""
        base: tuple[str, tuple[int, ...], list[str]] | None = None
        for k in keys:
            known = self._known.get(k)
            if known is not None and text.startswith(known[0]) and (
                len(text) == len(known[0]) or text[len(known[0])].isspace()
            ):
                base = known
                break
        if base is None:
            words = text.split()
            if shared_words >= BLOCK_TOKENS and "shared" not in self._known:
                head = words[:shared_words]
                out: list[int] = []
                used = _extend_hashes(0, head, out)
                self._known["shared"] = (" ".join(head), tuple(out), head[used:])
            hashes = block_hashes(words)
            rest = words[len(hashes) * BLOCK_TOKENS :]
        else:
            prev_text, prev_hashes, prev_rest = base
            tail = prev_rest + text[len(prev_text) :].split()
            out = list(prev_hashes)
            used = _extend_hashes(prev_hashes[-1] if prev_hashes else 0, tail, out)
            hashes, rest = tuple(out), tail[used:]
        if remember is not None:
            self._known[remember] = (text, hashes, rest)
        return hashes

    def forget(self, key: object) -> None:
        """Drop a remembered text (a conversation that will not return)."""
        self._known.pop(key, None)


class KVMemory:
    """Token-level KV accounting with a prefix cache of hashed blocks."""

    def __init__(self, capacity_tokens: int, caching: bool = True):
        self.capacity_tokens = capacity_tokens
        self.caching = caching
        self.referenced: dict[int, int] = {}  # block hash -> running sequences using it
        self.evictable: OrderedDict[int, None] = OrderedDict()  # cached, unused, LRU first
        self.private_tokens = 0.0
        self.sequences = 0
        # vLLM's counters (prefix_cache_queries / prefix_cache_hits, in tokens)
        self.queries = 0
        self.hits = 0

    @property
    def used_tokens(self) -> float:
        """Tokens held by running sequences (shared blocks once, private exactly, plus slack)."""
        return len(self.referenced) * BLOCK_TOKENS + self.private_tokens + self.sequences * SLACK_TOKENS

    @property
    def usage(self) -> float:
        """Share of the cache in use by running sequences (vllm:kv_cache_usage_perc)."""
        return min(1.0, self.used_tokens / self.capacity_tokens) if self.capacity_tokens else 1.0

    def free_tokens(self) -> float:
        """Tokens that could be allocated now (evicting cached, unused blocks as needed)."""
        return self.capacity_tokens - self.used_tokens

    def cached_blocks(self, hashes: Sequence[int], prompt_tokens: int) -> int:
        """Leading blocks of a prompt already cached; at least one prompt token is recomputed."""
        if not self.caching:
            return 0
        limit = min(len(hashes), (prompt_tokens - 1) // BLOCK_TOKENS)
        n = 0
        ref, ev = self.referenced, self.evictable
        while n < limit and (hashes[n] in ref or hashes[n] in ev):
            n += 1
        return n

    def _evict_to_fit(self) -> None:
        over = self.used_tokens + len(self.evictable) * BLOCK_TOKENS - self.capacity_tokens
        while over > 0 and self.evictable:
            self.evictable.popitem(last=False)
            over -= BLOCK_TOKENS

    def admit(self, hashes: Sequence[int], hit_blocks: int, private_tokens: float) -> None:
        """A sequence starts: reference its cached blocks, allocate its private tokens."""
        ref, ev = self.referenced, self.evictable
        for h in hashes[:hit_blocks]:
            if h in ev:
                del ev[h]
            ref[h] = ref.get(h, 0) + 1
        self.private_tokens += private_tokens
        self.sequences += 1
        self._evict_to_fit()

    def grow(self, tokens: float) -> None:
        """Running sequences wrote ``tokens`` more private tokens."""
        self.private_tokens += tokens
        self._evict_to_fit()

    def publish(self, hashes: Sequence[int], from_block: int) -> int:
        """A prefill ended: its full prompt blocks beyond the hits become cached, shared blocks.

        Returns how many private tokens became shared (the caller's sequence stops owning them).
        """
        if not self.caching:
            return 0
        ref, ev = self.referenced, self.evictable
        moved = 0
        for h in hashes[from_block:]:
            if h in ev:
                del ev[h]
            ref[h] = ref.get(h, 0) + 1
            moved += BLOCK_TOKENS
        self.private_tokens -= moved
        return moved

    def release(self, hashes: Iterable[int], private_tokens: float) -> None:
        """A sequence ended or was preempted: unreference its blocks (they stay cached, LRU)."""
        ref, ev = self.referenced, self.evictable
        for h in hashes:
            n = ref.get(h, 0) - 1
            if n > 0:
                ref[h] = n
            elif n == 0:
                del ref[h]
                ev[h] = None
        self.private_tokens = max(0.0, self.private_tokens - private_tokens)
        self.sequences -= 1
        self._evict_to_fit()
