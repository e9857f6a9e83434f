"""Routers over simulated workers, after vllm-router's policies (pure).

- round_robin: next worker in turn.
- cache_aware: vllm-router's (SGLang's) approximate tree of what each worker was sent. If the
  load is imbalanced (max - min > balance_abs_threshold and max > 1.5 x min, the router's
  default relative threshold) the least loaded worker gets it; else, if the best prefix match
  covers more than cache_threshold of the prompt, the worker with that match; else the worker
  whose tree is smallest (most room). The tree is kept as chained block hashes per worker.
- power_of_two: two workers drawn at random, the less loaded one.
- least_loaded: fewest outstanding requests (the dry run's "least loaded" policy).
- consistent_hash: a conversation always goes to the same worker (hash ring of workers).
- random: uniform.
Load = requests the router sent to a worker that have not returned.
"""

from __future__ import annotations

import random as _random
from collections.abc import Sequence

from orchestrator.sim.engine.chains import Blocks

# vllm-router's default --balance-rel-threshold.
BALANCE_REL_THRESHOLD = 1.5


class Router:
    """Picks a worker index for each request; told when a request returns."""

    def __init__(
        self,
        policy: str,
        n_workers: int,
        *,
        cache_threshold: float = 0.5,
        balance_abs_threshold: int = 32,
        seed: int = 0,
    ):
        self.policy = policy
        self.n = n_workers
        self.cache_threshold = cache_threshold
        self.balance_abs = balance_abs_threshold
        self.rng = _random.Random(seed)
        self.loads = [0] * n_workers
        self.trees: list[set[int]] = [set() for _ in range(n_workers)]
        # For Blocks, a tree holds each chain's first ``extent`` blocks (every prompt holds a
        # prefix of each of its chains): the same set, kept in a few numbers.
        self.extents: list[dict[int, int]] = [{} for _ in range(n_workers)]
        self.sizes = [0] * n_workers
        self._next = 0

    def pick(self, hashes: Sequence[int], prompt_tokens: int, conversation_id: int = 0) -> int:
        """Choose a worker for a request with these prompt block hashes; counts it as load."""
        i = self._choose(hashes, prompt_tokens, conversation_id)
        self.loads[i] += 1
        return i

    @property
    def oblivious(self) -> bool:
        """True when picks depend on nothing the run does (loads, trees): only on the order
        of the requests and their conversations, so they can be made beforehand."""
        return self.n == 1 or self.policy in ("round_robin", "random", "consistent_hash")

    def choose_ahead(self, conversation_id: int = 0) -> int:
        """An oblivious router's next pick, made beforehand (``count`` it when it is sent)."""
        return self._choose((), 0, conversation_id)

    def count(self, i: int) -> None:
        """A request picked beforehand (``choose_ahead``) is sent to worker ``i``."""
        self.loads[i] += 1

    def done(self, i: int) -> None:
        """A request sent to worker ``i`` returned."""
        self.loads[i] -= 1

    def _least(self) -> int:
        m = min(self.loads)
        return self.loads.index(m)

    def _choose(self, hashes: Sequence[int], prompt_tokens: int, conversation_id: int) -> int:
        p = self.policy
        if self.n == 1:
            return 0
        if p == "round_robin":
            i = self._next
            self._next = (i + 1) % self.n
            return i
        if p == "random":
            return self.rng.randrange(self.n)
        if p == "power_of_two":
            a, b = self.rng.sample(range(self.n), 2)
            return a if self.loads[a] <= self.loads[b] else b
        if p in ("least_loaded", "least_load"):
            return self._least()
        if p == "consistent_hash":
            return _mix(conversation_id) % self.n
        if p == "cache_aware":
            return self._cache_aware(hashes, prompt_tokens)
        raise ValueError(f"unknown router policy {p!r}")

    def _cache_aware(self, hashes: Sequence[int], prompt_tokens: int) -> int:
        hi, lo = max(self.loads), min(self.loads)
        if hi - lo > self.balance_abs and hi > BALANCE_REL_THRESHOLD * lo:
            i = self._least()
        else:
            best, best_n = 0, -1
            for w in range(self.n):
                n = self._matched(w, hashes)
                if n > best_n or (n == best_n and self.loads[w] < self.loads[best]):
                    best, best_n = w, n
            rate = best_n * 16 / max(prompt_tokens, 1)
            if rate > self.cache_threshold:
                i = best
            else:
                i = self.sizes.index(min(self.sizes))
        self._insert(i, hashes)
        return i

    def _matched(self, w: int, hashes: Sequence[int]) -> int:
        """Leading blocks of the prompt in worker ``w``'s tree."""
        n = 0
        if isinstance(hashes, Blocks):
            ext = self.extents[w]
            for chain, length in hashes.runs:
                e = ext.get(chain, 0)
                if e < length:
                    return n + e
                n += length
            return n
        tree = self.trees[w]
        while n < len(hashes) and hashes[n] in tree:
            n += 1
        return n

    def _insert(self, w: int, hashes: Sequence[int]) -> None:
        if isinstance(hashes, Blocks):
            ext = self.extents[w]
            for chain, length in hashes.runs:
                e = ext.get(chain, 0)
                if length > e:
                    ext[chain] = length
                    self.sizes[w] += length - e
            return
        tree = self.trees[w]
        before = len(tree)
        tree.update(hashes)
        self.sizes[w] += len(tree) - before


def _mix(x: int) -> int:
    # SplitMix64 finaliser: spreads consecutive conversation ids over the ring.
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)
