"""`orch capacity --pareto --slo-met` (issue 32, item 10): one Pareto front per class, of the
stored points that met that class's SLO: attainment at the class at least what the point's
registered plan required of its capacity search (``search.attainment``). On SQLite and
PostgreSQL (the points' query reads their ids on both)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from orchestrator.cli.main import main
from orchestrator.plan import validate_plan
from orchestrator.store import Store

ROOT = Path(__file__).resolve().parents[2]

# (arm, offered rate, output tok/s, TPOT p50 s, interactive attainment, standard attainment);
# both arms use 2 GPUs, so (per-user tok/s, tok/s per GPU) is (1 / TPOT, tok/s / 2).
POINTS = [("A", 1.0, 400.0, 0.010, 0.92, 0.99),   # (100, 200): interactive misses 0.93
          ("A", 2.0, 800.0, 0.020, 0.50, 0.95),   # (50, 400): the unfiltered front's best per GPU
          ("B", 1.0, 300.0, 0.008, 0.97, 0.99),   # (125, 150)
          ("B", 2.0, 390.0, 0.012, 0.96, 0.90)]   # (83, 195): beaten by A's (100, 200) where it counts


def _seed(url: str) -> None:
    data = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    data["name"], data["backend"] = "slo", "local"
    data["search"]["attainment"] = 0.93  # what a point needs at a class to count toward capacity
    plan = validate_plan(data)
    with Store.open(url) as store:
        exp = store.create_experiment(store.register_plan(plan).id)
        for block, arm in enumerate(("A", "B")):
            run = store.start_run(exp, arm, block, 0, 0, store.deployment_config(plan, arm))
            for seq, (_, rate, thr, tpot, inter, std) in enumerate(p for p in POINTS if p[0] == arm):
                store.record_point(run, seq=seq, window_start_s=0, window_end_s=10, offered_rate=rate,
                                   throughput_tok_s=thr, percentiles={"tpot_s": {"p50": tpot}},
                                   per_class={"interactive": {"attainment": inter}, "standard": {"attainment": std}})
            store.record_capacity(run, "interactive", 500.0, 1.0, 0.95, 2)
            store.finish_run(run, "done", valid=True)


def _front(rows: list[dict], cls: str | None = None) -> list[tuple[float, float]]:
    return [(round(r["per_user_tok_s"], 1), r["tok_s_per_gpu"]) for r in rows if cls is None or r["class_name"] == cls]


def test_the_front_of_each_class_holds_only_points_that_met_its_slo(db_url: str, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    _seed(db_url)
    monkeypatch.setenv("ORCH_DATABASE_URL", db_url)
    capsys.readouterr()
    assert main(["capacity", "--pareto", "--json"]) == 0
    assert _front(json.loads(capsys.readouterr().out)["rows"]) == [(125.0, 150.0), (100.0, 200.0), (50.0, 400.0)]
    assert main(["capacity", "--pareto", "--slo-met", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["filters"] == {"slo_met": True}
    # Interactive: A's points miss 0.93 (0.92 and 0.50), so B's (83, 195) is on that front now.
    assert _front(doc["rows"], "interactive") == [(125.0, 150.0), (83.3, 195.0)]
    # Standard: B at 2 req/s misses (0.90); A's three-way front stands.
    assert _front(doc["rows"], "standard") == [(125.0, 150.0), (100.0, 200.0), (50.0, 400.0)]
    assert main(["capacity", "--pareto", "--slo-met"]) == 0
    table = capsys.readouterr().out
    assert "Pareto front per class, of the points that met its SLO" in table and "interactive" in table


def test_slo_met_is_a_filter_of_the_pareto_front(sqlite_url: str, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    monkeypatch.setenv("ORCH_DATABASE_URL", sqlite_url)
    capsys.readouterr()
    assert main(["capacity", "--slo-met"]) == 1
    assert "--slo-met filters the Pareto front: give it with --pareto" in capsys.readouterr().err
    assert main(["capacity", "--pareto", "--slo-met", "--plot", str(tmp_path / "p.png")]) == 1
    assert not (tmp_path / "p.png").exists()
