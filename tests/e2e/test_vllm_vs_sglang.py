"""Two engines in one plan, end to end as a user runs it (issue 28, the adapter's proof):
`orch plan validate`, `orch plan simulate` and `orch run examples/vllm-vs-sglang.yaml` on the sim
backend, arm A on vLLM and arm B on SGLang. Each arm's simulated workers speak its engine (B's
SGLang's metric names and endpoints: tests/integration/test_sim_server_sglang.py); A runs
behind vllm-router, B behind sglang_router where it is installed in this interpreter, else
the whole-arm sim server (said once). Real time: the test asserts what a loaded machine cannot
change (every block's runs of both arms stored, the bar judged from its pair, each arm's engine
in its fingerprint, no vLLM series from the SGLang arm), never that a run passed its guards."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.plan import load_plan_file
from orchestrator.store import Store
from tests.e2e.helpers import ROOT

pytestmark = pytest.mark.timeout(420)

PLAN = "examples/vllm-vs-sglang.yaml"


def _orch(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=timeout)


def test_vllm_against_sglang_runs_from_the_plan_file(tmp_path: Path) -> None:
    plan = load_plan_file(ROOT / PLAN)
    assert (plan.arm("A").engine.kind, plan.arm("B").engine.kind) == ("vllm", "sglang")
    db = tmp_path / "orch.sqlite"
    env = {**os.environ, "ORCH_DATABASE_URL": f"sqlite:///{db}", "ORCH_STATE_DIR": str(tmp_path / "state"),
           "ORCH_CACHE_DIR": str(tmp_path / "cache"), "ORCH_SKIP_CALIBRATION": "1"}

    valid = _orch("plan", "validate", PLAN, env=env)
    assert valid.returncode == 0 and "valid (vllm-vs-sglang" in valid.stdout, valid.stdout + valid.stderr
    sim = _orch("plan", "simulate", PLAN, env=env, timeout=120)
    assert sim.returncode == 0, sim.stderr[-2000:]
    assert "arm A (colocated, 1 GPU)" in sim.stdout and "arm B (colocated, 1 GPU)" in sim.stdout
    assert "bar sglang-holds-capacity: predicted" in sim.stdout

    r = _orch("run", PLAN, "--json", env=env, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    doc = json.loads(r.stdout)
    runs = doc["runs"]
    assert {(x["block"], x["arm"]) for x in runs} == {(b, a) for b in range(2) for a in "AB"}
    (verdict,) = doc["verdicts"]
    assert verdict["bar"] == "sglang-holds-capacity" and verdict["compare"] == "B/A"
    assert verdict["verdict"] in ("ACCEPT", "REJECT", "INCONCLUSIVE")
    has_router = importlib.util.find_spec("sglang_router") is not None
    assert ("sglang_router is not installed here" in r.stderr) is not has_router

    with Store.open(f"sqlite:///{db}") as store:
        (exp,) = store.list_experiments()
        stored = store.runs(exp.id)
        for x in stored:
            topology = (x.fingerprint or {}).get("topology", "")
            if x.arm == "A":
                assert topology.startswith(("vllm-router", "whole-arm")), topology
            else:
                assert topology.startswith("sglang_router" if has_router else "whole-arm"), topology
            names = set(store.metric_samples(x.id)["name"])
            if x.arm == "B":  # SGLang's servers export none of vLLM's series; the run keeps SGLang's
                assert not any(n.startswith("vllm:") for n in names), sorted(names)[:5]
                if len(store.points(x.id)):
                    assert any(n.startswith("sglang:") for n in names), sorted(names)[:5]
            elif x.valid:
                assert any(n.startswith("vllm:") for n in names)
