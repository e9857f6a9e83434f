"""A sweep of 3 x 2 levels end to end as a user runs it (`orch run examples/sweep.yaml --backend
virtual`: the simulated engine in virtual time, no socket): the six arms run in every block, the
verdict is stored with the sweep's main effects and interactions and their intervals, and `orch
verdict` prints them. A wrong sweep is one line per problem with its field path, exit 1."""

from __future__ import annotations

import copy
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

PLAN = ROOT / "examples" / "sweep.yaml"


def test_a_3x2_sweep_runs_to_a_stored_verdict_with_effects_and_intervals(orch, tmp_path) -> None:
    plan = load_plan_file(PLAN)
    r = orch("run", str(PLAN), "--backend", "virtual", "--json", "--yes")
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert {(x["block"], x["arm"]) for x in doc["runs"]} == {(b, a) for b in range(6) for a in "ABCDEF"}
    sweep = doc["sweep"]
    assert sweep["arms"]["A"] == "mns4-replicas1" and sweep["arms"]["F"] == "mns64-replicas2"
    effects = {(e["kind"], tuple(e["levels"])): e for e in sweep["effects"]}
    # Each factor's levels against its first, and the 2 x 1 interactions of the full factorial.
    assert set(effects) == {("main", ("16",)), ("main", ("64",)), ("main", ("2",)),
                            ("interaction", ("16", "2")), ("interaction", ("64", "2"))}
    for e in effects.values():
        assert e["class"] == "standard" and e["confidence"] == 0.9
        assert e["blocks"] + len(sweep["left_out"]) == 6 and e["blocks"] >= 2
        assert 0 < e["lower"] < e["ratio"] < e["upper"], e
    # Two replicas: the simulated engine serves about twice the rate (what the model says).
    # (the lower end also carries the search's 2% resolution)
    assert 1.7 < effects[("main", ("2",))]["ratio"] < 2.4 and effects[("main", ("2",))]["lower"] > 1.4

    # What is stored: every bar's verdict carries the effects, and they are what the stored
    # capacities give when judged again.
    with Store.open(r.env["ORCH_DATABASE_URL"]) as store:
        exp_id = doc["experiment"]["id"]
        (stored,) = store.verdicts(exp_id)
        assert stored.evidence["sweep"] == sweep
        again = experiment_effects(store, exp_id, plan)
        assert again is not None
        for e, stored_e in zip(again.effects, sweep["effects"], strict=True):
            assert math.isclose(e.ratio, stored_e["ratio"]) and math.isclose(e.lower or 0, stored_e["lower"])
        page = html.unescape(write_report(store, exp_id, tmp_path / "report").read_text())
    for e in sweep["effects"]:  # the report's table: every effect with its interval
        assert f"<td>{e['label']}</td>" in page and f"{e['lower']:.3g}..{e['upper']:.3g} (90% two-sided)" in page

    text = orch("verdict", doc["experiment"]["name"])
    assert text.returncode == 0, text.stderr
    e = effects[("main", ("2",))]
    assert (f"  main effect [standard] replicas 2 vs 1: x{e['ratio']:.3g}, 90% interval "
            f"{e['lower']:.3g}..{e['upper']:.3g}, {e['blocks']} block(s)") in text.stdout, text.stdout
    assert "interaction [standard] engine.max_num_seqs 64 vs 4 x replicas 2 vs 1: x" in text.stdout

    # Never read on trust: --verify judges the effects again from the stored capacities, and a
    # verdict stored with other effects (a row the runtime role may append) is named, exit 6.
    assert orch("verdict", doc["experiment"]["name"], "--verify").returncode == 0
    # Each end carries the search's resolution (a cell's search error does not average away), and
    # effects stored before it (no "resolution") are judged again as they were made.
    assert sweep["resolution"] == pytest.approx(math.log1p(plan.search.precision))
    with Store.open(r.env["ORCH_DATABASE_URL"]) as store:
        older = experiment_effects(store, exp_id, plan, resolution=0.0)
        assert older is not None and "resolution" not in older.to_dict()
        narrower = {(e.kind, e.levels): e for e in older.effects}
        for key, e in effects.items():
            assert narrower[key].lower > e["lower"] and narrower[key].upper < e["upper"]
        store.record_verdict(exp_id, stored.registration_id, stored.bar_id, stored.verdict, stored.estimate,
                             stored.lower, stored.upper, stored.blocks, label=stored.label, note=stored.note,
                             evidence={**stored.evidence, "sweep": older.to_dict()})
    assert orch("verdict", doc["experiment"]["name"], "--verify").returncode == 0
    with Store.open(r.env["ORCH_DATABASE_URL"]) as store:
        forged = copy.deepcopy(stored.evidence)
        forged["sweep"]["effects"][2]["ratio"] *= 1.5
        store.record_verdict(exp_id, stored.registration_id, stored.bar_id, stored.verdict, stored.estimate,
                             stored.lower, stored.upper, stored.blocks, label=stored.label, note=stored.note,
                             evidence=forged)
    bad = orch("verdict", doc["experiment"]["name"], "--verify")
    assert bad.returncode == 6 and (f"bar {stored.bar_id}: the sweep's effects stored with its verdict are not what "
                                    "its records give") in bad.stderr, bad.stderr


