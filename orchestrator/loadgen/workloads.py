"""Workload synthesis: prompts, shared prefixes, conversations (pure).

Token scheme (DESIGN, contracts): one token = one whitespace-separated word. Prompts are built
from a fixed vocabulary of short common English words, so against the simulated server the
count is exact (it counts ``len(text.split())``) and against a real BPE tokenizer each word is
close to one token: a *stated approximation*, not an exact count. Exact counts: ``fit_prompts``
brings each first-turn completion prompt to its asked length under the served model's own
tokenizer (a local tokenizer.json, or the server's /tokenize), and every record keeps the
server's usage.prompt_tokens for the prompt-length guard.

A first-turn prompt is ``[shared prefix][nonce][unique words]``: the shared prefix (a system
prompt) is common to every request of the point; the nonce encodes the conversation id and the
seed, so no two conversations repeat by accident; the unique words are random. Turn t+1 is turn
t's prompt + a synthetic assistant reply of ``max_tokens`` words + new user words, so the whole
open-loop request list is fixed up front from the seed.

Requests interleave conversations: C conversations are open at once, round r sends turn r of
each (in a shuffled order), so a conversation's next turn comes about C requests later, as in
real traffic; after C x turns requests a new generation of C conversations starts.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from orchestrator.loadgen.schedules import derive_seed
from orchestrator.plan.workload import LengthDist, Workload

# 256 short common English words: each is one token under common BPE vocabularies (with its
# leading space), so the word count approximates a real tokenizer's count.
VOCAB: tuple[str, ...] = tuple(
    ["the", "of", "and", "to", "in", "is", "for", "on", "that", "with", "as", "it", "at", "by", "from", "be", "this", "are", "or", "an", "was", "have", "not", "but", "they", "his", "her", "she", "he", "we", "you", "all", "one", "can", "will", "has", "more", "when", "there", "their", "what", "so", "about", "out", "up", "into", "if", "its", "two", "time", "also", "new", "other", "some", "could", "than", "only", "them", "these", "may", "first", "then", "any", "like", "over", "such", "our", "after", "most", "made", "use", "through", "years", "way", "many", "before", "where", "much", "well", "back", "been", "work", "each", "him", "me", "now", "should", "because", "good", "very", "just", "long", "same", "own", "see", "year", "day", "used", "world", "both", "down", "between", "life", "under", "never", "three", "place", "while", "last", "might", "high", "still", "found", "know", "take", "every", "part", "small", "city", "must", "off", "old", "since", "name", "place", "great", "line", "year", "end", "right", "little", "think", "tell", "long", "point", "home", "hand", "give", "house", "high", "again", "ever", "head", "water", "room", "mother", "area", "money", "story", "fact", "month", "lot", "study", "book", "eye", "job", "word", "side", "kind", "four", "game", "week", "case", "group", "night", "live", "car", "body", "white", "man", "far", "open", "run", "turn", "move", "play", "light", "next", "hard", "dog", "cat", "tree", "sun", "rain", "road", "town", "red", "blue", "green", "black", "sea", "air", "fire", "food", "door", "bed", "ship", "farm", "king", "song", "bird", "fish", "hill", "rock", "star", "sky", "field", "wind", "river", "paper", "table", "music", "art", "love", "war", "rest", "show", "sure", "hope", "free", "form", "call", "plan", "step", "test", "rate", "cost", "view", "page", "list", "team", "hold", "land", "west", "east", "north", "south", "born", "cold", "warm", "hot", "less", "real", "full", "deep", "wide", "low", "fast", "slow", "near", "soon", "late", "age", "bit", "box", "cup", "egg", "leg", "arm", "lip", "map", "pen", "pot", "hat", "key", "bag", "toy", "gold", "iron", "salt", "milk", "tea", "rice", "corn", "wood", "glass", "stone", "wall", "hall", "gate", "path", "bank", "shop", "club", "card", "seat"]
)
# Deduplicate while keeping order (the list above repeats a few words).
VOCAB = tuple(dict.fromkeys(VOCAB))
_VOCAB_ARR = np.array(VOCAB, dtype=object)
_V = len(VOCAB)

NONCE_WORDS = 5  # 3 words of conversation id (base |VOCAB|) + 2 words of the seed
BLOCK_TOKENS = 16  # vLLM's prefix-cache block size: only whole blocks are reused


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a point's list, fixed before the point starts."""

    request_id: int
    conversation_id: int
    turn: int
    prompt: str  # words; len(prompt.split()) == prompt_tokens
    prompt_tokens: int
    shared_prefix_tokens: int  # leading tokens common to every request (system prompt)
    max_tokens: int  # sent with ignore_eos: true
    prompt_hash: str  # hash of the prompt beyond the shared prefix
    # Chat only: (role, content) in order; the contents joined by one space equal ``prompt``.
    messages: tuple[tuple[str, str], ...] = ()
    # Live sessions: leading tokens the server has seen before as the previous turn's prompt and
    # its own reply (what a cache of generated blocks may reuse); 0 otherwise.
    history_tokens: int = 0


