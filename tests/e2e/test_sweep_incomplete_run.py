"""A sweep in incomplete blocks end to end as a user runs it (`orch run PLAN --backend virtual`:
the simulated engine in virtual time, no socket): examples/sweep.yaml's six arms at most three
per block (`sweep.max_arms_per_block: 3`) over 10 blocks. Each block runs A and two others and
nothing else; the verdict is stored with the sweep's main effects and interactions from the
intrablock fit, with intervals, and names the design; the dry run prices the 30 runs, not 60."""

from __future__ import annotations

import html
import json
import math

import pytest
import yaml

from orchestrator.control.effects import experiment_effects
from orchestrator.plan import load_plan_file
from orchestrator.report import write_report
from orchestrator.store import Store
from tests.e2e.helpers import ROOT

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("no_sockets")]

DESIGN = "incomplete blocks: 3 arms of 6 per block, baseline in every block"


def write_plan(tmp_path, blocks: int = 10) -> object:
    data = yaml.safe_load((ROOT / "examples" / "sweep.yaml").read_text())
    data["name"] = "sweep-incomplete"
    data["sweep"]["max_arms_per_block"] = 3
    data["design"]["blocks"] = blocks
    # F/E share 2 of the 10 blocks; F/A share 4: each bar takes its ratio where both ran.
    data["bars"].append({"id": "f-over-a", "metric": "capacity", "class": "standard", "compare": "F/A",
                         "at_least": 1.3, "confidence": 0.9})
    path = tmp_path / f"sweep-incomplete-{blocks}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_an_incomplete_sweep_runs_only_each_blocks_arms_to_a_verdict_with_effects(orch, tmp_path) -> None:
    path = write_plan(tmp_path)
    plan = load_plan_file(path)
    r = orch("run", str(path), "--backend", "virtual", "--json", "--yes")
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    planned = {(b, a) for b, held in enumerate(plan.block_arms()) for a in held}
    assert len(planned) == 30 and {(x["block"], x["arm"]) for x in doc["runs"]} == planned
    # Complete: every planned run counts, each block judged back to back over its own three arms.
    assert doc["experiment"]["complete"] is True and doc["gate_exit_code"] in (0, 3, 4)
    sweep = doc["sweep"]
    assert sweep["design"] == DESIGN and sweep["method"].startswith("intrablock least squares")
    effects = {(e["kind"], tuple(e["levels"])): e for e in sweep["effects"]}
    assert set(effects) == {("main", ("16",)), ("main", ("64",)), ("main", ("2",)),
                            ("interaction", ("16", "2")), ("interaction", ("64", "2"))}
    for e in effects.values():
        assert e["class"] == "standard" and e["confidence"] == 0.9 and e["blocks"] >= 5
        assert 0 < e["lower"] < e["ratio"] < e["upper"], e
    assert effects[("main", ("2",))]["lower"] > 1.5  # two replicas serve about twice the rate

    bars = {v["bar"]: v for v in doc["verdicts"]}
    with Store.open(r.env["ORCH_DATABASE_URL"]) as store:
        exp_id = doc["experiment"]["id"]
        stored = {v.bar_id: v for v in store.verdicts(exp_id)}
        assert set(stored) == {"two-replicas-at-64", "f-over-a"}
        for v in stored.values():
            assert v.evidence["sweep"] == sweep
        for run in store.runs(exp_id):
            assert [g.passed for g in store.guard_results(run.id) if g.name == "back_to_back"] == [True], run
        # Each bar rests on the blocks that ran both of its arms, and its note says so.
        assert set(stored["two-replicas-at-64"].evidence["blocks_used"]) <= {4, 9}
        assert set(stored["f-over-a"].evidence["blocks_used"]) <= {2, 4, 7, 9}
        assert "F and E run together in 2 of 10 blocks" in stored["two-replicas-at-64"].note
        assert DESIGN in (bars["f-over-a"]["note"] or "")
        again = experiment_effects(store, exp_id, plan)
        assert again is not None and again.to_dict()["design"] == DESIGN
        for e, stored_e in zip(again.effects, sweep["effects"], strict=True):
            assert math.isclose(e.ratio, stored_e["ratio"]) and math.isclose(e.lower or 0, stored_e["lower"])
        page = html.unescape(write_report(store, exp_id, tmp_path / "report").read_text())
    assert f"Design: {DESIGN}; effects by intrablock least squares" in page
    for e in sweep["effects"]:
        assert f"<td>{e['label']}</td>" in page and f"{e['lower']:.3g}..{e['upper']:.3g} (90% two-sided)" in page

    text = orch("verdict", doc["experiment"]["name"])
    assert text.returncode == 0, text.stderr
    assert f"sweep design: {DESIGN}; effects by intrablock least squares" in text.stdout, text.stdout
    e = effects[("main", ("2",))]
    assert (f"  main effect [standard] replicas 2 vs 1: x{e['ratio']:.3g}, 90% interval "
            f"{e['lower']:.3g}..{e['upper']:.3g}, {e['blocks']} block(s)") in text.stdout, text.stdout
    assert orch("verdict", doc["experiment"]["name"], "--verify").returncode == 0
    listed = json.loads(orch("status", "--json").stdout)["experiments"][0]
    assert listed["runs_planned"] == 30


def test_the_dry_run_prices_the_runs_an_incomplete_design_holds(orch, tmp_path) -> None:
    path = write_plan(tmp_path)
    r = orch("plan", "simulate", str(path), "--replications", "5", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    sw = doc["sweep"]
    assert sw["per_block"] == 3 and sw["runs"] == {"A": 10, "B": 4, "C": 4, "D": 4, "E": 4, "F": 4}
    for name, arm in doc["arms"].items():  # GPU-hours: each arm's runs, not every block
        assert math.isclose(doc["gpu_hours"]["per_arm"][name], arm["gpus"] * arm["run_wall_s"] * sw["runs"][name] / 3600)
    assert math.isclose(sw["gpu_hours"], doc["gpu_hours"]["total"])
    text = orch("plan", "simulate", str(path), "--replications", "5")
    assert (f"sweep: full design of 3 x 2 levels (engine.max_num_seqs x replicas): 6 arms, {DESIGN}; 10 blocks, "
            f"30 runs: {sw['gpu_hours']:.2f} GPU-hours before it runs (A mns4-replicas1") in text.stdout, text.stdout


def test_a_block_count_that_cannot_balance_the_arms_is_one_line_with_its_path(orch, tmp_path) -> None:
    r = orch("plan", "validate", str(write_plan(tmp_path, blocks=6)))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    lines = [x.strip() for x in r.stderr.splitlines() if x.strip().startswith("design.blocks")]
    assert len(lines) == 1 and "use a multiple of 5 blocks (5, 10, 15, ...)" in lines[0], r.stderr
