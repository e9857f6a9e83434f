"""`orch capacity --pareto` (issue 20, item 3): per model and workload, the stored load points no
other point beats on both throughput per GPU and per-user speed; simulated points never mixed
with measured ones; invalid points never count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from orchestrator.cli.main import main
from orchestrator.plan import validate_plan
from orchestrator.store import Store

ROOT = Path(__file__).resolve().parents[2]


def _plan(name: str, backend: str):
    data = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    data["name"], data["backend"] = name, backend
    return validate_plan(data)


# (arm, offered rate, output tok/s, TPOT p50 s, valid); both arms use 2 GPUs
MEASURED = [("A", 1.0, 400.0, 0.010, True),   # 100 tok/s per user, 200 per GPU: on the front
            ("A", 2.0, 800.0, 0.020, True),   # 50, 400: on the front
            ("A", 3.0, 700.0, 0.030, True),   # 33, 350: beaten by (50, 400)
            ("B", 1.0, 300.0, 0.008, True),   # 125, 150: on the front (fastest per user)
            ("B", 2.0, 390.0, 0.012, True),   # 83, 195: beaten by A's (100, 200)
            ("B", 3.0, 9e9, 0.001, False)]    # an invalid point never counts


def _seed(url: str, at_rate: float = 2.0) -> None:
    with Store.open(url) as store:
        for plan, points in ((_plan("real", "local"), MEASURED), (_plan("sim", "sim"), [("A", 1.0, 5000.0, 0.005, True)])):
            exp = store.create_experiment(store.register_plan(plan).id)
            for block, arm in enumerate(("A", "B")):
                run = store.start_run(exp, arm, block, 0, 0, store.deployment_config(plan, arm))
                for seq, (_, rate, thr, tpot, valid) in enumerate(p for p in points if p[0] == arm):
                    store.record_point(run, seq=seq, window_start_s=0, window_end_s=10, offered_rate=rate,
                                       throughput_tok_s=thr, percentiles={"tpot_s": {"p50": tpot}}, valid=valid)
                store.record_capacity(run, "interactive", 500.0, at_rate, 0.92, 3)
                store.finish_run(run, "done", valid=True)


def test_pareto_front_keeps_only_undominated_points_per_source(sqlite_url: str, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    _seed(sqlite_url)
    monkeypatch.setenv("ORCH_DATABASE_URL", sqlite_url)
    capsys.readouterr()
    assert main(["capacity", "--pareto", "--measured", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    got = [(r["label"].split(" kv=")[0], r["offered_rate"], round(r["per_user_tok_s"], 1), r["tok_s_per_gpu"])
           for r in rows]
    assert got == [("H200 1P(TP1)+1D(TP1)", 1.0, 125.0, 150.0), ("H200 2x TP1", 1.0, 100.0, 200.0),
                   ("H200 2x TP1", 2.0, 50.0, 400.0)]
    assert main(["capacity", "--pareto", "--json"]) == 0
    both = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["simulated"], r["tok_s_per_gpu"]) for r in both if r["simulated"]] == [(True, 2500.0)]
    assert len(both) == 4  # the simulated point is its own front, not pooled with the measured one
    assert main(["capacity", "--pareto"]) == 0
    table = capsys.readouterr().out
    assert "Pareto front" in table and "SIMULATED" in table and "in 3000±900 / out 64" in table


# -- the plot (`orch capacity --pareto --plot`) and the report's section ----------------------------


def _png_shape(path: Path) -> tuple[int, ...]:
    import matplotlib.image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return tuple(matplotlib.image.imread(str(path)).shape)


def test_pareto_plot_draws_every_point_and_numbers_the_front(sqlite_url: str, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _seed(sqlite_url)
    monkeypatch.setenv("ORCH_DATABASE_URL", sqlite_url)
    png = tmp_path / "plots" / "pareto.png"
    capsys.readouterr()
    assert main(["capacity", "--pareto", "--plot", str(png), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["plot"] == str(png.resolve()) and doc["plotted_points"] == 6  # 5 valid measured + 1 simulated
    height, width, _ = _png_shape(png)
    assert width > 1000 and height > 400
    # What was drawn: the same front as the table, numbered; the simulated point apart (hollow).
    from orchestrator.report.pareto import pareto_figure

    with Store.open(sqlite_url) as store:
        points = store.load_points()
    drawn = pareto_figure(points, tmp_path / "again.png")
    assert drawn is not None and drawn.points == 6 and drawn.simulated_points == 1
    assert len(drawn.panels) == 1 and drawn.panels[0][1].startswith("in 3000±900 / out 64")
    got = [(k, bool(s), round(u, 1), g) for k, s, u, g in
           drawn.front[["key", "simulated", "per_user_tok_s", "tok_s_per_gpu"]].itertuples(index=False)]
    assert got == [(1, False, 125.0, 150.0), (2, False, 100.0, 200.0), (3, False, 50.0, 400.0), (4, True, 200.0, 2500.0)]
    # Measured only: the simulated point is neither drawn nor on the front.
    assert main(["capacity", "--pareto", "--measured", "--plot", str(png), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["plotted_points"] == 5 and len(doc["rows"]) == 3 and not any(r["simulated"] for r in doc["rows"])
    # The table names the plot and numbers its rows as the plot does.
    assert main(["capacity", "--pareto", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "6 point(s) (1 simulated, hollow), 4 on the front" in out and str(png.resolve()) in out
    # Not a PNG name: refused before anything is drawn.
    assert main(["capacity", "--pareto", "--plot", str(tmp_path / "p.svg")]) == 1
    assert not (tmp_path / "p.svg").exists()


def test_pareto_plot_with_no_points_draws_nothing(sqlite_url: str, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with Store.open(sqlite_url):
        pass
    monkeypatch.setenv("ORCH_DATABASE_URL", sqlite_url)
    png = tmp_path / "none.png"
    assert main(["capacity", "--pareto", "--plot", str(png)]) == 0
    assert "no plot drawn" in capsys.readouterr().out and not png.exists()


def test_report_has_the_pareto_front_of_comparable_history(sqlite_url: str, tmp_path: Path) -> None:
    """The report of the measured experiment: its own points (marked) and another measured
    experiment's on the same model and workload make one front; the simulated experiment's point
    (far better per GPU) and another workload's point are left out."""
    from orchestrator.report import render_report

    # A capacity at a rate with no stored records: the latency figure has nothing to draw.
    _seed(sqlite_url, at_rate=2.5)
    with Store.open(sqlite_url) as store:
        # Another measured experiment, same model and workload: history beside this one.
        other = _plan("other", "local")
        exp = store.create_experiment(store.register_plan(other).id)
        run = store.start_run(exp, "A", 0, 0, 0, store.deployment_config(other, "A"))
        store.record_point(run, seq=0, window_start_s=0, window_end_s=10, offered_rate=4.0, throughput_tok_s=1200.0,
                           percentiles={"tpot_s": {"p50": 0.040}}, valid=True)  # 25 tok/s per user, 600 per GPU
        store.record_capacity(run, "interactive", 500.0, 4.0, 0.92, 3)
        store.finish_run(run, "done", valid=True)
        # Another workload (longer replies): never on this front.
        longer = _plan("longer", "local")
        data = longer.model_dump(mode="json", by_alias=True, exclude_none=True)
        data["workload"]["output_tokens"] = 512
        longer = validate_plan(data)
        exp2 = store.create_experiment(store.register_plan(longer).id)
        run2 = store.start_run(exp2, "A", 0, 0, 0, store.deployment_config(longer, "A"))
        store.record_point(run2, seq=0, window_start_s=0, window_end_s=10, offered_rate=1.0, throughput_tok_s=9e6,
                           percentiles={"tpot_s": {"p50": 0.001}}, valid=True)
        store.record_capacity(run2, "interactive", 500.0, 1.0, 0.92, 3)
        store.finish_run(run2, "done", valid=True)
        written = render_report(store, "real-1", tmp_path / "rep")
    section = written.document["pareto"]
    assert section["simulated"] is False and section["model"] == "qwen3-8b"
    assert section["points"] == 6 and section["own_points"] == 5  # 5 valid points of its own + 1 of the other
    front = [(r["key"], round(r["per_user_tok_s"], 1), r["tok_s_per_gpu"], r["mark"]) for r in section["front"]]
    assert front == [(1, 125.0, 150.0, "this experiment, arm B"), (2, 100.0, 200.0, "this experiment, arm A"),
                     (3, 50.0, 400.0, "this experiment, arm A"), (4, 25.0, 600.0, None)]
    page = written.index.read_text(encoding="utf-8")
    assert page.count('id="pareto-section"') == 1
    assert page.index('id="pareto-section"') < page.index("<h2>Validity of every run</h2>")
    table = page[page.index('<table id="pareto">'):]
    table = table[:table.index("</table>")]
    assert table.count("<tr") == 1 + 4 and "<td>arm B</td>" in table and "2,500" not in table
    assert written.images["pareto"] == "figures/pareto.png"
    _png_shape(written.index.parent / "figures" / "pareto.png")