def sample_lengths(dist: LengthDist, size: int, rng: np.random.Generator) -> np.ndarray:
    """Token counts from a registered length distribution (mean is the distribution's mean),
    rounded and clipped to [min, max]."""
    if dist.dist == "fixed" or dist.sigma == 0:
        x = np.full(size, dist.mean, dtype=np.float64)
    elif dist.dist == "lognormal":
        mu = math.log(dist.mean) - dist.sigma**2 / 2
        x = rng.lognormal(mu, dist.sigma, size)
    elif dist.dist == "uniform":
        x = rng.uniform(dist.mean * (1 - dist.sigma), dist.mean * (1 + dist.sigma), size)
    else:  # normal
        x = rng.normal(dist.mean, dist.sigma, size)
    x = np.rint(x)
    hi = dist.max if dist.max is not None else np.inf
    return np.clip(x, dist.min, hi).astype(np.int64)


def _words(rng: np.random.Generator, n: int) -> list[str]:
    if n <= 0:
        return []
    return list(_VOCAB_ARR[rng.integers(0, _V, n)])


def _text(rng: np.random.Generator, n: int) -> str:
    """``" ".join(_words(rng, n))`` from the same draws, without a list of words on the way."""
    if n <= 0:
        return ""
    return " ".join(_VOCAB_ARR[rng.integers(0, _V, n)].tolist())


def _one_length(dist: LengthDist, rng: np.random.Generator) -> int:
    """``sample_lengths(dist, 1, rng)[0]`` (a fixed length draws nothing: no arrays for it)."""
    if dist.dist == "fixed" or dist.sigma == 0:
        n = max(round(dist.mean), dist.min)  # round() halves to even, as np.rint
        return n if dist.max is None else min(n, dist.max)
    return int(sample_lengths(dist, 1, rng)[0])


def _encode(value: int, digits: int) -> list[str]:
    out = []
    for _ in range(digits):
        out.append(VOCAB[value % _V])
        value //= _V
    return out


def _nonce(conversation_id: int, seed: int) -> list[str]:
    if conversation_id >= _V**3:
        raise ValueError(f"too many conversations for the nonce ({conversation_id} >= {_V**3})")
    return _encode(conversation_id, 3) + _encode(_seed_of(seed, "nonce"), 2)


@functools.lru_cache(maxsize=64)
def _seed_of(seed: int, label: str) -> int:
    # derive_seed (a sha256) once per point rather than once per conversation
    return derive_seed(seed, label)


def _hash(words: Sequence[str]) -> str:
    return hashlib.sha256(" ".join(words).encode()).hexdigest()[:32]


def shared_prefix_tokens(workload: Workload) -> int:
    """Tokens of the shared prefix: the registered share of the mean first-turn prompt."""
    p = workload.prompts
    return int(round(p.shared_prefix * p.input_tokens.mean))


def shared_prefix_words(workload: Workload, seed: int) -> list[str]:
    """The system prompt common to every request of a point."""
    rng = np.random.default_rng(derive_seed(seed, "shared-prefix"))
    return _words(rng, shared_prefix_tokens(workload))


# A prompt segment: (role, its words joined by one space, how many words).
Segment = tuple[str, str, int]


def _segment(role: str, words: Sequence[str]) -> Segment:
    return role, " ".join(words), len(words)


