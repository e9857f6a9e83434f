"""A measured point with `workload.tokenizer: {file: tokenizer.json}` sends prompts fitted to
their exact lengths (control/points.py -> control/prompt_fit.py): the records' prompt_tokens are
the tokenizer's count of what was sent. The simulated server counts words (its usage is the
word count of the prompt it got), so each record's server_prompt_tokens is the fitted prompt's
word count, not the asked length. One arm, one point, loopback."""

from __future__ import annotations

from pathlib import Path

import yaml
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from orchestrator.backends.base import RunKey
from orchestrator.backends.sim import SimBackend
from orchestrator.control.design import point_seed
from orchestrator.control.points import PointRunner
from orchestrator.loadgen.datasets import point_load
from orchestrator.loadgen.workloads import VOCAB, fit_prompts, tokenizer_file_counter
from orchestrator.plan import validate_plan
from orchestrator.store import Store

ROOT = Path(__file__).resolve().parents[2]


def _tokenizer_json(where: Path) -> Path:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([" ".join(VOCAB)] * 20, trainer)  # ~2.3 tokens a generator word
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    path = where / "tokenizer.json"
    tok.save(str(path))
    return path


def test_a_runs_prompts_are_fitted_to_the_tokenizers_exact_lengths(tmp_path: Path) -> None:
    tok = _tokenizer_json(tmp_path)
    data = yaml.safe_load((ROOT / "examples" / "open-vs-closed.yaml").read_text())
    data["name"] = "prompt-fit"
    data["workload"] = {"arrival": {"process": "poisson"}, "output_tokens": 8,
                        "prompts": {"input_tokens": {"mean": 200, "dist": "uniform", "sigma": 0.5},
                                    "conversations": 100000},
                        "tokenizer": {"file": str(tok)}}
    data["bars"] = [{"id": "cap", "metric": "capacity", "class": "standard", "at_least": 1.1}]
    data["search"] = {"rate": {"min": 0.5, "max": 8}, "point_s": 1.5, "warmup_s": 0.3, "cooldown_s": 0}
    plan = validate_plan(data)
    backend = SimBackend(tmp_path / "sim")
    rate = 6.0
    with Store.open(f"sqlite:///{tmp_path / 'orch.sqlite'}") as store:
        reg = store.register_plan(plan)
        exp = store.create_experiment(reg.id)
        run = store.start_run(exp, "A", 0, 0, 0, store.deployment_config(plan, "A"))
        dep = backend.deploy(plan, "A", RunKey("prompt-fit", "A", 0))
        try:
            backend.ready(dep, 120)
            out = PointRunner(store, backend, plan, tmp_path / "spool", None).measure(
                dep, run, "A", 0, 0, rate, "standard")
        finally:
            backend.teardown(dep)
        recs = [r for r in store.requests(out.point_id) if r.status == "ok"]
    # The same point's requests, rebuilt and fitted here: what the run should have sent.
    s = plan.search
    _, reqs = point_load(plan.workload, rate, s.warmup_s + s.point_s + s.cooldown_s, point_seed(plan.design.seed, 0, rate))
    count = tokenizer_file_counter(str(tok))
    fitted = {r.request_id: r for r in fit_prompts(reqs, count)}
    assert len(recs) >= 5
    for r in recs:
        f = fitted[r.request_id]
        assert r.prompt_tokens == count(f.prompt) == f.prompt_tokens
        # The server got the fitted prompt (its word count), far fewer words than tokens.
        assert r.server_prompt_tokens == len(f.prompt.split()) < r.prompt_tokens
