"""Whole experiments on the sim backend: an obvious win is accepted, A/A is not, everything is
stored, history and the verdict gate read it back."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.e2e.helpers import ROOT, run_in_process, small_plan

pytestmark = pytest.mark.timeout(900)


def orch(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, **env}, timeout=900)


def test_two_replicas_beat_one_and_the_gate_says_so(tmp_path) -> None:
    env = {"ORCH_DATABASE_URL": f"sqlite:///{tmp_path / 'orch.sqlite'}",
           "ORCH_STATE_DIR": str(tmp_path / "state"), "ORCH_SKIP_CALIBRATION": "1"}
    r = orch("run", "tests/e2e/plans/two-vs-one.yaml", "--json", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    (v,) = doc["verdicts"]
    assert v["verdict"] == "ACCEPT", (doc, r.stderr[-3000:])
    assert v["estimate"] > 1.3 and v["lower"] > 1.3
    name = doc["experiment"]["name"]

    gate = orch("verdict", name, "--gate", "--json", env=env)
    assert gate.returncode == 0, gate.stdout
    assert json.loads(gate.stdout)["verdicts"][0]["verdict"] == "ACCEPT"

    cap = orch("capacity", "--model", "qwen3-8b", "--gpu", "H100-PCIe", "--json", env=env)
    assert cap.returncode == 0, cap.stderr
    rows = json.loads(cap.stdout)
    labels = sorted(row["label"] for row in rows["rows"])
    assert len(labels) == 2 and any("1x" in s for s in labels) and any("2x" in s for s in labels), labels

    status = orch("status", name, "--json", env=env)
    runs = json.loads(status.stdout)["experiments"][0]["runs"]
    assert sum(1 for run in runs if run["valid"]) == 4


def test_a_a_does_not_accept_a_ten_percent_win(store, state, tmp_path) -> None:
    plan = small_plan(
        name="e2e-a-a", design={"blocks": 3, "order": "ABBA", "seed": 9, "max_retries": 2},
        bars=[{"id": "no-win", "metric": "capacity", "class": "standard", "at_least": 1.10,
               "confidence": 0.95}],
    )
    out = run_in_process(store, plan, state)
    (bar,) = out.bars
    assert bar.judgement.verdict != "ACCEPT", bar.judgement
    # The CI gate's exit code follows the verdict (3 rejected, 4 inconclusive, 5 incomplete).
    gate = orch("verdict", out.experiment_name, "--gate", "--json",
                env={"ORCH_DATABASE_URL": f"sqlite:///{tmp_path / 'orch.sqlite'}"})
    expected = 5 if not out.complete else {"REJECT": 3, "INCONCLUSIVE": 4}[bar.judgement.verdict]
    assert gate.returncode == expected, (gate.returncode, gate.stdout[-2000:], gate.stderr[-2000:])
    assert json.loads(gate.stdout)["verdicts"][0]["verdict"] == bar.judgement.verdict
    # Every record of every point is stored.
    for r in store.runs(out.experiment_id):
        for _, p in store.points(r.id).iterrows():
            assert len(store.requests(int(p.id))) == int(p.n_scheduled)


def test_back_to_back_ignores_what_the_plan_registers_as_different(store, state) -> None:
    plan = small_plan(name="e2e-h100-vs-h200", arms={
        "A": {"gpu": "H100-PCIe", "layout": "colocated", "replicas": 1},
        "B": {"gpu": "H200", "layout": "colocated", "replicas": 1},
    })
    out = run_in_process(store, plan, state)
    runs = [r for r in store.runs(out.experiment_id) if r.valid]
    assert {r.arm for r in runs} == {"A", "B"}
    b2b = [g for r in runs for g in store.guard_results(r.id) if g.name == "back_to_back"]
    assert b2b and all(g.passed for g in b2b), b2b
    assert {r.fingerprint["gpu_type"] for r in runs} == {"H100-PCIe", "H200"}