class _Conversation:
    """Builds one conversation's turns lazily, from its own random stream (so the content of a
    conversation does not depend on how many requests the point has)."""

    def __init__(self, workload: Workload, conversation_id: int, seed: int, prefix: Sequence[str],
                 prefix_text: str | None = None):
        self.workload = workload
        self.rng = np.random.default_rng([_seed_of(seed, "conversation"), conversation_id])
        p = workload.prompts
        first_len = _one_length(p.input_tokens, self.rng)
        # The prompt holds at least the prefix and the nonce (stated: tiny prompts grow to fit).
        unique = max(0, first_len - len(prefix) - NONCE_WORDS)
        nonce = " ".join(_nonce(conversation_id, seed))
        words = _text(self.rng, unique)
        # Segments keep their text: a 2,000-word prompt is joined once, not rebuilt word by word.
        self.segments: list[Segment] = []
        if prefix:
            self.segments.append(("system", " ".join(prefix) if prefix_text is None else prefix_text,
                                  len(prefix)))
        self.segments.append(("user", f"{nonce} {words}" if words else nonce, NONCE_WORDS + max(unique, 0)))
        self.turns_built = 1

    def turn_segments(self, turn: int) -> list[Segment]:
        """Segments (role, text, words) of the prompt of ``turn`` (0-based)."""
        while self.turns_built <= turn:
            n_reply = self.workload.output_tokens
            reply = _text(self.rng, n_reply)
            follow = self.workload.prompts.followup_tokens
            if follow is not None:
                n_new = _one_length(follow, self.rng)
            else:
                first = _one_length(self.workload.prompts.input_tokens, self.rng)
                n_new = max(1, first - shared_prefix_tokens(self.workload))
            self.segments.append(("assistant", reply, max(n_reply, 0)))
            self.segments.append(("user", _text(self.rng, n_new), max(n_new, 0)))
            self.turns_built += 1
        # Turn t has the prefix (if any), then 2t+1 user/assistant segments.
        keep = (1 if self.segments[0][0] == "system" else 0) + 2 * turn + 1
        return self.segments[:keep]


class LiveSession(_Conversation):
    """A session whose later turns carry the reply the server actually returned (sessions):
    turn t+1 = turn t's prompt + that reply + new user words from the session's own stream."""

    def __init__(self, workload: Workload, session_id: int, seed: int, prefix: list[str]):
        super().__init__(workload, session_id, seed, prefix)
        self.session_id, self.prefix, self.turn, self.seed = session_id, prefix, 0, seed

    def first(self, request_id: int) -> RequestSpec:
        return _spec(self.workload, request_id, self.session_id, 0, self.segments, self.prefix, self.seed)

    def after_reply(self, reply_text: str, request_id: int) -> RequestSpec:
        """The next turn, once ``reply_text`` (the previous turn's returned text) is in."""
        self.segments.append(_segment("assistant", reply_text.split()))
        history = sum(n for _, _, n in self.segments)
        n_new = self._followup_len()
        self.segments.append(("user", _text(self.rng, n_new), max(n_new, 0)))
        self.turn += 1
        spec = _spec(self.workload, request_id, self.session_id, self.turn, self.segments, self.prefix, self.seed)
        return dataclasses.replace(spec, history_tokens=history)

    def _followup_len(self) -> int:
        follow = self.workload.prompts.followup_tokens
        if follow is not None:
            return _one_length(follow, self.rng)
        first = _one_length(self.workload.prompts.input_tokens, self.rng)
        return max(1, first - shared_prefix_tokens(self.workload))


def reply_tokens(workload: Workload, request_id: int, seed: int) -> int:
    """Request ``request_id``'s reply length: ``output_tokens``, or a draw from ``output_dist``
    that depends on (seed, request) alone."""
    dist = workload.output_dist
    if dist is None or dist.dist == "fixed" or dist.sigma == 0:
        return workload.output_tokens
    rng = np.random.default_rng(derive_seed(seed, "reply", request_id))
    return int(sample_lengths(dist, 1, rng)[0])


def _spec(workload: Workload, request_id: int, cid: int, turn: int,
          segments: Sequence[Segment], prefix: Sequence[str], seed: int) -> RequestSpec:
    # The words past the shared prefix are every segment after the system one (when there is a
    # prefix, it is that segment); empty segments add no words, so they add no space either.
    rest = " ".join([text for _, text, n in segments[1 if prefix else 0 :] if n])
    prompt = f"{segments[0][1]} {rest}" if prefix and rest else (segments[0][1] if prefix else rest)
    chat = workload.api == "chat"
    return RequestSpec(
        request_id=request_id,
        conversation_id=cid,
        turn=turn,
        prompt=prompt,
        prompt_tokens=sum(n for _, _, n in segments),
        shared_prefix_tokens=len(prefix),
        max_tokens=reply_tokens(workload, request_id, seed),
        prompt_hash=hashlib.sha256(rest.encode()).hexdigest()[:32],
        messages=tuple((role, text) for role, text, _ in segments) if chat else (),
    )


