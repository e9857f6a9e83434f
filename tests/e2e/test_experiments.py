"""Whole experiments in virtual time (the real executor, store, guards and verdicts over the
simulated engine's records): an obvious win is accepted, A/A is not, everything is stored,
history and the verdict gate read it back, the generator's ceiling bounds a capacity. No socket
is opened (``no_sockets``): the same plan and seed give the same records every time."""

from __future__ import annotations

import json
import math

import pytest

from tests.e2e.helpers import orch_here, run_virtual, small_plan

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("no_sockets")]


def test_two_replicas_beat_one_and_the_gate_says_so(tmp_path, monkeypatch, capsys) -> None:
    env = {"ORCH_DATABASE_URL": f"sqlite:///{tmp_path / 'orch.sqlite'}",
           "ORCH_STATE_DIR": str(tmp_path / "state")}

    def orch(*args: str) -> tuple[int, str, str]:
        return orch_here(*args, env=env, monkeypatch=monkeypatch, capsys=capsys)

    code, out, err = orch("run", "tests/e2e/plans/two-vs-one.yaml", "--backend", "virtual", "--json")
    assert code == 0, err[-3000:]
    doc = json.loads(out)
    (v,) = doc["verdicts"]
    assert v["verdict"] == "ACCEPT", (doc, err[-3000:])
    assert v["estimate"] > 1.3 and v["lower"] > 1.3
    name = doc["experiment"]["name"]

    code, out, _ = orch("verdict", name, "--gate", "--json")
    assert code == 0, out
    assert json.loads(out)["verdicts"][0]["verdict"] == "ACCEPT"

    code, out, err = orch("capacity", "--model", "qwen3-8b", "--gpu", "H100-PCIe", "--json")
    assert code == 0, err
    labels = sorted(row["label"] for row in json.loads(out)["rows"])
    assert len(labels) == 2 and any("1x" in s for s in labels) and any("2x" in s for s in labels), labels

    code, out, _ = orch("status", name, "--json")
    runs = json.loads(out)["experiments"][0]["runs"]
    valid = {(run["block"], run["arm"]) for run in runs if run["valid"]}
    assert len(valid) == 8 and sum(1 for run in runs if run["valid"]) == 8
    # A retried run is stored with its reason (a short virtual point can fail steady state).
    assert all(run["reason"] for run in runs if not run["valid"]), runs


def test_the_same_plan_gives_the_same_records(store, state, tmp_path) -> None:
    """Virtual time is deterministic: two experiments of one plan store identical requests."""
    plan = small_plan(name="e2e-same", design={"blocks": 2, "order": "ABBA", "seed": 3},
                      sim={"noise": 0.05})
    first = run_virtual(store, plan, state)
    again = run_virtual(store, plan, state)  # the first is done: a second experiment of the plan
    assert again.experiment_id != first.experiment_id

    def records(exp_id: int) -> list[list[tuple]]:
        out = []
        for r in sorted(store.runs(exp_id), key=lambda r: (r.block, r.position, r.attempt)):
            for _, p in store.points(r.id).iterrows():
                out.append([(q.request_id, q.scheduled_s, q.first_token_s, q.last_token_s, q.output_tokens,
                             q.status) for q in store.requests(int(p.id))])
        return out

    a, b = records(first.experiment_id), records(again.experiment_id)
    assert a and a == b
    assert [x.judgement.estimate for x in first.bars] == [x.judgement.estimate for x in again.bars]


def test_a_a_does_not_accept_a_ten_percent_win(store, state, tmp_path, monkeypatch, capsys) -> None:
    plan = small_plan(
        name="e2e-a-a", design={"blocks": 3, "order": "ABBA", "seed": 9},
        bars=[{"id": "no-win", "metric": "capacity", "class": "standard", "at_least": 1.10,
               "confidence": 0.95}],
        sim={"noise": 0.03},
    )
    out = run_virtual(store, plan, state)
    assert out.complete
    (bar,) = out.bars
    assert bar.judgement.verdict != "ACCEPT", bar.judgement
    # The CI gate's exit code follows the verdict (3 rejected, 4 inconclusive).
    code, stdout, err = orch_here("verdict", out.experiment_name, "--gate", "--json",
                                  env={"ORCH_DATABASE_URL": f"sqlite:///{tmp_path / 'orch.sqlite'}"},
                                  monkeypatch=monkeypatch, capsys=capsys)
    assert code == {"REJECT": 3, "INCONCLUSIVE": 4}[bar.judgement.verdict], (code, stdout[-2000:], err[-2000:])
    assert json.loads(stdout)["verdicts"][0]["verdict"] == bar.judgement.verdict
    # Every record of every point is stored.
    for r in store.runs(out.experiment_id):
        for _, p in store.points(r.id).iterrows():
            assert len(store.requests(int(p.id))) == int(p.n_scheduled)


