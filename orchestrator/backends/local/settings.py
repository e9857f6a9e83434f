"""How the local backend starts engines: interpreter, router binary, model folder, CPU sizing.

``LocalSettings.from_env`` finds the vLLM environment of ``make vllm`` (or ORCH_VLLM_PYTHON),
the vllm-router executable and, for SGLang arms, an SGLang environment (ORCH_SGLANG_PYTHON:
an interpreter with sglang and sglang-router installed); the settings themselves are plain
data the rendering reads.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

from pydantic import Field

from orchestrator.backends.vllm_env import TINY_MODEL_ID, VllmEnv
from orchestrator.plan.base import StrictModel


class LocalSettings(StrictModel):
    """How the local backend starts engines; defaults fit the CPU environment of ``make vllm``."""

    python: str = Field(description="Interpreter of the vLLM environment (runs the engines).")
    router: str = Field(description="The vllm-router executable.")
    sglang_python: str | None = Field(
        default=None,
        description="Interpreter of an SGLang environment (sglang and sglang-router installed): runs "
        "SGLang arms' engines and their router. None: SGLang arms cannot run here.",
    )
    model_path: str | None = Field(
        default=None,
        description="Weights folder or hub id served instead of the plan's model.hf_id "
        f"(the plan's id {TINY_MODEL_ID!r} always means the tiny model of `make vllm`).",
    )
    tiny_model_dir: str | None = Field(default=None, description="Folder of the tiny model.")
    cpu_kvcache_gib: int = Field(default=1, ge=1, description="CPU: KV cache size, GiB per engine.")
    cpu_max_model_len: int = Field(
        default=1024, ge=16, description="CPU: context length when the plan sets none."
    )
    cpu_reserved: int = Field(
        default=1, ge=0,
        description="CPU: cores kept free of engines for the load generator (and router); the "
        "engines' whole process trees are pinned to the others with taskset. 0: no pinning.",
    )
    router_startup_s: int = Field(
        default=600, ge=1, description="How long the router waits for its workers to answer."
    )
    stop_grace_s: float = Field(
        default=15.0, gt=0, description="Teardown: seconds between SIGTERM and SIGKILL."
    )
    check_version: bool = Field(
        default=True, description="Refuse an arm whose engine.version differs from the installed vLLM."
    )

    @classmethod
    def from_env(cls, env: VllmEnv | None = None, **over: Any) -> LocalSettings:
        """Settings pointing at the vLLM environment built by ``make vllm`` (or ORCH_VLLM_PYTHON)."""
        env = env or VllmEnv.default()
        python = os.environ.get("ORCH_VLLM_PYTHON") or str(env.python)
        router = _router_binary() or "vllm-router"
        over.setdefault("sglang_python", os.environ.get("ORCH_SGLANG_PYTHON") or None)
        return cls(python=python, router=router, tiny_model_dir=str(env.model_dir), **over)

    def python_for(self, kind: str) -> str | None:
        """The interpreter that runs engine ``kind`` (None: no such environment is set)."""
        return {"vllm": self.python, "sglang": self.sglang_python}.get(kind)


def _router_binary() -> str | None:
    beside = Path(sys.executable).parent / "vllm-router"
    if beside.exists():
        return str(beside)
    return shutil.which("vllm-router")
