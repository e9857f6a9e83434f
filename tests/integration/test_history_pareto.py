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


def _seed(url: str) -> None:
    with Store.open(url) as store:
        for plan, points in ((_plan("real", "local"), MEASURED), (_plan("sim", "sim"), [("A", 1.0, 5000.0, 0.005, True)])):
            exp = store.create_experiment(store.register_plan(plan).id)
            for block, arm in enumerate(("A", "B")):
                run = store.start_run(exp, arm, block, 0, 0, store.deployment_config(plan, arm))
                for seq, (_, rate, thr, tpot, valid) in enumerate(p for p in points if p[0] == arm):
                    store.record_point(run, seq=seq, window_start_s=0, window_end_s=10, offered_rate=rate,
                                       throughput_tok_s=thr, percentiles={"tpot_s": {"p50": tpot}}, valid=valid)
                store.record_capacity(run, "interactive", 500.0, 2.0, 0.92, 3)
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
