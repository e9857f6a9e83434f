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

from collections import deque
from collections.abc import Sequence
from itertools import compress

from orchestrator.sim.engine.chains import SHIFT, Blocks, ContentIds
from orchestrator.sim.model import BLOCK_TOKENS

SLACK_TOKENS = BLOCK_TOKENS // 2


def block_hashes(words: Sequence[str]) -> tuple[int, ...]:
    """Chained hashes of the full 16-token blocks of a prompt (one token = one word)."""
    out: list[int] = []
    _extend_hashes(0, words, out)
    return tuple(out)


def _extend_hashes(parent: int, words: Sequence[str], out: list[int]) -> int:
    """Hash the full blocks of ``words`` after ``parent`` into ``out``; returns the words used."""
    append = out.append
    # zip over one iterator yields the full 16-word blocks as tuples, in C (the hot path)
    for block in zip(*[iter(words)] * BLOCK_TOKENS, strict=False):
        parent = hash((parent, block))
        append(parent)
    return len(words) - len(words) % BLOCK_TOKENS


class PromptHasher:
    """Block ids (``chains.Blocks``) of the prompts of one virtual run, at a cost that does not
    grow with the prompt (the virtual engine's hot path: ~125 blocks per 2,000-token prompt).

    Blocks inside the shared prefix are hashed by content, once per run. Past it, every prompt of
    the workload starts with its conversation's unique nonce (orchestrator.loadgen.workloads), so
    the first block past the prefix names the conversation and the blocks after it are named by
    position: block k of that conversation. That is exact whenever texts sharing that first
    block extend one another, as a conversation's turns do; this is checked (a prefix comparison
    with the longest such text seen), and a text that fails it is hashed by content instead, so
    an unusual input can only miss hits, never make false ones.

    Content hashes become ids through ``chains.ContentIds`` and the blocks named by position are
    one chain per conversation, so a prompt is a few runs and equal ids mean equal hashes.
    """

    def __init__(self) -> None:
        self._head: tuple[str, tuple[int, ...], Blocks] | None = None  # shared prefix's full blocks
        self._head_words = -1
        self._longest: dict[int, str] = {}  # conversation block hash -> longest text seen
        self._ids = ContentIds()
        # conversation block hash -> (runs before its chain, the chain, blocks before it)
        self._conv: dict[int, tuple[tuple[tuple[int, int], ...], int, int]] = {}

    def hashes(self, text: str, prompt_tokens: int, shared_words: int = 0) -> Blocks:
        """Block ids of ``text`` (``prompt_tokens`` words) whose first ``shared_words`` words
        are the run's shared prefix."""
        n_blocks = prompt_tokens // BLOCK_TOKENS
        head = self._head_of(text, shared_words)
        if head is None:
            return self._by_content(text)
        head_text, head_hashes, head_ids = head
        b0 = len(head_hashes)
        if n_blocks <= b0:
            return head_ids.prefix(n_blocks)
        if b0 and not (text.startswith(head_text) and text[len(head_text)].isspace()):
            return self._by_content(text)
        start = len(head_text)
        # The first block's words: a window of the text is enough when it holds more than 16
        # words (the 17th may be cut); splitting the whole text costs as much as the rest here.
        rest = text[start : start + 1024].split(maxsplit=BLOCK_TOKENS)
        if len(rest) <= BLOCK_TOKENS:
            rest = text[start:].split(maxsplit=BLOCK_TOKENS)
        first = hash((head_hashes[-1] if b0 else 0, tuple(rest[:BLOCK_TOKENS])))
        known = self._longest.get(first)
        if known is None or (len(text) >= len(known) and text.startswith(known)):
            self._longest[first] = text
        elif not known.startswith(text):
            return self._by_content(text)  # same first block, different story: by content
        conv = self._conv.get(first)
        if conv is None:
            conv = self._conv[first] = self._conversation(first, head_ids)
        runs, chain, before = conv
        if n_blocks == before:
            return Blocks(runs, n_blocks)
        return Blocks((*runs, (chain, n_blocks - before)), n_blocks)

    def _conversation(self, first: int, head_ids: Blocks) -> tuple[tuple[tuple[int, int], ...], int, int]:
        """(runs before the conversation's chain, that chain, blocks before it)."""
        ids = self._ids
        fid = ids.known(first)
        if fid is None:  # the usual case: the chain starts with the conversation's first block
            chain = ids.new_chain()
            ids.register(first, chain << SHIFT)
            return head_ids.runs, chain, head_ids.n
        # seen before by content (an unusual input): it keeps its id, the positions follow it
        runs = list(head_ids.runs)
        parent = (runs[-1][0] << SHIFT) + runs[-1][1] - 1 if runs else None
        if parent is not None and fid == parent + 1:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((fid >> SHIFT, 1))
        return tuple(runs), ids.new_chain(), head_ids.n + 1

    def _by_content(self, text: str) -> Blocks:
        return Blocks(tuple(self._ids.blocks(block_hashes(text.split()))))

    def _head_of(self, text: str, shared_words: int) -> tuple[str, tuple[int, ...], Blocks] | None:
        if shared_words != self._head_words:
            words = text.split(maxsplit=shared_words)[:shared_words] if shared_words else []
            if len(words) < shared_words:
                return None
            full = len(words) - len(words) % BLOCK_TOKENS
            hashes = block_hashes(words[:full])
            self._head = (" ".join(words[:full]), hashes, Blocks(tuple(self._ids.blocks(hashes))))
            self._head_words = shared_words
        return self._head


