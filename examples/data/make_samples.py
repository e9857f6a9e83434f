"""Writes the small sample data files next to this script (made here, nothing downloaded):

- prompts.jsonl: completion prompts, chat conversations and ShareGPT-shaped lines, some
  starting with one of three shared system prompts, a few with their own output_tokens;
- trace.jsonl: a Mooncake-shaped trace (timestamp ms, input_length, output_length, hash_ids):
  bursty arrivals at about 4 requests/s over 60 s, requests of a group sharing their first
  blocks (a system prompt or a document), 512 tokens per hash id;
- sharegpt_sessions.json: ShareGPT's own shape (one JSON array) of multi-turn conversations,
  1 to 5 human turns each, each answered by gpt, some opening with a shared system prompt
  (replayed as live sessions with `workload.sessions`);
- mooncake_sessions.jsonl: a Mooncake-shaped trace with session ids (AIPerf's multi-turn
  form): sessions starting at about 0.5/s over 120 s, 1 to 4 turns each, a later turn's prompt
  holding the turn before and its reply (input_length grows, hash_ids extend the earlier ones),
  its timestamp a think time after the turn before ended.

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


def sessions(rng: random.Random, n: int = 40) -> list[dict]:
    systems = [_text(rng, 48) for _ in range(2)]
    out: list[dict] = []
    for i in range(n):
        turns = [{"from": "system", "value": systems[i % 2]}] if i % 3 == 0 else []
        k = rng.randint(1, 5)
        for j in range(k):
            turns.append({"from": "human", "value": _text(rng, rng.randint(20, 160))})
            if j < k - 1 or i % 4:  # a few end on an unanswered question
                turns.append({"from": "gpt", "value": _text(rng, rng.randint(16, 96))})
        out.append({"id": f"session-{i}", "conversations": turns})
    return out


def trace_sessions(rng: random.Random, n: int = 60, rate: float = 0.5) -> list[dict]:
    rows: list[dict] = []
    t, next_id = 0.0, 5000
    for s in range(n):
        t += rng.expovariate(rate)
        at, length, ids = t, rng.randint(400, 2000), []
        for _ in range(rng.randint(1, 4)):
            blocks = -(-length // 512)
            ids = ids + list(range(next_id, next_id + max(0, blocks - len(ids))))
            next_id += blocks
            out = rng.choice([16, 32, 64, 96])
            rows.append({"session_id": f"session-{s}", "timestamp": int(at * 1000), "input_length": length,
                         "output_length": out, "hash_ids": ids[:blocks]})
            at += 1.0 + out * 0.03 + rng.uniform(2.0, 20.0)  # the reply, then the user's think time
            length += out + rng.randint(30, 400)
    return sorted(rows, key=lambda r: r["timestamp"])


def write(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))


def write_array(path: Path, rows: list[dict]) -> None:
    """One JSON array, as ShareGPT ships its files."""
    path.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    write(HERE / "prompts.jsonl", prompts(random.Random(19)))
    write(HERE / "trace.jsonl", trace(random.Random(20)))
    write_array(HERE / "sharegpt_sessions.json", sessions(random.Random(21)))
    write(HERE / "mooncake_sessions.jsonl", trace_sessions(random.Random(22)))
