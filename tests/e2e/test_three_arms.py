"""A plan of three arms, end to end as a user runs it (`orch run examples/three-arms.yaml
--backend virtual`: the simulated engine in virtual time, no socket): every block runs all three
arms in the rows of a Williams design, each bar is judged from its own pair of arms, and Holm
covers all three bars."""

from __future__ import annotations

import html
import json
import re
from collections import Counter
from types import SimpleNamespace

import pytest

from orchestrator.analysis.williams import is_balanced, williams_orders
from orchestrator.plan import load_plan_file
from orchestrator.report import write_report
from orchestrator.store import Store
from tests.e2e.helpers import ROOT, orch_here

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("no_sockets")]

PLAN = ROOT / "examples" / "three-arms.yaml"


def test_three_arms_run_in_a_williams_order_and_holm_covers_every_bar(tmp_path, monkeypatch, capsys) -> None:
    plan = load_plan_file(PLAN)
    env = {"ORCH_DATABASE_URL": f"sqlite:///{tmp_path / 'orch.sqlite'}", "ORCH_STATE_DIR": str(tmp_path / "state"),
           "ORCH_CACHE_DIR": str(tmp_path / "cache")}

    def orch(*args: str, env: dict[str, str]) -> SimpleNamespace:
        code, out, err = orch_here(*args, env=env, monkeypatch=monkeypatch, capsys=capsys)
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)

    r = orch("run", str(PLAN), "--backend", "virtual", "--allow-low-power", "--json", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    runs = doc["runs"]

    # The order: every block ran A, B and C back to back, in the Williams rows of 3 arms
    # (6 rows: every arm at every position, and right after every other arm, twice). Every
    # attempt, retries included, ran at its arm's registered position in its block.
    expected = williams_orders(["A", "B", "C"], plan.design.blocks)
    assert expected == [tuple(s) for s in ("ABC", "BCA", "CAB", "CBA", "ACB", "BAC")] and is_balanced(expected)
    assert {(x["block"], x["arm"]) for x in runs} == {(b, a) for b in range(6) for a in "ABC"}
    assert all(x["position"] == expected[x["block"]].index(x["arm"]) for x in runs)
    started = sorted(runs, key=lambda x: x["id"])  # in the order they ran
    firsts = [next(x for x in started if x["block"] == b and x["arm"] == a) for b, o in enumerate(expected) for a in o]
    assert [x["id"] for x in firsts] == sorted(x["id"] for x in firsts)

    # Every bar has a verdict that names its pair. A short simulated point can fail a guard
    # (steady state near the knee) more often than its retries allow: such a block is dropped
    # from the bars of its arm, with why, and the rest still judged; most blocks count.
    verdicts = {v["bar"]: v for v in doc["verdicts"]}
    assert {b: v["compare"] for b, v in verdicts.items()} == {"two-replicas": "B/A", "h200-pair": "C/A", "h200-vs-h100": "C/B"}
    valid = {(x["block"], x["arm"]) for x in runs if x["valid"]}
    for v in verdicts.values():
        num, den = v["compare"].split("/")
        assert v["blocks_used"] == [b for b in range(6) if (b, num) in valid and (b, den) in valid]
        assert [d["block"] for d in v["dropped"]] == [b for b in range(6) if b not in v["blocks_used"]]
        assert v["label"].startswith(v["compare"] + " ")
    assert len(valid) >= 15, [(x["block"], x["arm"], x["reason"]) for x in runs if not x["valid"]]

    # Holm over all three bars (family level 90%): the bar with the smallest ACCEPT p-value is
    # tested at alpha/3, the next at alpha/2, the last at alpha - each once, whatever the pair.
    levels = {}
    for v in verdicts.values():
        m = re.search(r"Holm-adjusted over (\d) bars at family level 90%: ACCEPT tested at ([\d.]+)% \(rank (\d) of 3\)",
                      v["label"])
        assert m, v["label"]
        assert m.group(1) == "3"
        levels[int(m.group(3))] = float(m.group(2))
    assert levels == pytest.approx({1: 100 * (1 - 0.1 / 3), 2: 100 * (1 - 0.1 / 2), 3: 100 * (1 - 0.1)}, abs=0.01)

    # The verdict as the user reads it: the pair in the line, not a hard-coded B/A.
    text = orch("verdict", doc["experiment"]["name"], env=env)
    assert text.returncode == 0, text.stderr
    for bar, v in verdicts.items():
        assert f"  {bar}: {v['verdict']}  {v['compare']} capacity [standard]" in text.stdout, text.stdout

    status = json.loads(orch("status", doc["experiment"]["name"], "--json", env=env).stdout)["experiments"][0]
    assert (status["runs_valid"], status["runs_planned"]) == (len(valid), 18)

    # What the store holds: the runs in Williams order, one verdict per bar with its pair; the
    # report's bar table names each pair.
    with Store.open(env["ORCH_DATABASE_URL"]) as store:
        exp_id = doc["experiment"]["id"]
        stored = [x for x in store.runs(exp_id) if x.valid]
        assert Counter((x.block, x.arm, x.position) for x in stored) == Counter(
            (b, a, expected[b].index(a)) for b, a in valid)
        # The back-to-back guard judged each complete block's three runs together (and passed).
        whole = [b for b in range(6) if all((b, a) in valid for a in "ABC")]
        b2b = [g for x in stored for g in store.guard_results(x.id) if g.name == "back_to_back"]
        assert len(b2b) == 3 * len(whole) and all(g.passed for g in b2b) and "3 runs alike" in b2b[0].detail
        assert sorted(v.bar_id for v in store.verdicts(exp_id)) == sorted(verdicts)
        assert {v.bar_id: v.evidence["compare"] for v in store.verdicts(exp_id)} == {
            b: v["compare"] for b, v in verdicts.items()}
        index = write_report(store, exp_id, tmp_path / "report")
        caps = store.capacities(exp_id)
    _history_counts_every_valid_run(orch, env, caps)
    page = html.unescape(index.read_text())
    for pair, at_least in (("B/A", 1.2), ("C/A", 1.5), ("C/B", 1.05)):
        assert f"<td>{pair} >= {at_least}</td>" in page


def _history_counts_every_valid_run(orch, env: dict[str, str], caps) -> None:
    """Issue 32 (item 1): `orch capacity` over this example's history counts every valid run of
    each arm, its unconverged and censored capacities too (the plan leaves most unconverged), as
    the runs' stored capacities say, and the table states how many of each."""
    r = orch("capacity", "--class", "standard", "--json", env=env)
    assert r.returncode == 0, r.stderr
    rows = {(x["gpu"], x["gpus"]): x for x in json.loads(r.stdout)["rows"]}
    arms = {"A": ("H100-PCIe", 1), "B": ("H100-PCIe", 2), "C": ("H200", 2)}
    seen_non_points = 0
    for arm, key in arms.items():
        mine = caps[(caps["arm"] == arm) & caps["valid"].astype(bool) & (caps["status"] == "done")]
        point = mine["censored"].isna() & mine["converged"].astype(bool) & (mine["capacity"] > 0)
        above = mine["censored"].isin(["above_max", "at_ceiling"])
        below = (mine["censored"] == "below_min") | (mine["censored"].isna() & mine["converged"].astype(bool)
                                                     & (mine["capacity"] <= 0))
        row = rows[key]
        assert (row["runs"], row["n_points"], row["n_censored_above"], row["n_censored_below"], row["n_unconverged"]) == (
            len(mine), int(point.sum()), int(above.sum()), int(below.sum()), int((~point & ~above & ~below).sum())), arm
        seen_non_points += len(mine) - int(point.sum())
    assert seen_non_points > 0  # the example's history has censored or unconverged runs to show
    table = orch("capacity", "--class", "standard", env=env).stdout
    assert re.search(r"\d+ = (\d+ points? \+ )?\d+ (censored|unconverged)", table), table
