"""Prefix-cache blocks as runs of chains: the virtual engine's KV memory at O(chains) a request.

A prompt's blocks are named by ids ``chain << 32 | position``. ``PromptHasher`` (cache.py) hands
out the ids so that a prompt's blocks are a few runs, each the first ``length`` positions of a
chain (a new chain starts where a text leaves every text seen before), so two prompts share a
block exactly when the old chained hashes were equal. Every holder of a chain then holds a prefix
of it, which makes a chain's state a few numbers (``ChainMemory``) instead of one dict entry per
block: the per-block ``KVMemory`` spends most of a virtual run on those entries.

``ChainMemory`` keeps ``KVMemory``'s behaviour block for block (a differential test checks it):
per chain, blocks ``[0, held)`` are referenced, ``[held, present)`` are cached and unused, split
into segments by the release that freed them (newer ones lower down, so a chain is always
evicted from its top, as KVMemory evicts each release tail first, oldest release first).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator, Sequence
from typing import cast, overload

from orchestrator.sim.model import BLOCK_TOKENS

SHIFT = 32
SLACK_TOKENS = BLOCK_TOKENS // 2


class Blocks(Sequence[int]):
    """Block ids of a prompt as runs ``(chain, length)``: positions ``0..length-1`` of each."""

    __slots__ = ("n", "runs")

    def __init__(self, runs: tuple[tuple[int, int], ...], n: int | None = None):
        self.runs = runs
        self.n = sum(r[1] for r in runs) if n is None else n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        for chain, length in self.runs:
            base = chain << SHIFT
            yield from range(base, base + length)

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[int]: ...
    def __getitem__(self, i: int | slice) -> int | Sequence[int]:
        if isinstance(i, slice):
            start, stop, step = i.indices(self.n)
            if start == 0 and step == 1:
                return self.prefix(stop)
            return tuple(self)[i]
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(i)
        for chain, length in self.runs:
            if i < length:
                return (chain << SHIFT) + i
            i -= length
        raise IndexError(i)  # pragma: no cover - n is the sum of the lengths

    def prefix(self, k: int) -> Blocks:
        """The first ``k`` blocks."""
        if k >= self.n:
            return self
        out: list[tuple[int, int]] = []
        left = k
        for chain, length in self.runs:
            if left <= 0:
                break
            out.append((chain, min(length, left)))
            left -= length
        return Blocks(tuple(out), max(k, 0))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Blocks):
            return self.runs == other.runs
        if isinstance(other, tuple):
            return tuple(self) == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.runs)

    def __repr__(self) -> str:
        return f"Blocks({self.runs!r})"


class ContentIds:
    """Ids for content-chained block hashes (a block's hash covers its parent): a block seen
    before keeps its id; a new one extends its parent's chain when the parent is that chain's
    last block, else starts a chain. So a text's ids are runs from position 0 of each chain."""

    def __init__(self) -> None:
        self._ids: dict[int, int] = {}
        self._tail: dict[int, int] = {}  # content chain -> next free position
        self._chains = 0

    def new_chain(self) -> int:
        """A fresh chain number (for chains named by position, which content never extends)."""
        self._chains += 1
        return self._chains

    def id_of(self, content_hash: int, parent: int | None) -> int:
        """The id of a block with this hash whose parent block has id ``parent``."""
        got = self._ids.get(content_hash)
        if got is not None:
            return got
        if parent is not None:
            chain, pos = parent >> SHIFT, parent & ((1 << SHIFT) - 1)
            if self._tail.get(chain) == pos + 1:
                self._tail[chain] = pos + 2
                got = self._ids[content_hash] = parent + 1
                return got
        chain = self.new_chain()
        self._tail[chain] = 1
        got = self._ids[content_hash] = chain << SHIFT
        return got

    def register(self, content_hash: int, block_id: int) -> None:
        """Name a content hash by an id given elsewhere (a positional chain's first block)."""
        self._ids[content_hash] = block_id

    def known(self, content_hash: int) -> int | None:
        """The id of a block hash seen before."""
        return self._ids.get(content_hash)

    def blocks(self, hashes: Sequence[int], parent: int | None = None) -> list[tuple[int, int]]:
        """Runs of the ids of a chain of content hashes (after the block ``parent``)."""
        runs: list[tuple[int, int]] = []
        prev = parent
        for h in hashes:
            bid = self.id_of(h, prev)
            chain = bid >> SHIFT
            if runs and prev is not None and bid == prev + 1:
                runs[-1] = (chain, runs[-1][1] + 1)
            elif bid & ((1 << SHIFT) - 1):
                raise ValueError("a block hash seen with two parents (a hash collision)")
            else:
                runs.append((chain, 1))
            prev = bid
        return runs


class _Seg:
    """Cached, unused blocks ``[lo, hi)`` of one chain, freed by one release."""

    __slots__ = ("chain", "hi", "lo")

    def __init__(self, chain: _Chain, lo: int, hi: int):
        self.chain, self.lo, self.hi = chain, lo, hi


class _Chain:
    __slots__ = ("held", "holders", "key", "present", "segs")

    def __init__(self, key: int):
        self.key = key
        self.holders: dict[int, int] = {}  # prefix length -> running sequences holding it
        self.held = 0  # blocks [0, held) are referenced
        self.present = 0  # blocks [0, present) exist (referenced or cached)
        self.segs: list[_Seg] = []  # tile [held, present), oldest (top) first


class ChainMemory:
    """``KVMemory`` for ``Blocks``: the same accounting, at a cost per chain, not per block."""

    def __init__(self, capacity_tokens: int, caching: bool = True):
        self.capacity_tokens = capacity_tokens
        self.caching = caching
        self._chains: dict[int, _Chain] = {}
        self._lru: deque[list[_Seg]] = deque()  # releases, oldest first; each in block order
        self._owed = 0  # blocks evicted but not yet taken off their chains (_settle)
        self.n_referenced = 0  # distinct referenced blocks
        self.n_evictable = 0  # cached, unused blocks
        self.private_tokens = 0.0
        self.sequences = 0
        self.queries = 0
        self.hits = 0

    @property
    def used_tokens(self) -> float:
        """Tokens held by running sequences (shared blocks once, private exactly, plus slack)."""
        return self.n_referenced * BLOCK_TOKENS + self.private_tokens + self.sequences * SLACK_TOKENS

    @property
    def usage(self) -> float:
        """Share of the cache in use by running sequences (vllm:kv_cache_usage_perc)."""
        return min(1.0, self.used_tokens / self.capacity_tokens) if self.capacity_tokens else 1.0

    def free_tokens(self) -> float:
        """Tokens that could be allocated now (evicting cached, unused blocks as needed)."""
        # used_tokens spelled out: asked every step
        return self.capacity_tokens - (self.n_referenced * BLOCK_TOKENS + self.private_tokens
                                       + self.sequences * SLACK_TOKENS)

    def cached_blocks(self, hashes: Sequence[int], prompt_tokens: int) -> int:
        """Leading blocks of a prompt already cached; at least one prompt token is recomputed."""
        if not self.caching:
            return 0
        hashes = cast(Blocks, hashes)  # ChainMemory holds Blocks only (Worker's chain_blocks)
        if self._owed:
            self._settle()
        limit = min(hashes.n, (prompt_tokens - 1) // BLOCK_TOKENS)
        n = 0
        chains = self._chains
        for key, length in hashes.runs:
            if n >= limit:
                break
            c = chains.get(key)
            p = c.present if c is not None else 0
            if p < length:
                n += p
                break
            n += length
        return min(n, limit)

    # --- holders ----------------------------------------------------------------------
    def _hold(self, key: int, k: int) -> None:
        """One more sequence holds blocks [0, k) of chain ``key``."""
        c = self._chains.get(key)
        if c is None:
            c = self._chains[key] = _Chain(key)
        c.holders[k] = c.holders.get(k, 0) + 1
        held = c.held
        if k <= held:
            return
        # [held, k) turn referenced: cached ones leave the unused segments (bottom first), the
        # rest are new blocks
        segs = c.segs
        while segs and segs[-1].lo < k:
            s = segs[-1]
            if s.hi <= k:
                s.lo = s.hi  # its release's entry turns stale
                segs.pop()
            else:
                s.lo = k
                break
        self.n_evictable -= min(k, c.present) - held if c.present > held else 0
        self.n_referenced += k - held
        c.held = k
        if k > c.present:
            c.present = k

    def _unhold(self, key: int, k: int, freed: list[_Seg]) -> None:
        """A sequence stops holding blocks [0, k) of chain ``key``; what no one holds now is
        cached, unused: a new segment at the chain's bottom (the newest release)."""
        c = self._chains[key]
        left = c.holders[k] - 1
        if left:
            c.holders[k] = left
            return
        del c.holders[k]
        if k < c.held:
            return
        rest = max(c.holders) if c.holders else 0
        c.held = rest
        self.n_referenced -= k - rest
        self.n_evictable += k - rest
        s = _Seg(c, rest, k)
        c.segs.append(s)
        freed.append(s)

    def _hold_prefix(self, hashes: Blocks, start: int, stop: int) -> None:
        """Hold blocks [start, stop) of ``hashes`` on top of [0, start) already held."""
        if self._owed:
            self._settle()
        off = 0
        for key, length in hashes.runs:
            if off >= stop:
                break
            end = off + length
            if end > start:
                had = start - off if start > off else 0
                now = stop - off if stop < end else length
                if had:
                    self._move(key, had, now)
                else:
                    self._hold(key, now)
            off = end

    def _move(self, key: int, had: int, now: int) -> None:
        # a holder of [0, had) now holds [0, now): its blocks stay referenced throughout
        c = self._chains[key]
        left = c.holders[had] - 1
        if left:
            c.holders[had] = left
        else:
            del c.holders[had]
        self._hold(key, now)  # counted again under its new length (held never drops: now > had)

    # --- the KVMemory interface -------------------------------------------------------
    def _evict_to_fit(self) -> None:
        # KVMemory's sum, term for term (used_tokens + evictable - capacity): same rounding
        over = self.n_referenced * BLOCK_TOKENS + self.private_tokens + self.sequences * SLACK_TOKENS \
            + self.n_evictable * BLOCK_TOKENS - self.capacity_tokens
        if over > 0:
            # KVMemory frees one block at a time until over <= 0 (exact: multiples of 16 below
            # 2^52). Which blocks leave is settled when the cache is next looked at: evictions
            # take the oldest releases first, so a batch of them takes the same blocks.
            need = min(math.ceil(over / BLOCK_TOKENS), self.n_evictable)
            self.n_evictable -= need
            self._owed += need

    def _settle(self) -> None:
        """Carry out the evictions owed, oldest release first, each release tail first."""
        need, self._owed = self._owed, 0
        lru, chains = self._lru, self._chains
        while need:
            entry = lru[0]
            while entry and need:
                s = entry[-1]
                avail = s.hi - s.lo
                if avail > need:
                    s.hi -= need
                    s.chain.present = s.hi
                    need = 0
                    break
                need -= avail
                entry.pop()
                if avail:
                    c = s.chain
                    c.segs.pop(0)  # it was the chain's oldest: its top
                    c.present = s.lo
                    s.hi = s.lo
                    if not c.present and not c.holders:
                        del chains[c.key]
            if not entry:
                lru.popleft()

    def admit(self, hashes: Sequence[int], hit_blocks: int, private_tokens: float) -> None:
        """A sequence starts: reference its cached blocks, allocate its private tokens."""
        if hit_blocks:
            self._hold_prefix(cast(Blocks, hashes), 0, hit_blocks)
        self.private_tokens += private_tokens
        self.sequences += 1
        self._evict_to_fit()

    def grow(self, tokens: float) -> None:
        """Running sequences wrote ``tokens`` more private tokens."""
        self.private_tokens += tokens
        # _evict_to_fit inline (every step; a full cache evicts at most of them); the evictions
        # themselves wait for _settle
        over = self.n_referenced * BLOCK_TOKENS + self.private_tokens + self.sequences * SLACK_TOKENS \
            + self.n_evictable * BLOCK_TOKENS - self.capacity_tokens
        if over > 0:
            need = min(math.ceil(over / BLOCK_TOKENS), self.n_evictable)
            self.n_evictable -= need
            self._owed += need

    def publish(self, hashes: Sequence[int], from_block: int) -> int:
        """A prefill ended: its full prompt blocks beyond the hits become cached, shared blocks.

        Returns how many private tokens became shared (the caller's sequence stops owning them).
        """
        if not self.caching:
            return 0
        hashes = cast(Blocks, hashes)
        n = hashes.n - from_block
        if n <= 0:
            return 0
        self._hold_prefix(hashes, from_block, hashes.n)
        moved = n * BLOCK_TOKENS
        self.private_tokens -= moved
        return moved

    def release(self, hashes: Sequence[int], private_tokens: float) -> None:
        """A sequence ended or was preempted: unreference its blocks (they stay cached, LRU)."""
        hashes = cast(Blocks, hashes)
        if hashes.n:
            freed: list[_Seg] = []
            for key, length in hashes.runs:
                self._unhold(key, length, freed)
            if freed:
                self._lru.append(freed)
        self.private_tokens = max(0.0, self.private_tokens - private_tokens)
        self.sequences -= 1
        self._evict_to_fit()
