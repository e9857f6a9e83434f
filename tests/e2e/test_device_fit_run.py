"""`orch run` of a small experiment on the sim backend, then `orch device fit --experiment NAME
--arm A` from the vLLM metrics it stored: the fitted terms are the simulator's own (its
datasheet figures: the sim backend runs on them, not on installed profiles), and `orch plan
simulate` then runs on the installed profile (issue 21)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.plan import GPUS
from orchestrator.sim.model import BANDWIDTH_EFFICIENCY, COMPUTE_EFFICIENCY, STEP_OVERHEAD_S

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

# An MoE model on an H200: steps of 1.5-6 ms whose KV reads grow from ~0 to half the step over
# the search's loads (what tells the bandwidth from t0), prefills of 2,000 tokens that are
# compute-bound (the GEMM rate) and cheap enough to leave decoding the engine's main work.
# Three points below the knee (12.6, 22.5 and 30 req/s); about 35 s of real time.
PLAN = {
    "name": "e2e-device-fit", "model": "qwen3-30b-a3b",
    "arms": {arm: {"gpu": "H200", "layout": "colocated", "replicas": 1,
                   "engine": {"max_num_seqs": 128, "max_num_batched_tokens": 4096}} for arm in "AB"},
    "router": {"policy": "round_robin"},
    "workload": {"arrival": {"process": "poisson"},
                 "prompts": {"input_tokens": {"mean": 2000, "dist": "fixed"}, "conversations": 5000},
                 "output_tokens": 128},
    "classes": ["standard"],
    "search": {"rate": {"min": 4, "max": 40}, "precision": 0.25, "point_s": 2, "warmup_s": 0.5,
               "cooldown_s": 0.5, "max_points": 3, "use_prior": False},
    "design": {"blocks": 1, "order": "ABBA", "seed": 5, "max_retries": 1},
    "bars": [{"id": "same", "metric": "capacity", "class": "standard", "at_least": 1.3, "confidence": 0.9}],
    "guards": {"max_send_lag_p99_ms": 50},
    "backend": "sim",
}
H200 = GPUS["H200"]
# Tolerances: the bandwidth and GEMM rate within 10% (measured on a 2-core machine: -5% and
# +4%); t0 within 0.25 ms of the truth (0.06 ms; a step is 2-6 ms, so t0 is the least
# determined term: the fit gave ~0).
TRUTH = {"bandwidth_bytes_s": H200.bandwidth_bytes_s * BANDWIDTH_EFFICIENCY,
         "flops": H200.bf16_flops * COMPUTE_EFFICIENCY}


def test_a_profile_fitted_from_a_sim_runs_metrics_is_the_simulators_device(tmp_path: Path) -> None:
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(yaml.safe_dump(PLAN, sort_keys=False))
    env = {**os.environ, "ORCH_DATABASE_URL": f"sqlite:///{tmp_path / 'orch.sqlite'}",
           "ORCH_STATE_DIR": str(tmp_path / "state"), "ORCH_CACHE_DIR": str(tmp_path / "cache"),
           "ORCH_PROFILES_DIR": str(tmp_path / "profiles"), "ORCH_SKIP_CALIBRATION": "1"}

    def orch(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=tmp_path, env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=200)

    ran = orch("run", str(plan_file), "--json", "--allow-low-power")
    assert ran.returncode == 0, ran.stderr[-3000:]
    name = json.loads(ran.stdout)["experiment"]["name"]

    r = orch("device", "fit", "--experiment", name, "--arm", "A", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["bandwidth_bytes_s"] == pytest.approx(TRUTH["bandwidth_bytes_s"], rel=0.10)
    assert doc["flops"] == pytest.approx(TRUTH["flops"], rel=0.10) and not doc["fit"]["notes"]
    assert abs(doc["step_overhead_s"] - STEP_OVERHEAD_S) < 0.25e-3
    assert doc["gpu"] == "H200" and doc["fingerprint"] == "simulated H200"
    assert len(doc["fit"]["points"]) == 3
    assert all(abs(p["tpot_residual"]) < 0.08 for p in doc["fit"]["points"])

    # plan simulate on a finer search (the same arms) runs on the installed profile; the device
    # it describes is the simulator's own, so the capacity it predicts is the datasheet's within
    # the fit's few percent (tests/integration/test_device_fit_metrics.py installs a device unlike
    # the datasheet and sees the prediction move).
    fine = copy.deepcopy(PLAN)
    fine["search"].update(precision=0.02, max_points=10)
    fine_file = tmp_path / "fine.yaml"
    fine_file.write_text(yaml.safe_dump(fine, sort_keys=False))

    def predicted() -> tuple[float, list[str]]:
        s = orch("plan", "simulate", str(fine_file), "--json", "--replications", "3")
        assert s.returncode == 0, s.stderr[-2000:]
        out = json.loads(s.stdout)
        return out["arms"]["A"]["capacity"]["standard"]["capacity_tok_s"], out["notes"]

    sheet, notes = predicted()
    assert orch("device", "fit", "--experiment", name, "--arm", "A", "--install").returncode == 0
    assert (tmp_path / "profiles" / "H200.json").exists()
    measured, notes_p = predicted()
    assert not any("device profile" in n for n in notes)
    assert any(n.startswith(f"arm A: device profile {name} arm A") for n in notes_p)
    assert measured == pytest.approx(sheet, rel=0.05)
