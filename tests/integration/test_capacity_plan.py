"""`orch capacity plan` (issue 20, item 2): on a seeded history it ranks configurations as a
hand-computed example says, states thin evidence, keeps the simulator out unless asked, and
writes the plan of the experiment that would settle it. Run through `orch` as a user would."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from orchestrator.cli.main import main
from orchestrator.plan import load_plan_file, validate_plan
from orchestrator.store import Store
from tests.support.seeding import quickstart_plan

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"


def _seed(url: str) -> None:
    """Workload of quickstart (64-token replies), class interactive (300/10 ms):
    X = H200 2x TP1 colocated (2 GPUs), measured 600, 640, 700, 720 tok/s;
    Y = H200 1P(TP1)+1D(TP1) (2 GPUs), measured 900, 1100 (two runs only);
    Z = H100-SXM 2x TP1 (2 GPUs), measured 300, 320, 340;
    W = X on the simulator, 5000 x3 (never ranked unless --simulated)."""
    seeds = [("x", "local", "H200", "A", [600.0, 640.0, 700.0, 720.0]),
             ("y", "local", "H200", "B", [900.0, 1100.0]),
             ("z", "local", "H100", "A", [300.0, 320.0, 340.0]),
             ("w", "sim", "H200", "A", [5000.0] * 3)]
    with Store.open(url) as store:
        for name, backend, gpu, arm, caps in seeds:
            plan = quickstart_plan(name, backend, gpu)
            exp = store.create_experiment(store.register_plan(plan).id)
            cfg = store.deployment_config(plan, arm)
            for block, cap in enumerate(caps):
                run = store.start_run(exp, arm, block, 0, 0, cfg)
                store.record_capacity(run, "interactive", cap, 3.0, 0.91, 6)
                engine = "sim-0.1" if backend == "sim" else "v0.11.0"
                store.finish_run(run, "done", valid=True, fingerprint={"engine_version": engine})


@pytest.fixture
def orch(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], sqlite_url: str):
    """`orch ARGS` in process against a seeded SQLite history."""
    _seed(sqlite_url)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        monkeypatch.setenv("ORCH_DATABASE_URL", sqlite_url)
        monkeypatch.delenv("ORCH_DEBUG", raising=False)
        monkeypatch.delenv("ORCH_GPU_PRICES", raising=False)
        monkeypatch.chdir(ROOT)
        capsys.readouterr()
        code = main(list(args))
        out = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out.out, out.err)

    return run


def test_plan_ranks_as_the_hand_computed_example_and_states_thin_evidence(orch, tmp_path: Path) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text("H100: 2.0\n")  # H200 keeps its default, 4.00 USD per GPU-hour
    settle = tmp_path / "settle.yaml"
    base = ("capacity", "plan", "--plan", str(QUICKSTART), "--class", "interactive", "--rate", "40",
            "--prices", str(prices))
    r = orch(*base, "--write-plan", str(settle), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    # 40 req/s x 64 tokens = 2560 output tok/s to serve
    assert doc["output_tok_s"] == 2560
    got = [(row["label"].split(" kv=")[0], row["copies"], row["copies_low"], row["copies_high"], row["gpus"],
            row["gpu_hours_day"], row["cost_day"]) for row in doc["rows"]]
    assert got == [
        # Y: median 1000 -> ceil(2.56) = 3 copies = 6 GPUs = 144 GPU-h/day x 4.00 = 576 USD/day
        ("H200 1P(TP1)+1D(TP1)", 3, 3, 3, 6, 144.0, 576.0),
        # X: median 670 -> 4 copies (p75 705 -> 4, p25 630 -> 5) = 8 GPUs = 192 GPU-h x 4.00 = 768
        ("H200 2x TP1", 4, 4, 5, 8, 192.0, 768.0),
        # Z: median 320 -> 8 copies = 16 GPUs = 384 GPU-h x 2.00 = 768: X's cost, more GPUs: after X
        ("H100-SXM 2x TP1", 8, 8, 9, 16, 384.0, 768.0),
    ]
    # USD per million output tokens: cost per hour / (2560 x 3600 / 1e6)
    assert [round(row["usd_per_m_output_tokens"], 3) for row in doc["rows"]] == [2.604, 3.472, 3.472]
    assert [row["shape"] for row in doc["rows"]][:2] == ["3P(TP1)+3D(TP1)", "8 replicas x TP1"]
    assert doc["rows"][0]["thin"] == ["few runs (2 < 3)"] and doc["rows"][1]["thin"] == []
    assert [row["simulated"] for row in doc["rows"]] == [False] * 3  # W (simulated) is not ranked
    assert len(doc["thin_evidence"]) == 1 and "few runs (2 < 3)" in doc["thin_evidence"][0]
    # the settling experiment: the top two, back to back, on this workload and class
    written = load_plan_file(settle)
    assert doc["plan_written"] == str(settle)
    assert (written.arms["A"].layout, written.arms["B"].layout) == ("disaggregated", "colocated")
    assert written.workload == load_plan_file(QUICKSTART).workload
    assert [(c.name, c.ttft_ms, c.tpot_ms) for c in written.classes] == [("interactive", 300, 10)]

    table = orch(*base)
    assert table.returncode == 0, table.stderr
    assert "evidence is thin" in table.stdout and "few runs (2 < 3)" in table.stdout
    assert "3x = 3P(TP1)+3D(TP1)" in table.stdout and "prices from" in table.stdout
    assert "SIMULATED" not in table.stdout


def test_plan_marks_the_simulator_and_other_engine_versions(orch) -> None:
    base = ("capacity", "plan", "--plan", str(QUICKSTART), "--class", "interactive", "--rate", "40", "--json")
    sim = json.loads(orch(*base, "--simulated").stdout)
    first = sim["rows"][0]  # W: 5000 tok/s -> 1 copy, 2 GPUs, 192 USD/day at the default H200 price
    assert (first["simulated"], first["copies"], first["gpus"], first["cost_day"]) == (True, 1, 2, 192.0)
    assert "simulator prediction, not a measurement" in first["thin"]
    other = json.loads(orch(*base, "--engine-version", "v9.9.9").stdout)
    assert all(any(t.startswith("other engine version") for t in row["thin"]) for row in other["rows"])
    wl = json.loads(orch("capacity", "--measured", "--json").stdout)["rows"][0]["workload_sha256"]
    by_sig = json.loads(orch("capacity", "plan", "--model", "qwen3-8b", "--workload", wl[:10], "--class",
                             "interactive", "--rate", "40", "--json").stdout)
    assert [row["cost_day"] for row in by_sig["rows"]] == [576.0, 768.0, 1152.0]  # H100-SXM at the default 3.00: 16 x 24 x 3
    bad = orch("capacity", "plan", "--class", "interactive", "--rate", "40")
    assert bad.returncode == 1 and "exactly one of --plan" in bad.stderr


def test_plan_of_live_sessions_counts_every_turn_of_a_session(orch, tmp_path: Path, sqlite_url: str) -> None:
    """A live-sessions workload's rate is sessions/s (as its search's is): 2 sessions/s of 3 turns
    of 64 tokens need 384 output tok/s; 670 tok/s per copy of X -> 1 copy."""
    data = yaml.safe_load(QUICKSTART.read_text())
    data["name"], data["backend"] = "sessions", "local"
    data["workload"]["sessions"] = {"think": {"mean_s": 1}}
    data["workload"]["prompts"]["turns"] = 3
    path = tmp_path / "sessions.yaml"
    path.write_text(yaml.safe_dump(data))
    plan = validate_plan(data)
    with Store.open(sqlite_url) as store:
        exp = store.create_experiment(store.register_plan(plan).id)
        run = store.start_run(exp, "A", 0, 0, 0, store.deployment_config(plan, "A"))
        store.record_capacity(run, "interactive", 670.0, 1.0, 0.95, 4)
        store.finish_run(run, "done", valid=True, fingerprint={"engine_version": "v0.11.0"})
    doc = json.loads(orch("capacity", "plan", "--plan", str(path), "--class", "interactive", "--rate", "2",
                          "--json").stdout)
    assert (doc["rate_unit"], doc["output_tok_s"]) == ("sessions/s", 384.0)
    assert [(row["copies"], row["gpus"]) for row in doc["rows"]] == [(1, 2)]