class _Slots:
    """(conversation_id, turn) of each request: round r of a generation sends turn r of every
    conversation of that generation, in an order shuffled per round (from the seed), so the gap
    between a conversation's turns varies as in real traffic and a round-robin router does not
    meet the same conversation on the same worker by arithmetic accident."""

    def __init__(self, conversations: int, turns: int, seed: int):
        self.conversations, self.turns, self.seed = conversations, turns, seed
        self._orders: dict[tuple[int, int], np.ndarray] = {}

    def __call__(self, i: int) -> tuple[int, int]:
        generation, within = divmod(i, self.conversations * self.turns)
        turn, slot = divmod(within, self.conversations)
        key = (generation, turn)
        order = self._orders.get(key)
        if order is None:
            self._orders.clear()  # rounds are visited in order: keep one
            rng = np.random.default_rng(derive_seed(self.seed, "order", generation, turn))
            order = self._orders[key] = rng.permutation(self.conversations)
        return generation * self.conversations + int(order[slot]), turn


def iter_requests(workload: Workload, seed: int) -> Iterator[RequestSpec]:
    """The point's requests in order, without end: request ``i`` is the same whatever number
    is taken, so a closed loop (which cannot know its count up front) takes what it needs."""
    p = workload.prompts
    prefix = shared_prefix_words(workload, seed)
    prefix_text = " ".join(prefix)
    slots = _Slots(p.conversations, p.turns, seed)
    convs: dict[int, _Conversation] = {}
    for i in itertools.count():
        cid, turn = slots(i)
        conv = convs.get(cid)
        if conv is None:
            conv = convs[cid] = _Conversation(workload, cid, seed, prefix, prefix_text)
        yield _spec(workload, i, cid, turn, conv.turn_segments(turn), prefix, seed)
        if turn == p.turns - 1:
            del convs[cid]  # its last turn: free the history


def build_requests(workload: Workload, n: int, seed: int) -> list[RequestSpec]:
    """The point's ``n`` requests, fully determined by (workload, n, seed)."""
    if n < 0:
        raise ValueError("n must be >= 0")
    return list(itertools.islice(iter_requests(workload, seed), n))


# ---- exact token counts (issue 19 item 4) ----------------------------------------------------

# A prompt's token count under the served model's own tokenizer: a local tokenizer.json
# (``tokenizer_file_counter``) or the server's /tokenize endpoint (loadgen.client.tokenize_counter).
TokenCounter = Callable[[str], int]


class PromptFitError(ValueError):
    """A prompt cannot be brought to its asked length (its kept part alone is longer)."""


def tokenizer_file_counter(path: str) -> TokenCounter:
    """Counts with a local ``tokenizer.json`` (the ``tokenizers`` library), special tokens
    included as the server adds them to a completion prompt (e.g. BOS)."""
    from tokenizers import Tokenizer  # imported only where exact counts are asked for

    tok = Tokenizer.from_file(str(path))
    return lambda text: len(tok.encode(text).ids)


def single_token_words(count: TokenCounter) -> tuple[str, ...]:
    """The vocabulary words that add exactly one token after another word: what a prompt is
    padded with, so padding never overshoots."""
    base = count(VOCAB[0])
    return tuple(w for w in VOCAB if count(f"{VOCAB[0]} {w}") - base == 1)


def fit_prompt(spec: RequestSpec, count: TokenCounter, fill: Sequence[str]) -> RequestSpec:
    """``spec`` with its prompt brought to exactly ``spec.prompt_tokens`` tokens under ``count``:
    the shared prefix and the nonce are kept; the unique words after them are cut (the longest
    cut that does not exceed the length) and padded with ``fill`` words (single tokens).

    Only a completion prompt of a first turn is fitted (a chat prompt's template and a later
    turn's history are the server's and the conversation's own): others come back unchanged."""
    if spec.messages or spec.turn > 0 or spec.history_tokens:
        return spec
    target = spec.prompt_tokens
    words = spec.prompt.split()
    if count(spec.prompt) == target:
        return spec
    if not fill:
        raise PromptFitError("no single-token fill words under this tokenizer")
    keep = min(len(words), spec.shared_prefix_tokens + NONCE_WORDS)
    if count(" ".join(words[:keep])) > target:
        raise PromptFitError(f"request {spec.request_id}: its prefix and nonce alone exceed "
                             f"{target} tokens")
    lo, hi = keep, len(words)  # the longest prefix of the words within the length (binary search)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(" ".join(words[:mid])) <= target:
            lo = mid
        else:
            hi = mid - 1
    words = words[:lo]
    n, i = count(" ".join(words)), spec.request_id
    for _ in range(8):  # single-token words add one each; a merge across words may need a round more
        if n >= target:
            break
        for _ in range(target - n):
            words.append(fill[i % len(fill)])
            i += 1
        n = count(" ".join(words))
    while n > target and len(words) > keep:
        words.pop()
        n = count(" ".join(words))
    if n != target:
        raise PromptFitError(f"request {spec.request_id}: {n} tokens, asked {target}")
    return dataclasses.replace(spec, prompt=" ".join(words),
                               prompt_hash=_hash(words[spec.shared_prefix_tokens:]))


