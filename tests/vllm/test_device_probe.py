"""`orch device probe --tiny` on this machine's CPU with the vLLM venv's torch (the main venv has
none), `orch device fit`, then `orch plan simulate --profile`: the prediction changes with the
profile (issue 21)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.backends.vllm_env import VllmEnv
from tests.vllm.conftest import ROOT, tiny_plan

pytestmark = pytest.mark.timeout(180)


def orch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=ROOT, env=dict(os.environ),
                          capture_output=True, text=True, timeout=100)


def test_probe_fit_and_simulate_with_the_profile(tmp_path: Path) -> None:
    probe = tmp_path / "probe.json"
    r = orch("device", "probe", "--tiny", "--python", str(VllmEnv.default().python), "--out", str(probe))
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(probe.read_text())
    assert doc["device"]["type"] == "cpu" and doc["shape"]["name"] == "tiny-llama"
    assert doc["weights_stream_bytes_s"] > 0 and doc["kv_read"] and doc["gemm"] and doc["steps"]

    profile = tmp_path / "cpu.profile.json"
    r = orch("device", "fit", str(probe), "--gpu", "H200", "--out", str(profile), "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    fitted = json.loads(profile.read_text())
    assert fitted["gpu"] == "H200" and fitted["kv_cache_bytes"] == 2**30

    plan = tiny_plan({"A": {"layout": "colocated", "replicas": 1}, "B": {"layout": "colocated", "replicas": 2}})
    data = plan.model_dump(mode="json", by_alias=True, exclude_none=True)
    # Short virtual points. The range must hold this CPU's knee well inside it: with the corrected
    # step model a 2-core CPU serves the tiny model at about 1,400 req/s (1,500 was the old top, so
    # a quiet machine's profile hit it just as the datasheet did and the two read the same), while
    # the datasheet H200 runs past 5,000 (censored above; its knee near 17,000 costs 40 s to find).
    data["search"] = {"rate": {"min": 1, "max": 5000}, "precision": 0.2, "point_s": 1, "warmup_s": 0.5,
                      "cooldown_s": 0.5, "max_points": 8, "use_prior": False}
    data["design"]["blocks"] = 2
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(yaml.safe_dump(data, sort_keys=False))

    def capacity(*extra: str) -> tuple[dict, list[str]]:
        r = orch("plan", "simulate", str(plan_file), "--json", "--replications", "20", *extra)
        assert r.returncode == 0, r.stderr[-2000:]
        doc = json.loads(r.stdout)
        return doc["arms"]["A"]["capacity"]["interactive"], doc["notes"]

    sheet, notes = capacity()
    measured, notes_p = capacity("--profile", str(profile))
    assert not any("device profile" in n for n in notes)
    assert any(n.startswith("arm A: device profile") for n in notes_p)
    # A CPU is not an H200: the profile's capacity is below the datasheet's (0.28x on an idle 2-core
    # machine). By how much depends on what else this machine runs while the probe measures, so the
    # test asks for a clear change, not a figure.
    assert measured["capacity_tok_s"] < 0.95 * sheet["capacity_tok_s"], (measured, sheet)
