"""`workload.tokenizer` (issue 19 item 4, wired): the plan setting (strict, hash-neutral while
unset) and control/prompt_fit.py fitting a point's prompts with a tokenizer.json trained here or
the server's /tokenize (a mock transport)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from orchestrator.control import prompt_fit
from orchestrator.errors import PermanentError
from orchestrator.loadgen.client import TokenizeCounter
from orchestrator.loadgen.workloads import VOCAB, build_requests, tokenizer_file_counter
from orchestrator.plan import Workload

BASE: dict[str, Any] = {"prompts": {"input_tokens": {"mean": 120, "dist": "uniform", "sigma": 0.2}, "shared_prefix": 0.1,
                    "conversations": 100}, "output_tokens": 8}


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([" ".join(VOCAB)] * 20, trainer)  # ~2.3 tokens a generator word
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def test_unset_tokenizer_leaves_the_canonical_workload_unchanged() -> None:
    w = Workload.model_validate(BASE)
    assert w.tokenizer is None
    assert "tokenizer" not in w.model_dump(mode="json")
    with_tok = Workload.model_validate({**BASE, "tokenizer": {"server": True}})
    assert with_tok.model_dump(mode="json")["tokenizer"] == {"file": None, "server": True, "sha256": None}


@pytest.mark.parametrize("tok", [{}, {"file": "t.json", "server": True}, {"server": False}, {"file": ""},
                                 {"file": "t.json", "extra": 1}, {"server": "maybe"}, {"file": 3}])
def test_the_setting_is_strict(tok: dict) -> None:
    with pytest.raises(ValidationError):
        Workload.model_validate({**BASE, "tokenizer": tok})


@pytest.mark.parametrize("other", [{"closed": {"users": 4}}, {"sessions": {}}])
def test_only_open_loop_synthetic_prompts_are_fitted(other: dict) -> None:
    with pytest.raises(ValidationError, match="tokenizer"):
        Workload.model_validate({**BASE, **other, "tokenizer": {"server": True}})


def test_a_point_is_fitted_with_the_file_tokenizer(tokenizer_json: Path) -> None:
    w = Workload.model_validate({**BASE, "tokenizer": {"file": str(tokenizer_json)}})
    reqs = build_requests(w, 12, seed=3)
    count = tokenizer_file_counter(str(tokenizer_json))
    assert all(count(r.prompt) != r.prompt_tokens for r in reqs)  # one word = one token is off
    fitted = prompt_fit.fit_point_prompts(w, reqs, "http://127.0.0.1:9", "m")
    assert [r.request_id for r in fitted] == [r.request_id for r in reqs]
    assert all(count(f.prompt) == r.prompt_tokens == f.prompt_tokens for f, r in zip(fitted, reqs, strict=True))


def test_without_a_tokenizer_the_prompts_are_left_alone() -> None:
    w = Workload.model_validate(BASE)
    reqs = build_requests(w, 5, seed=3)
    assert prompt_fit.fit_point_prompts(w, reqs, "http://127.0.0.1:9", "m") == reqs


def test_a_missing_or_bad_tokenizer_file_is_an_error(tmp_path: Path) -> None:
    reqs = build_requests(Workload.model_validate(BASE), 2, seed=1)
    with pytest.raises(ValidationError, match=r"tokenizer\.file.*no such file"):  # at plan load, not at a point
        Workload.model_validate({**BASE, "tokenizer": {"file": str(tmp_path / "absent.json")}})
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    w = Workload.model_validate({**BASE, "tokenizer": {"file": str(bad)}})
    with pytest.raises(PermanentError, match="cannot load"):
        prompt_fit.fit_point_prompts(w, reqs, "http://127.0.0.1:9", "m")


def test_the_tokenizer_file_is_pinned_by_sha256(tokenizer_json: Path, tmp_path: Path) -> None:
    """The registered plan names the tokenizer by its sha256 (an edited file is another plan,
    and a run refuses a file that changed since registration)."""
    copy = tmp_path / "tokenizer.json"
    copy.write_bytes(tokenizer_json.read_bytes())
    w = Workload.model_validate({**BASE, "tokenizer": {"file": str(copy)}})
    assert w.tokenizer is not None and w.tokenizer.sha256 == hashlib.sha256(copy.read_bytes()).hexdigest()
    again = Workload.model_validate(w.model_dump(mode="json"))
    assert again == w  # the pinned hash round-trips through the registered JSON
    reqs = build_requests(w, 2, seed=1)
    copy.write_bytes(copy.read_bytes() + b" ")
    edited = Workload.model_validate({**BASE, "tokenizer": {"file": str(copy)}})
    assert edited.tokenizer is not None and edited.tokenizer.sha256 != w.tokenizer.sha256
    with pytest.raises(PermanentError, match="changed since the plan was registered"):
        prompt_fit.fit_point_prompts(w, reqs, "http://127.0.0.1:9", "m")


def test_a_prompt_that_cannot_fit_is_a_permanent_error(tokenizer_json: Path) -> None:
    # 90% shared prefix of ~2.3 tokens a word: the kept part alone exceeds the asked length.
    data = {**BASE, "prompts": {**BASE["prompts"], "shared_prefix": 0.9}, "tokenizer": {"file": str(tokenizer_json)}}
    w = Workload.model_validate(data)
    with pytest.raises(PermanentError, match="workload.tokenizer"):
        prompt_fit.fit_point_prompts(w, build_requests(w, 3, seed=1), "http://127.0.0.1:9", "m")


def test_server_true_asks_the_endpoints_tokenize(tokenizer_json: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    local = Tokenizer.from_file(str(tokenizer_json))
    seen: list[tuple[str, str]] = []
    heard: set[str] = set()

    def vllm_tokenize(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        heard.add(request.headers.get("x-key", ""))
        seen.append((str(request.url.copy_with(path="/")), body["model"]))
        return httpx.Response(200, json={"count": len(local.encode(body["prompt"]).ids), "tokens": []})

    class Mocked(TokenizeCounter):
        def __init__(self, base_url: str, model: str, headers: object = None) -> None:
            super().__init__(base_url, model, headers, transport=httpx.MockTransport(vllm_tokenize))  # type: ignore[arg-type]

    monkeypatch.setattr(prompt_fit, "TokenizeCounter", Mocked)
    w = Workload.model_validate({**BASE, "tokenizer": {"server": True}})
    reqs = build_requests(w, 4, seed=2)
    fitted = prompt_fit.fit_point_prompts(w, reqs, "http://127.0.0.1:8000", "tiny", (("x-key", "k"),))
    assert seen and set(seen) == {("http://127.0.0.1:8000/", "tiny")}
    assert heard == {"k"}
    assert all(len(local.encode(f.prompt).ids) == f.prompt_tokens for f in fitted)
