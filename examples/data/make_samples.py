"""Writes the small sample data files next to this script (made here, nothing downloaded):

- prompts.jsonl: completion prompts, chat conversations and ShareGPT-shaped lines, some
  starting with one of three shared system prompts, a few with their own output_tokens;
- trace.jsonl: a Mooncake-shaped trace (timestamp ms, input_length, output_length, hash_ids):
  bursty arrivals at about 4 requests/s over 60 s, requests of a group sharing their first
  blocks (a system prompt or a document), 512 tokens per hash id.

Run: python examples/data/make_samples.py   (deterministic: the same files every time)
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from orchestrator.loadgen.workloads import VOCAB

HERE = Path(__file__).resolve().parent


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(VOCAB) for _ in range(n))


def prompts(rng: random.Random, n: int = 60) -> list[dict]:
    systems = [_text(rng, 64) for _ in range(3)]
    out: list[dict] = []
    for i in range(n):
        system = systems[i % 3] if i % 2 == 0 else None
        user = _text(rng, rng.randint(60, 400))
        kind = i % 3
        if kind == 0:
            doc: dict = {"prompt": f"{system} {user}" if system else user}
        elif kind == 1:
            msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
            doc = {"messages": msgs}
        else:
            turns = ([{"from": "system", "value": system}] if system else []) + [
                {"from": "human", "value": user}, {"from": "gpt", "value": _text(rng, rng.randint(16, 96))}]
            doc = {"id": f"sample-{i}", "conversations": turns}
        if i % 5 == 0:
            doc["output_tokens"] = rng.choice([16, 32, 64])
        out.append(doc)
    return out


def trace(rng: random.Random, n: int = 240, rate: float = 4.0) -> list[dict]:
    rows, t, next_id = [], 0.0, 1000
    groups = [list(range(g * 10, g * 10 + rng.randint(1, 3))) for g in range(4)]  # shared leading blocks
    for _ in range(n):
        t += rng.gammavariate(0.5, 1.0 / (rate * 0.5))  # burstier than poisson
        length = rng.randint(300, 3000)
        blocks = -(-length // 512)
        shared = list(groups[rng.randrange(4)]) if rng.random() < 0.7 else []
        own = list(range(next_id, next_id + max(0, blocks - len(shared))))
        next_id += len(own)
        rows.append({"timestamp": int(t * 1000), "input_length": length,
                     "output_length": rng.choice([16, 24, 32, 48]), "hash_ids": (shared + own)[:blocks]})
    return rows


def write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))


if __name__ == "__main__":
    write(HERE / "prompts.jsonl", prompts(random.Random(19)))
    write(HERE / "trace.jsonl", trace(random.Random(20)))
