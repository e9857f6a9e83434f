"""Capacity over history counts every valid run, converged or censored (issue 32, item 1), on
SQLite and PostgreSQL, through `orch` as a user runs it: `orch capacity` (table and --json),
`orch capacity plan` and `orch capacity --pareto` show the NPMLE median with its interval and
the counts of points and censored runs; a group of censored runs only still shows; a censored
capacity of an invalid run never counts. The expected figures are computed by hand beside each
seed (the estimator itself is checked against independent computations in
tests/unit/test_censored_history.py)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from orchestrator.cli.main import main
from orchestrator.plan import validate_plan
from orchestrator.report.capacity_history import capacity_history
from orchestrator.store import Store

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"

# (capacity, censored, converged, upper) per run, class interactive, quickstart's workload.
# A: three-arm arm C of the issue: 149, 171, 181 and three runs censored above at 256, 256, 267.
#    NPMLE: 1/6 on each point, 1/2 on [267, inf): F = 1/2 from 181 to 267, the median that
#    stretch's midpoint 224; 6 runs: k = 1 (2 P(Bin(6, 1/2) = 0) = 1/32 <= 0.05, k = 2 gives
#    14/64), interval [L_(1), R_(6)] = [149, inf) at 1 - 2/64.
A = [(149.0, None, True, None), (171.0, None, True, None), (181.0, None, True, None),
     (256.0, "above_max", True, None), (256.0, "above_max", True, None), (267.0, "at_ceiling", True, None)]
# B: censored runs only (the H200 2x: >= 1323 and >= 1365): the NPMLE's mass all on
#    [1365, inf): the median ">= 1,365"; the interval [1323, inf) at 1 - 2/4.
B = [(1323.0, "above_max", True, None), (1365.0, "above_max", True, None)]
# C (H100): points 300 and 320, one run below the search's lowest rate (50) and one unconverged
#    bracket [200, 260]: disjoint intervals, 1/4 each; F = 1/2 from 260 to 300: median 280;
#    interval [0, 320] at 1 - 2/16.
C = [(300.0, None, True, None), (320.0, None, True, None), (0.0, "below_min", True, 50.0), (200.0, None, False, 260.0)]


def _plan(name: str, gpu: str = "H200"):
    data = yaml.safe_load(QUICKSTART.read_text())
    data["name"], data["backend"] = name, "local"
    data["arms"]["A"]["gpu"] = gpu
    return validate_plan(data)


def _seed(url: str) -> dict[str, int]:
    """A and B are arms A and B of one plan, C arm A of an H100 plan; every run valid and done
    but one: an invalid run of A censored far above, which must never count. A's first point
    run and its first censored run each store one open-loop load point (the Pareto front)."""
    runs: dict[str, int] = {}
    with Store.open(url) as store:
        for plan, seeds in ((_plan("h200"), (("A", A), ("B", B))), (_plan("h100", "H100"), (("A", C),))):
            exp = store.create_experiment(store.register_plan(plan).id)
            for arm, caps in seeds:
                cfg = store.deployment_config(plan, arm)
                for block, (cap, censored, converged, upper) in enumerate(caps):
                    run = store.start_run(exp, arm, block, 0, 0, cfg)
                    store.record_capacity(run, "interactive", cap, 3.0, 0.91, 6, censored=censored,
                                          converged=converged, upper=upper)
                    if plan.name == "h200" and arm == "A" and block in (0, 3):
                        # the censored run's point is faster per user and higher per GPU: the front
                        thr, tpot = (300.0, 0.02) if block == 0 else (500.0, 0.01)
                        store.record_point(run, seq=0, window_start_s=0, window_end_s=10, offered_rate=1.0 + block,
                                           throughput_tok_s=thr, percentiles={"tpot_s": {"p50": tpot}}, valid=True)
                        runs[f"A{block}"] = run
                    store.finish_run(run, "done", valid=True, fingerprint={"engine_version": "v0.11.0"})
            if plan.name == "h200":
                bad = store.start_run(exp, "A", 9, 0, 0, store.deployment_config(plan, "A"))
                store.record_capacity(bad, "interactive", 9e6, 3.0, 0.99, 6, censored="above_max")
                store.finish_run(bad, "done", valid=False, invalid_reason="generator_lag")
    return runs


@dataclass
class Orch:
    """`orch ARGS` in process against the seeded history; ``runs``: the seeded runs with points."""

    url: str
    runs: dict[str, int]
    monkeypatch: pytest.MonkeyPatch
    capsys: pytest.CaptureFixture[str]

    def __call__(self, *args: str) -> str:
        self.monkeypatch.setenv("ORCH_DATABASE_URL", self.url)
        self.monkeypatch.delenv("ORCH_GPU_PRICES", raising=False)
        self.monkeypatch.chdir(ROOT)
        self.capsys.readouterr()
        code = main(list(args))
        out = self.capsys.readouterr()
        assert code == 0, out.err
        return out.out


@pytest.fixture
def orch(db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Orch:
    return Orch(db_url, _seed(db_url), monkeypatch, capsys)


def _by_layout_gpu(rows: list[dict]) -> dict[tuple[str, str], dict]:
    return {(r["layout"], r["gpu"]): r for r in rows}


def test_capacity_json_counts_every_valid_run_with_the_estimator(orch: Orch) -> None:
    rows = _by_layout_gpu(json.loads(orch("capacity", "--class", "interactive", "--json"))["rows"])
    assert len(rows) == 3  # B, of censored runs only, shows
    a, b, c = rows[("colocated", "H200")], rows[("disaggregated", "H200")], rows[("colocated", "H100-SXM")]
    fields = ("runs", "median", "median_censored", "median_low", "median_high", "n_points", "n_censored_above",
              "n_censored_below", "n_unconverged", "censored_above_from", "censored_below_to")
    assert [a[k] for k in fields] == [6, 224.0, None, 149.0, None, 3, 3, 0, 0, 256.0, None]  # high None: unbounded
    assert a["median_level"] == pytest.approx(1 - 2 / 2**6)
    assert (a["p25"], a["p75"], a["min"], a["max"]) == (160.0, 176.0, 149.0, 181.0)  # the points' quartiles
    assert [b[k] for k in fields] == [2, 1365.0, "above", 1323.0, None, 0, 2, 0, 0, 1323.0, None]
    assert b["p25"] is None or math.isnan(b["p25"])
    assert [c[k] for k in fields] == [4, 280.0, None, 0.0, 320.0, 2, 0, 1, 1, None, 50.0]
    assert c["median_level"] == pytest.approx(1 - 2 / 2**4)
    # best first: the censored-only group's ">= 1,365" above A's 224
    assert [r["median"] for r in json.loads(orch("capacity", "--json"))["rows"]] == [1365.0, 280.0, 224.0]


def test_capacity_table_shows_the_counts_and_a_censored_median(orch: Orch) -> None:
    out = orch("capacity", "--class", "interactive")
    for cell in ("6 = 3 points + 3 censored >= 256", " 224 ", "149-inf", "2 = 2 censored >= 1,323", ">= 1,365",
                 "1,323-inf", "4 = 2 points + 1 censored <= 50 + 1 unconverged", " 280 ", "0-320", "160-176"):
        assert cell in out, (cell, out)
    assert "9,000,000" not in out  # the invalid run's capacity never counts
    # the "no valid runs match these filters" for a group of censored runs only
    alone = orch("capacity", "--layout", "disaggregated")
    assert "2 = 2 censored >= 1,323" in alone and "no valid runs" not in alone


def test_capacity_plan_sizes_from_every_run_and_says_when_the_median_is_censored(orch: Orch) -> None:
    doc = json.loads(orch("capacity", "plan", "--plan", "examples/quickstart.yaml", "--class", "interactive",
                          "--rate", "10", "--json"))
    rows = {(r["layout"], r["gpu"]): r for r in doc["rows"]}
    a, b = rows[("colocated", "H200")], rows[("disaggregated", "H200")]
    assert (a["runs"], a["median"], a["n_points"], a["n_censored_above"]) == (6, 224.0, 3, 3)
    need = 10 * 64  # output tok/s: quickstart's 64-token replies
    assert a["copies"] == math.ceil(need / 224.0)
    # the range: the points' quartiles 160-176 widened to the median 224 above them
    assert (a["p25"], a["p75"], a["copies_low"], a["copies_high"]) == (160.0, 224.0, 3, math.ceil(need / 160.0))
    assert (b["runs"], b["median"], b["median_censored"]) == (2, 1365.0, "above")
    assert b["copies"] == b["copies_low"] == b["copies_high"] == 1  # no points: the median is the range
    assert any("median censored: >= 1,365" in t for t in b["thin"])
    text = orch("capacity", "plan", "--plan", "examples/quickstart.yaml", "--class", "interactive", "--rate", "10")
    assert "6 = 3 points + 3 censored >= 256" in text and ">= 1,365" in text


def test_pareto_front_counts_the_points_of_censored_runs(orch: Orch) -> None:
    doc = json.loads(orch("capacity", "--pareto", "--json"))
    assert (doc["runs"], doc["censored_runs"]) == (2, 1)
    front = [(r["run_id"], r["run_censored"]) for r in doc["rows"]]
    assert front == [(orch.runs["A3"], True)]  # the censored run's point beats the other on both
    text = orch("capacity", "--pareto")
    assert "points of 2 valid run(s) = 1 with a point capacity + 1 censored or unconverged" in text


def test_capacity_history_of_all_point_groups_equals_capacity_by_config(orch: Orch) -> None:
    """Where every run is a point the estimator's median and the figures are capacity_by_config's."""
    with Store.open(orch.url) as store:
        run = store.start_run(store.create_experiment(store.register_plan(_plan("more")).id), "A", 0, 0, 0,
                              store.deployment_config(_plan("more"), "A"))
        store.record_capacity(run, "standard", 410.0, 3.0, 0.91, 6)
        store.finish_run(run, "done", valid=True)
        for filters in ({"service_class": "standard"}, {"service_class": "standard", "since_days": 10}):
            want = store.capacity_by_config(**filters)
            got = capacity_history(store, **filters)
            assert len(want) == 1
            assert got[list(want.columns)].to_dict("records") == want.to_dict("records")
            assert (got.loc[0, "n_points"], got.loc[0, "median_low"], got.loc[0, "median_high"]) == (1, 410.0, 410.0)


def test_vectorised_figures_equal_the_estimator_group_by_group() -> None:
    """capacity_history's figures (vectorised for groups of points, the NPMLE for the others)
    equal censored_median and the points' linear quartiles computed group by group."""
    import numpy as np
    import pandas as pd

    from orchestrator.analysis.censored import censored_median, run_interval
    from orchestrator.report.capacity_history import _figures
    from orchestrator.store.history_censored import GROUPS_COLUMNS, RUN_COLUMNS

    rng = np.random.default_rng(11)
    groups, runs = [], []
    for g in range(60):
        groups.append({c: None for c in GROUPS_COLUMNS} | {
            "group_id": 1000 - g, "config_id": g // 2, "class": "interactive" if g % 2 else "standard",
            "ttft_ms": 0.0, "tpot_ms": 0.0, "workload_sha256": "", "backend": "", "simulated": False})
        kinds = rng.choice(["point", "above", "below", "unconverged"], size=int(rng.integers(1, 12)),
                           p=[0.7, 0.1, 0.1, 0.1] if g % 3 else [1.0, 0.0, 0.0, 0.0])
        for kind in kinds:
            v = float(np.round(rng.lognormal(6, 0.4), 1))
            cap, censored, converged, upper = {
                "point": (v, None, True, None), "above": (v, "above_max", True, None),
                "below": (0.0, "below_min", True, v), "unconverged": (v, None, False, v * 1.5)}[str(kind)]
            runs.append({"group_id": 1000 - g, "capacity": cap, "censored": censored, "converged": converged,
                         "upper": upper, "last_measured": pd.Timestamp("2026-01-01", tz="UTC")})
    raw = pd.DataFrame(runs, columns=list(RUN_COLUMNS)).sample(frac=1.0, random_state=3)  # any order
    raw["censored"] = raw["censored"].astype(object).where(raw["censored"].notna(), None)
    got = _figures(pd.DataFrame(groups, columns=list(GROUPS_COLUMNS)), raw)
    assert len(got) == 60
    for g, r in enumerate(got.to_dict("records")):
        assert (r["config_id"], r["class"]) == (g // 2, "interactive" if g % 2 else "standard")
        mine = raw[raw["group_id"] == 1000 - g]
        intervals = [run_interval(c, s, v, None if pd.isna(u) else u)
                     for c, s, v, u in zip(mine["capacity"], mine["censored"], mine["converged"], mine["upper"],
                                           strict=True)]
        m = censored_median(intervals)
        assert (r["runs"], r["n_points"], r["n_censored_above"], r["n_censored_below"], r["n_unconverged"]) == (
            m.runs, m.n_points, m.n_censored_above, m.n_censored_below, m.n_unconverged)
        assert (r["median"], r["median_low"], r["median_high"], r["median_level"]) == pytest.approx(
            (m.median, m.low, m.high, m.level))
        assert r["median_censored"] == m.censored
        points = sorted(x.lower for x in intervals if x.kind == "point")
        if points:
            assert (r["p25"], r["p75"], r["min"], r["max"]) == pytest.approx(
                (np.quantile(points, 0.25), np.quantile(points, 0.75), points[0], points[-1]))
        else:
            assert all(math.isnan(r[k]) for k in ("p25", "p75", "min", "max", "spread"))


def test_report_pareto_section_counts_the_censored_runs_behind_its_points(sqlite_url: str, tmp_path: Path) -> None:
    """The report's Pareto section (history of the same model and workload): another experiment's
    run censored above stores a point that joins the front; the section counts it and says so."""
    from orchestrator.report import render_report
    from tests.integration import test_history_pareto as pareto

    pareto._seed(sqlite_url, at_rate=2.5)
    with Store.open(sqlite_url) as store:
        other = pareto._plan("other", "local")
        exp = store.create_experiment(store.register_plan(other).id)
        run = store.start_run(exp, "A", 0, 0, 0, store.deployment_config(other, "A"))
        store.record_point(run, seq=0, window_start_s=0, window_end_s=10, offered_rate=4.0, throughput_tok_s=1200.0,
                           percentiles={"tpot_s": {"p50": 0.040}}, valid=True)
        store.record_capacity(run, "interactive", 500.0, 4.0, 0.92, 3, censored="above_max")
        store.finish_run(run, "done", valid=True)
        written = render_report(store, "real-1", tmp_path / "rep")
    section = written.document["pareto"]
    assert (section["points"], section["runs"], section["censored_runs"]) == (6, 3, 1)  # its 2 runs + the other
    assert [(r["run_id"], r["run_censored"]) for r in section["front"] if r["mark"] is None] == [(run, True)]
    page = " ".join(written.index.read_text(encoding="utf-8").split())
    assert "from 3 valid run(s), 1 of them with a censored or unconverged capacity" in page


def test_capacity_plot_draws_censored_runs_as_bounds_and_each_groups_median(orch: Orch, tmp_path: Path) -> None:
    """`orch capacity --plot`: every valid run is drawn, a censored one at its bound with the
    marker of its kind (none of the invalid run), and each group's median of every run."""
    png = tmp_path / "history" / "capacity.png"
    doc = json.loads(orch("capacity", "--class", "interactive", "--plot", str(png), "--json"))
    assert doc["plot"] == str(png.resolve())
    # A: 3 points, 3 above; B: 2 above; C: 2 points, 1 below (<= 50), 1 unconverged [200, 260]
    assert doc["plotted_runs"] == {"point": 5, "above": 5, "below": 1, "unconverged": 1}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    text = orch("capacity", "--class", "interactive", "--plot", str(png))
    assert "12 run(s) drawn: 5 points, 5 censored above, 1 censored below, 1 unconverged" in text
    # what the plot was fed: each run's kind and bound, each group's median
    from orchestrator.report.history import capacity_trends

    with Store.open(orch.url) as store:
        trends = capacity_trends(store, capacity_history(store, service_class="interactive"))
    got = {(r["kind"], r["bound"], None if math.isnan(r["bound_high"]) else r["bound_high"], r["median"],
            r["median_censored"]) for r in trends.to_dict("records")}
    assert got == {("point", v, None, 224.0, None) for v in (149.0, 171.0, 181.0)} | {
        ("above", v, None, 224.0, None) for v in (256.0, 267.0)} | {
        ("above", v, None, 1365.0, "above") for v in (1323.0, 1365.0)} | {
        ("point", v, None, 280.0, None) for v in (300.0, 320.0)} | {
        ("below", 50.0, None, 280.0, None), ("unconverged", 200.0, 260.0, 280.0, None)}
    assert len(trends) == 12 and 9e6 not in set(trends["capacity"])
