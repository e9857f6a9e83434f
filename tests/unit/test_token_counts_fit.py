"""Synthetic prompts fitted to the asked length with the served model's own tokenizer (issue 19
item 4): a tokenizer.json trained here (most generator words split into several tokens), and
vLLM's /tokenize answered by a mock transport."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from orchestrator.loadgen.client import TokenizeCounter
from orchestrator.loadgen.workloads import (
    NONCE_WORDS,
    VOCAB,
    PromptFitError,
    build_requests,
    fit_prompt,
    fit_prompts,
    single_token_words,
    tokenizer_file_counter,
)
from orchestrator.plan import Workload


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([" ".join(VOCAB)] * 20, trainer)  # 400 entries: ~2.3 tokens a word
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def _workload(api: str = "completions", turns: int = 1) -> Workload:
    return Workload.model_validate({"prompts": {"input_tokens": {"mean": 120, "dist": "uniform", "sigma": 0.2},
                                                "shared_prefix": 0.1, "conversations": 100, "turns": turns},
                                    "output_tokens": 8, "api": api})


def test_the_tokenizer_made_here_splits_the_generators_words(tokenizer_json: Path) -> None:
    count = tokenizer_file_counter(str(tokenizer_json))
    assert count("") == 1  # the BOS the server adds
    fill = single_token_words(count)
    assert 5 <= len(fill) < len(VOCAB) / 4
    assert all(count(w) == 2 for w in fill)
    reqs = build_requests(_workload(), 10, seed=1)
    assert all(count(r.prompt) > 1.5 * r.prompt_tokens for r in reqs)  # one word = one token is far off


def test_fitted_prompts_have_exactly_the_asked_tokens(tokenizer_json: Path) -> None:
    count = tokenizer_file_counter(str(tokenizer_json))
    reqs = build_requests(_workload(), 10, seed=1)
    fitted = fit_prompts(reqs, count)
    assert [count(f.prompt) for f in fitted] == [r.prompt_tokens for r in reqs]
    assert [f.prompt_tokens for f in fitted] == [r.prompt_tokens for r in reqs]
    keep = reqs[0].shared_prefix_tokens + NONCE_WORDS
    for r, f in zip(reqs, fitted, strict=True):
        assert f.prompt.split()[:keep] == r.prompt.split()[:keep]  # shared prefix and nonce kept
    assert len({f.prompt_hash for f in fitted}) == len(fitted)
    assert fit_prompts(fitted, count) == fitted  # already exact: unchanged


def test_short_prompts_are_padded_with_single_token_words(tokenizer_json: Path) -> None:
    count = tokenizer_file_counter(str(tokenizer_json))
    r = build_requests(_workload(), 1, seed=2)[0]
    longer = type(r)(**{**{k: getattr(r, k) for k in r.__slots__}, "prompt_tokens": 3 * r.prompt_tokens})
    f = fit_prompt(longer, count, single_token_words(count))
    assert count(f.prompt) == 3 * r.prompt_tokens


def test_chat_and_later_turns_are_left_alone_and_an_impossible_length_is_an_error(tokenizer_json: Path) -> None:
    count = tokenizer_file_counter(str(tokenizer_json))
    fill = single_token_words(count)
    chat = build_requests(_workload(api="chat"), 3, seed=1)
    assert fit_prompts(chat, count) == chat
    multi = [r for r in build_requests(_workload(turns=2), 200, seed=1) if r.turn == 1][:3]
    assert multi and [fit_prompt(r, count, fill) for r in multi] == multi
    r = build_requests(_workload(), 1, seed=1)[0]
    tiny = type(r)(**{**{k: getattr(r, k) for k in r.__slots__}, "prompt_tokens": 3})
    with pytest.raises(PromptFitError, match="prefix and nonce alone exceed 3 tokens"):
        fit_prompt(tiny, count, fill)


def test_the_servers_tokenize_endpoint_counts(tokenizer_json: Path) -> None:
    local = Tokenizer.from_file(str(tokenizer_json))
    seen: list[dict[str, str]] = []

    def vllm_tokenize(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/tokenize"
        body = json.loads(request.content)
        seen.append(body)
        ids = local.encode(body["prompt"]).ids
        return httpx.Response(200, json={"count": len(ids), "max_model_len": 2048, "tokens": ids})

    with TokenizeCounter("http://vllm:8000", "tiny", transport=httpx.MockTransport(vllm_tokenize)) as count:
        reqs = build_requests(_workload(), 4, seed=3)
        fitted = fit_prompts(reqs, count)
        assert [len(local.encode(f.prompt).ids) for f in fitted] == [r.prompt_tokens for r in reqs]
    assert seen and all(b["model"] == "tiny" for b in seen)


def test_a_server_without_tokenize_is_an_environment_problem() -> None:
    from orchestrator.errors import EnvironmentProblem

    def sim(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, text="Not Found")

    with TokenizeCounter("http://sim:8000", "m", transport=httpx.MockTransport(sim)) as count, \
            pytest.raises(EnvironmentProblem, match="HTTP 404"):
        count("the of")
