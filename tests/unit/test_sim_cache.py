"""The virtual engine's KV memory: block hashes by position past the shared prefix equal the
content's sharing exactly, and eviction frees unused blocks least recently used, tail first."""

from __future__ import annotations

from orchestrator.loadgen.workloads import RequestSpec, build_requests
from orchestrator.plan import Workload
from orchestrator.sim.engine.cache import BLOCK_TOKENS, KVMemory, PromptHasher, block_hashes


def _common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _check_sharing(requests: list[RequestSpec]) -> int:
    """Every pair shares as many leading hashes as it shares full leading blocks of content."""
    hasher = PromptHasher()
    fast = [hasher.hashes(r.prompt, r.prompt_tokens, r.shared_prefix_tokens) for r in requests]
    exact = [block_hashes(r.prompt.split()) for r in requests]
    shared_pairs = 0
    for i in range(len(requests)):
        assert len(fast[i]) == len(exact[i]) == requests[i].prompt_tokens // BLOCK_TOKENS
        for j in range(i):
            n = _common(exact[i], exact[j])
            assert _common(fast[i], fast[j]) == n, (i, j)
            shared_pairs += n > len(exact[i]) // 2
    return shared_pairs


def test_positional_hashes_share_exactly_what_the_content_shares() -> None:
    workload = Workload.model_validate({
        "prompts": {"input_tokens": {"mean": 300, "dist": "lognormal", "sigma": 0.5},
                    "shared_prefix": 0.4, "conversations": 6, "turns": 4},
        "output_tokens": 40,
    })
    requests = build_requests(workload, 60, seed=3)
    assert _check_sharing(requests) > 10  # later turns share most of their history


def test_a_text_that_breaks_the_conversation_contract_is_hashed_by_content() -> None:
    """Same shared prefix and first block, then a different story: no false sharing."""
    words = [f"w{i}" for i in range(200)]
    other = words[:40] + [f"x{i}" for i in range(160)]
    reqs = [
        RequestSpec(i, 0, 0, " ".join(w), len(w), 16, 8, f"{i}") for i, w in enumerate((words, other, words))
    ]
    hasher = PromptHasher()
    got = [hasher.hashes(r.prompt, r.prompt_tokens, r.shared_prefix_tokens) for r in reqs]
    assert _common(got[0], got[1]) == 2  # blocks 0-1 are the same words; block 2 differs
    assert got[2] == got[0]


def test_eviction_is_least_recently_released_first_and_tail_first() -> None:
    # 10 blocks and the half-block of slack the one sequence that will run keeps
    mem = KVMemory(capacity_tokens=10 * BLOCK_TOKENS + BLOCK_TOKENS // 2)
    a, b = (1, 2, 3, 4), (11, 12, 13, 14)
    mem.admit(a, 0, 4 * BLOCK_TOKENS)
    mem.publish(a, 0)
    mem.release(a, 0)
    mem.admit(b, 0, 4 * BLOCK_TOKENS)
    mem.publish(b, 0)
    mem.release(b, 0)
    assert mem.cached_blocks(a, 100) == 4 and mem.cached_blocks(b, 100) == 4
    mem.admit((), 0, 4 * BLOCK_TOKENS)  # a private sequence needs 4 blocks: 2 must leave
    assert mem.cached_blocks(a, 100) == 2  # a was released first; its tail (4, 3) went first
    assert mem.cached_blocks(b, 100) == 4
    mem.admit(a, 2, 0)  # a hit: a's head is referenced (another half block of slack: b's tail goes)
    assert mem.cached_blocks(a, 100) == 2 and mem.cached_blocks(b, 100) == 3
    mem.grow(2 * BLOCK_TOKENS)  # referenced blocks never leave; b's next two do
    assert mem.cached_blocks(a, 100) == 2 and mem.cached_blocks(b, 100) == 1


def test_chain_memory_keeps_the_per_block_memory_block_for_block() -> None:
    """ChainMemory (runs of chains) against KVMemory (a dict entry a block) on random admits,
    prefills, growth and releases of sharing prompts under a small cache: same hits, same
    usage after every operation."""
    import random

    from orchestrator.sim.engine.chains import ChainMemory

    workload = Workload.model_validate({
        "prompts": {"input_tokens": {"mean": 400, "dist": "lognormal", "sigma": 0.6},
                    "shared_prefix": 0.3, "conversations": 8, "turns": 5},
        "output_tokens": 30,
    })
    requests = build_requests(workload, 200, seed=5)
    hasher = PromptHasher()
    prompts = [(hasher.hashes(r.prompt, r.prompt_tokens, r.shared_prefix_tokens), r.prompt_tokens)
               for r in requests]
    rng = random.Random(2)
    for capacity_blocks in (40, 120, 400):
        per_block = KVMemory(capacity_blocks * BLOCK_TOKENS)
        chained = ChainMemory(capacity_blocks * BLOCK_TOKENS)
        running: list[tuple[int, int, bool]] = []  # (prompt, held blocks, published)
        for _ in range(3000):
            op = rng.random()
            if op < 0.4 or not running:
                k = rng.randrange(len(prompts))
                blocks, tokens = prompts[k]
                hit = per_block.cached_blocks(tuple(blocks), tokens)
                assert chained.cached_blocks(blocks, tokens) == hit
                private = tokens - hit * BLOCK_TOKENS
                per_block.admit(tuple(blocks), hit, private)
                chained.admit(blocks, hit, private)
                running.append((k, hit, False))
            elif op < 0.7:
                j = rng.randrange(len(running))
                k, held, done = running[j]
                if not done:
                    blocks = prompts[k][0]
                    assert per_block.publish(tuple(blocks), held) == chained.publish(blocks, held)
                    running[j] = (k, len(blocks), True)
            elif op < 0.8:
                grow = rng.choice((1.0, 2.31, 16.0))
                per_block.grow(grow)
                chained.grow(grow)
            else:
                k, held, _ = running.pop(rng.randrange(len(running)))
                blocks = prompts[k][0]
                per_block.release(tuple(blocks)[:held], 8.0)
                chained.release(blocks[:held], 8.0)
            assert chained.used_tokens == per_block.used_tokens
            assert chained.n_evictable == len(per_block.evictable)
            for blocks, tokens in prompts[::7]:
                assert chained.cached_blocks(blocks, tokens) == per_block.cached_blocks(tuple(blocks), tokens)
