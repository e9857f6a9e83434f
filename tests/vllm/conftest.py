"""The real-engine tier: vLLM (CPU build) with the tiny model, built by `make vllm`.

Every test in this folder is marked `vllm` (run alone with `pytest -m vllm`) and skips, with
the remedy as its reason, when the vLLM environment or the tiny model is absent. Each vLLM
start costs 1-4 minutes on a small shared CPU machine, so tests share deployments per module.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.backends.base import Deployment, RunKey
from orchestrator.backends.local import LocalBackend
from orchestrator.backends.vllm_env import TINY_MODEL_ID, VLLM_VERSION, VllmEnv
from orchestrator.plan import Plan, validate_plan

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
READY_DEADLINE_S = 900  # slow on 2 shared cores; a healthy start takes 60-250 s here


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    env = VllmEnv.default()
    reason = None if env.ready() else (
        f"vLLM environment absent ({env.root}): run `make vllm` "
        f"(venv ready: {env.venv_ready()}, tiny model ready: {env.model_ready()})"
    )
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.vllm)
            item.add_marker(pytest.mark.timeout(1800))
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


def tiny_plan(arms: dict[str, dict], router: str = "round_robin") -> Plan:
    """The quickstart plan on the tiny model with the given arms (engine version = installed)."""
    data = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    data["name"] = "vllm-tier"
    data["model"] = {"name": "tiny-llama", "hf_id": TINY_MODEL_ID, "params": 5.0e5, "layers": 2,
                     "kv_heads": 4, "head_dim": 32, "hidden_size": 128, "max_context": 2048}
    data["router"] = {"policy": router}
    # Prompts that fit the tiny model's 1,024-token context; 16-token replies.
    data["workload"]["prompts"] = {"input_tokens": {"mean": 300, "dist": "fixed"},
                                   "shared_prefix": 0.5, "conversations": 50, "turns": 1}
    data["workload"]["output_tokens"] = 16
    for arm in arms.values():
        arm.setdefault("gpu", "H200")
        arm.setdefault("engine", {})["version"] = VLLM_VERSION
        arm["engine"].setdefault("max_num_seqs", 16)
        arm["engine"].setdefault("max_num_batched_tokens", 1024)
    data["arms"] = arms
    return validate_plan(data)


@pytest.fixture(scope="session")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBackend]:
    b = LocalBackend(tmp_path_factory.mktemp("local-state"))
    yield b
    b.cleanup("vllm-tier")


def deployed(backend: LocalBackend, plan: Plan, arm: str) -> Iterator[Deployment]:
    """Deploy an arm, wait until ready, and always tear it down."""
    dep = backend.deploy(plan, arm, RunKey("vllm-tier", arm, 0))
    try:
        backend.ready(dep, READY_DEADLINE_S)
        yield dep
    finally:
        backend.teardown(dep)