def test_the_dry_run_prices_the_sweep_before_it_runs(orch) -> None:
    r = orch("plan", "simulate", str(PLAN), "--replications", "5", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    sw = doc["sweep"]
    assert sw["design"] == "full design of 3 x 2 levels (engine.max_num_seqs x replicas): 6 arms"
    assert list(sw["arms"]) == list("ABCDEF") and sw["blocks"] == 6
    assert sw["gpus"] == {"A": 1, "B": 2, "C": 1, "D": 2, "E": 1, "F": 2}
    assert math.isclose(sw["gpu_hours"], sum(doc["gpu_hours"]["per_arm"].values()))
    text = orch("plan", "simulate", str(PLAN), "--replications", "5")
    assert f"sweep: full design of 3 x 2 levels (engine.max_num_seqs x replicas): 6 arms x 6 blocks: " \
           f"{sw['gpu_hours']:.2f} GPU-hours before it runs (A mns4-replicas1, B mns4-replicas2" in text.stdout


def test_a_wrong_sweep_is_one_line_per_problem_with_its_path(orch, tmp_path) -> None:
    data = yaml.safe_load(PLAN.read_text())
    data["sweep"]["factors"] = {"engine.max_num_sequences": [4, 8], "replicas": [1, 0]}
    data["search"]["point_s"] = -1
    bad = tmp_path / "bad-sweep.yaml"
    bad.write_text(yaml.safe_dump(data, sort_keys=False))
    r = orch("plan", "validate", str(bad))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert any(x.strip().startswith("sweep.factors.engine.max_num_sequences: 'max_num_sequences' is not a field")
               for x in lines), r.stderr
    assert any(x.strip().startswith("search.point_s:") for x in lines), r.stderr
    # The bar names arms of the expansion: no problem about them while the sweep itself is wrong.
    assert not any("bars.0.compare" in x for x in lines), r.stderr


def test_plan_validate_lists_the_sweeps_arms_by_letter(orch) -> None:
    r = orch("plan", "validate", str(PLAN))
    assert r.returncode == 0, r.stderr
    assert ("  sweep: full design of 3 x 2 levels (engine.max_num_seqs x replicas): 6 arms: A mns4-replicas1, "
            "B mns4-replicas2, C mns16-replicas1, D mns16-replicas2, E mns64-replicas1, F mns64-replicas2") in r.stdout
    doc = json.loads(orch("plan", "validate", str(PLAN), "--json").stdout)
    assert doc["plans"][0]["sweep"]["arms"]["D"] == "mns16-replicas2"
