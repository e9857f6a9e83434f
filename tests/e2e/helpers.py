"""Small plans and an in-process executor for the e2e tier (loopback only, bounded)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from orchestrator.backends.sim import SimBackend
from orchestrator.backends.virtual import VirtualBackend
from orchestrator.control.executor import Executor, ExecutorConfig, ExperimentOutcome
from orchestrator.control.progress import PlainProgress
from orchestrator.plan import Plan, validate_plan

ROOT = Path(__file__).resolve().parents[2]

# One replica of qwen3-8b on an H100 PCIe with 4,000-token prompts: prefill-bound near a few
# requests/s, so points stay light for a 2-core machine running servers and generator.
BASE: dict[str, Any] = {
    "name": "e2e-small",
    "model": "qwen3-8b",
    "arms": {
        "A": {"gpu": "H100-PCIe", "layout": "colocated", "replicas": 1,
              "engine": {"max_num_seqs": 32, "max_num_batched_tokens": 2048}},
        "B": {"gpu": "H100-PCIe", "layout": "colocated", "replicas": 1,
              "engine": {"max_num_seqs": 32, "max_num_batched_tokens": 2048}},
    },
    "router": {"policy": "round_robin"},
    "workload": {"arrival": {"process": "poisson"},
                 "prompts": {"input_tokens": {"mean": 4000, "dist": "lognormal", "sigma": 0.2, "max": 8000},
                             "conversations": 5000},
                 "output_tokens": 32},
    "classes": ["standard"],
    "search": {"rate": {"min": 1, "max": 32}, "precision": 0.25, "point_s": 4, "warmup_s": 1,
               "cooldown_s": 0.5, "max_points": 3, "use_prior": False},
    "design": {"blocks": 1, "order": "ABBA", "seed": 5, "max_retries": 2},
    "backend": "sim",
}


def small_plan(**changes: Any) -> Plan:
    data = copy.deepcopy(BASE)
    for key, value in changes.items():
        data[key] = value
    return validate_plan(data)


def run_in_process(store, plan: Plan, state: Path, faults=None, **config: Any) -> ExperimentOutcome:
    """The plan on the sim backend, in real time (servers, router, load generator)."""
    backend = SimBackend(state / "sim", faults=faults)
    cfg = ExecutorConfig(state_dir=state, **config)
    return Executor(store, backend, cfg, PlainProgress()).run(plan)


def run_virtual(store, plan: Plan, state: Path, faults=None, **config: Any) -> ExperimentOutcome:
    """The plan in virtual time: the real executor, store, guards and verdicts; the simulated
    engine's records on its own clock (no socket, no process, no sleep)."""
    cfg = ExecutorConfig(state_dir=state, **config)
    return Executor(store, VirtualBackend(faults=faults), cfg, PlainProgress()).run(plan)


def orch_here(*args: str, env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
              capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`orch ARGS` as a user runs it, in this process (so a virtual-time test's socket guard
    sees everything it does): (exit code, stdout, stderr)."""
    from orchestrator.cli.main import main

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    capsys.readouterr()
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err