def test_back_to_back_ignores_what_the_plan_registers_as_different(store, state) -> None:
    plan = small_plan(name="e2e-h100-vs-h200", arms={
        "A": {"gpu": "H100-PCIe", "layout": "colocated", "replicas": 1},
        "B": {"gpu": "H200", "layout": "colocated", "replicas": 1},
    })
    out = run_virtual(store, plan, state)
    runs = [r for r in store.runs(out.experiment_id) if r.valid]
    assert {r.arm for r in runs} == {"A", "B"}
    b2b = [g for r in runs for g in store.guard_results(r.id) if g.name == "back_to_back"]
    assert b2b and all(g.passed for g in b2b), b2b
    assert {r.fingerprint["gpu_type"] for r in runs} == {"H100-PCIe", "H200"}


def test_a_capacity_at_the_generators_ceiling_is_a_bound_not_a_point(store, state, tmp_path,
                                                                     monkeypatch, capsys) -> None:
    """Issue 17: the generator's ceiling caps the search instead of voiding the run; a capacity
    that passes there is stored censored at_ceiling (no upper bound), and the verdict judges the
    block as an interval: both arms at the ceiling say nothing about B/A, never "1"."""
    plan = small_plan(
        name="e2e-ceiling", design={"blocks": 2, "order": "ABBA", "seed": 11},
        bars=[{"id": "win", "metric": "capacity", "class": "standard", "at_least": 1.05, "confidence": 0.95}],
    )
    out = run_virtual(store, plan, state, generator_ceiling=1.5)
    runs = store.runs(out.experiment_id)
    assert out.complete and len(runs) == 4 and all(r.valid for r in runs), [(r.arm, r.invalid_reason) for r in runs]
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
    code, stdout, err = orch_here("verdict", out.experiment_name, "--json", env=env, monkeypatch=monkeypatch,
                                  capsys=capsys)
    assert code == 0, err[-2000:]
    (v,) = json.loads(stdout)["verdicts"]
    assert v["verdict"] == "INCONCLUSIVE" and v["label"] == j.label and "one-sided 95% bound" in v["label"]
    assert v["blocks"] == 2 and v["blocks_used"] == [0, 1] and v["dropped"] == []
    assert [c["block"] for c in v["censored"]] == [0, 1] and "ceiling" in v["censored"][0]["why"]
    _, text, _ = orch_here("verdict", out.experiment_name, "--details", env=env, monkeypatch=monkeypatch,
                           capsys=capsys)
    assert f"interval: {j.label}" in text and "censored block 1:" in text and "blocks used: 0, 1" in text
    _, text, _ = orch_here("verdict", out.experiment_name, env=env, monkeypatch=monkeypatch, capsys=capsys)
    assert "2 of 2 blocks censored: A at the load generator's ceiling" in text and "censored block" not in text


def test_a_bar_rate_above_the_generators_ceiling_voids_the_run_with_its_reason(store, state) -> None:
    plan = small_plan(
        name="e2e-bar-above-ceiling", design={"blocks": 1, "order": "ABBA", "seed": 12, "max_retries": 0},
        bars=[{"id": "at-2", "metric": "goodput_at", "rate": 2.0, "class": "standard", "at_least": 1.05,
               "confidence": 0.95}],
    )
    out = run_virtual(store, plan, state, generator_ceiling=1.5)
    runs = store.runs(out.experiment_id)
    assert runs and not any(r.valid for r in runs)
    assert all("bar rate 2 req/s is above the generator's calibrated ceiling 1.5 req/s" in (r.invalid_reason or "")
               for r in runs), [r.invalid_reason for r in runs]
    (bar,) = out.bars
    assert bar.judgement.verdict == "INCONCLUSIVE" and not out.complete
    assert "no valid run" in bar.dropped[0] and "above the generator's calibrated ceiling" in bar.dropped[0]