class KVMemory:
    """Token-level KV accounting with a prefix cache of hashed blocks."""

    def __init__(self, capacity_tokens: int, caching: bool = True):
        self.capacity_tokens = capacity_tokens
        self.caching = caching
        self.referenced: dict[int, int] = {}  # block hash -> running sequences using it
        # Cached, unused blocks: hash -> the release that freed it. The queue holds each release
        # (its stamp and blocks, head to tail), oldest first; a block reused since it was freed
        # leaves a stale entry behind, skipped at eviction.
        self.evictable: dict[int, int] = {}
        self._lru: deque[tuple[int, list[int]]] = deque()
        self._releases = 0
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
        if over <= 0:
            return
        ev, lru = self.evictable, self._lru
        while over > 0 and ev:
            stamp, blocks = lru[0]
            while blocks and over > 0:
                h = blocks.pop()  # the chain's tail first, as vLLM frees blocks
                if ev.get(h) == stamp:
                    del ev[h]
                    over -= BLOCK_TOKENS
            if not blocks:
                lru.popleft()

    def _reference(self, hashes: Sequence[int]) -> None:
        """Add one reference to each block (distinct hashes: a chain never repeats one)."""
        if not hashes:
            return
        ref, ev = self.referenced, self.evictable
        # Bulk dict and set operations run in C; only blocks already in use or cached (shared
        # prefixes, typically few per request) need a step of their own.
        if ref.keys().isdisjoint(hashes):
            fresh = hashes
        else:
            held = ref.keys() & hashes
            for h in held:
                ref[h] += 1
            fresh = [h for h in hashes if h not in held]
        if ev and not ev.keys().isdisjoint(fresh):
            for h in ev.keys() & fresh:
                del ev[h]  # its queue entry turns stale
        ref.update(dict.fromkeys(fresh, 1))

    def admit(self, hashes: Sequence[int], hit_blocks: int, private_tokens: float) -> None:
        """A sequence starts: reference its cached blocks, allocate its private tokens."""
        self._reference(hashes[:hit_blocks])
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
        new = hashes[from_block:]
        self._reference(new)
        moved = len(new) * BLOCK_TOKENS
        self.private_tokens -= moved
        return moved

    def release(self, hashes: Sequence[int], private_tokens: float) -> None:
        """A sequence ended or was preempted: unreference its blocks (they stay cached, LRU)."""
        ref, ev = self.referenced, self.evictable
        counts = list(map(ref.__getitem__, hashes))
        # blocks this sequence held the only reference to (C-level filtering: the hot path)
        last = list(compress(hashes, map((1).__eq__, counts)))
        if len(last) < len(counts):
            for h, n in zip(hashes, counts, strict=True):
                if n > 1:
                    ref[h] = n - 1
        if last:
            deque(map(ref.__delitem__, last), maxlen=0)
            # now cached and unused, the newest release in the LRU order
            self._releases += 1
            stamp = self._releases
            ev.update(dict.fromkeys(last, stamp))
            self._lru.append((stamp, last))
        self.private_tokens = max(0.0, self.private_tokens - private_tokens)
        self.sequences -= 1
        self._evict_to_fit()