def fit_prompts(requests: Sequence[RequestSpec], count: TokenCounter) -> list[RequestSpec]:
    """Every request fitted to its asked length (``fit_prompt``)."""
    fill = single_token_words(count)
    return [fit_prompt(r, count, fill) for r in requests]


# ---- expected prefix-cache hit rate -------------------------------------------------------


def _block_aligned(tokens: int, prompt_tokens: int) -> int:
    # vLLM reuses whole 16-token blocks and always computes at least the prompt's last token.
    return (min(tokens, prompt_tokens - 1) // BLOCK_TOKENS) * BLOCK_TOKENS


def _route(policy: str, workers: int, i: int, cid: int, holder: dict[int, int], rng: random.Random) -> int:
    if policy == "round_robin":
        return i % workers
    if policy == "consistent_hash":
        return derive_seed(0, "conversation", cid) % workers
    if policy == "cache_aware":
        # Follow the worker that holds the conversation's history; spread new conversations.
        return holder.get(cid, i % workers)
    if policy in ("power_of_two", "random", "least_loaded"):
        # No affinity: a fixed pseudo-random draw stands for load-based choice.
        return rng.randrange(workers)
    raise ValueError(f"unknown routing policy {policy!r}")


def expected_prefix_hit_rate(requests: Sequence[RequestSpec], workers: int, policy: str) -> float:
    """Prefix-cache hits / prompt tokens the server should report for this request list.

    Each worker's cache is taken as unbounded (eviction only lowers the figure), hits count in
    whole 16-token blocks, and the prompt is reused but not the server's own reply (the next
    turn carries our synthetic reply, which the server never generated). A request reuses the
    longest of: the shared prefix, if its worker has served anything; the previous turn's
    prompt of its conversation, if that turn ran on the same worker.
    """
    if workers < 1:
        raise ValueError("workers must be >= 1")
    rng = random.Random(0)
    served: set[int] = set()
    # conversation -> {worker: longest prompt of that conversation it has processed}
    history: dict[int, dict[int, int]] = {}
    holder: dict[int, int] = {}
    hit = total = 0
    for i, r in enumerate(requests):
        w = _route(policy, workers, i, r.conversation_id, holder, rng)
        best = r.shared_prefix_tokens if w in served else 0
        seen = history.setdefault(r.conversation_id, {})
        if w in seen:
            best = max(best, seen[w])
        hit += _block_aligned(best, r.prompt_tokens)
        total += r.prompt_tokens
        served.add(w)
        seen[w] = max(seen.get(w, 0), r.prompt_tokens)
        holder[r.conversation_id] = w
    return hit / total if total else 0.0


def session_prefix_hit_rate(requests: Sequence[RequestSpec]) -> float:
    """Upper bound for live sessions: one unbounded cache that keeps the shared prefix once it
    has served anything, and for a later turn its previous prompt and the reply the server
    generated (vLLM caches full blocks of generated tokens too), in whole 16-token blocks."""
    served = False
    hit = total = 0
    for r in requests:
        best = max(r.shared_prefix_tokens if served else 0, r.history_tokens)
        hit += _block_aligned(best, r.prompt_tokens)
        total += r.prompt_tokens
        served = True
    return hit / total if total else 0.0


def ideal_prefix_hit_rate(requests: Sequence[RequestSpec]) -> float:
    """Upper bound: one cache that sees every request (perfect routing, no eviction)."""
    return expected_prefix_hit_rate(requests, 1, "round_robin")

