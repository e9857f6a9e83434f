"""Whole experiments on the sim backend: an obvious win is accepted, A/A is not, everything is
stored, history and the verdict gate read it back."""

from __future__ import annotations

import json
import math
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
    assert sum(1 for run in runs if run["valid"]) == 8


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


def test_a_capacity_at_the_generators_ceiling_is_a_bound_not_a_point(store, state, tmp_path) -> None:
    """Issue 17: the generator's ceiling caps the search instead of voiding the run; a capacity
    that passes there is stored censored at_ceiling (no upper bound), and the verdict judges the
    block as an interval: both arms at the ceiling say nothing about B/A, never "1"."""
    plan = small_plan(
        name="e2e-ceiling", design={"blocks": 2, "order": "ABBA", "seed": 11, "max_retries": 2},
        bars=[{"id": "win", "metric": "capacity", "class": "standard", "at_least": 1.05, "confidence": 0.95}],
    )
    out = run_in_process(store, plan, state, generator_ceiling=1.5)
    runs = store.runs(out.experiment_id)
    assert out.complete and sum(1 for r in runs if r.valid) == 4, [(r.arm, r.invalid_reason) for r in runs]
    caps = store.capacities(out.experiment_id)
    caps = caps[caps.valid.astype(bool)]
    assert caps.censored.tolist() == ["at_ceiling"] * 4 and caps.converged.astype(bool).all()
    assert caps.upper.isna().all() and (caps.at_rate <= 1.5 + 1e-9).all()
    rates = [rate for r in runs for rate in store.points(r.id).offered_rate]
    assert rates and max(rates) <= 1.5 + 1e-9  # the search never asked above the ceiling

    (bar,) = out.bars
    j = bar.judgement
    assert j.verdict == "INCONCLUSIVE" and len(j.censored) == 2, j
    assert sorted(bar.censored) == [0, 1] and all("load generator's ceiling" in w for w in bar.censored.values())
    assert not math.isfinite(j.upper)  # no upper bound on B/A: the true capacities may be anywhere above

    env = {"ORCH_DATABASE_URL": f"sqlite:///{tmp_path / 'orch.sqlite'}"}
    r = orch("verdict", out.experiment_name, "--json", env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    (v,) = json.loads(r.stdout)["verdicts"]
    assert v["verdict"] == "INCONCLUSIVE" and v["label"] == j.label and "one-sided 95% bound" in v["label"]
    assert v["blocks"] == 2 and v["blocks_used"] == [0, 1] and v["dropped"] == []
    assert [c["block"] for c in v["censored"]] == [0, 1] and "ceiling" in v["censored"][0]["why"]
    text = orch("verdict", out.experiment_name, env=env).stdout
    assert f"interval: {j.label}" in text and "censored block 1:" in text and "blocks used: 0, 1" in text


def test_a_bar_rate_above_the_generators_ceiling_voids_the_run_with_its_reason(store, state) -> None:
    plan = small_plan(
        name="e2e-bar-above-ceiling", design={"blocks": 1, "order": "ABBA", "seed": 12, "max_retries": 0},
        bars=[{"id": "at-2", "metric": "goodput_at", "rate": 2.0, "class": "standard", "at_least": 1.05,
               "confidence": 0.95}],
    )
    out = run_in_process(store, plan, state, generator_ceiling=1.5)
    runs = store.runs(out.experiment_id)
    assert runs and not any(r.valid for r in runs)
    assert all("bar rate 2 req/s is above the generator's calibrated ceiling 1.5 req/s" in (r.invalid_reason or "")
               for r in runs), [r.invalid_reason for r in runs]
    (bar,) = out.bars
    assert bar.judgement.verdict == "INCONCLUSIVE" and not out.complete
    assert "no valid run" in bar.dropped[0] and "above the generator's calibrated ceiling" in bar.dropped[0]
