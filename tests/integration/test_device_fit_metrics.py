"""`orch device fit --experiment NAME --arm A`: a device profile from the vLLM metric samples a
run stored (issue 21). The store holds an experiment of the plan below whose points' samples
the step model made from a known profile (tests/support/metrics_points.py); the fit recovers
it, `--install` changes `orch plan simulate`'s prediction, and too few points are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from orchestrator.cli.main import main
from orchestrator.plan import validate_plan
from orchestrator.store import Store
from tests.support.metrics_points import LOADS, TRUTH, figures, samples

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

PLAN = {
    "name": "fit-from-metrics", "model": "qwen3-8b",
    "arms": {arm: {"gpu": "H100-PCIe", "layout": "colocated", "replicas": 1,
                   "engine": {"max_num_seqs": 64, "max_num_batched_tokens": 4096}} for arm in "AB"},
    "router": {"policy": "round_robin"},
    "workload": {"arrival": {"process": "poisson"}, "prompts": {"input_tokens": {"mean": 4000, "dist": "fixed"}},
                 "output_tokens": 64},
    "classes": ["standard"],
    "search": {"rate": {"min": 1, "max": 16}, "precision": 0.05, "point_s": 2, "warmup_s": 0.5,
               "cooldown_s": 0.5, "max_points": 8, "use_prior": False},
    "design": {"blocks": 1, "order": "ABBA", "seed": 5},
    "backend": "sim",
}


SEND_S = 3.0  # the plan's warm-up, window and cool-down: how long each point sends


def seed(store: Store, name: str, loads: tuple[tuple[float, int, float], ...]) -> None:
    """An experiment whose run of arm A stored the loads' points (and an invalid run that must
    not count: its samples would spoil the fit)."""
    plan = validate_plan(PLAN)
    reg = store.register_plan(plan)
    exp = store.create_experiment(reg.id, name)
    config = store.deployment_config(plan, "A")
    for attempt, valid in ((0, False), (1, True)):
        run = store.start_run(exp, "A", 0, 0, attempt, config)
        for i, (batch, prompt, rate) in enumerate(loads):
            f = figures(batch, prompt, rate, point_id=i, requests=rate * SEND_S)
            pid = store.record_point(run, seq=i, window_start_s=0.0, window_end_s=2.0, offered_rate=rate,
                                     achieved_rate=rate, valid=True)
            rows = samples(f, t0=1000.0 + 10 * i)
            if not valid:
                rows = [(t, n, lab, v * 3) for t, n, lab, v in rows]
            store.record_metric_samples(run, pid, rows)
        store.finish_run(run, "done", valid, None if valid else "a guard failed",
                         {"backend": "sim", "gpu_type": "H100-PCIe", "gpu_products": ["simulated H100-PCIe"]})


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ORCH_DATABASE_URL", f"sqlite:///{tmp_path / 'orch.sqlite'}")
    monkeypatch.setenv("ORCH_PROFILES_DIR", str(tmp_path / "profiles"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_fit_from_an_experiments_metrics_recovers_the_device_and_installs_it(env: Path, capsys) -> None:
    with Store.open() as store:
        seed(store, "fit-1", LOADS)
    assert main(["device", "fit", "--experiment", "fit-1", "--arm", "A", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["profile"] == "fit-1-A.profile.json" and (env / "fit-1-A.profile.json").exists()
    # Tolerance: 3% (the points are the model's own, so only the optimizer's tolerance remains).
    assert doc["step_overhead_s"] == pytest.approx(TRUTH.step_overhead_s, rel=0.03)
    assert doc["bandwidth_bytes_s"] == pytest.approx(TRUTH.bandwidth_bytes_s, rel=0.03)
    assert doc["flops"] == pytest.approx(TRUTH.flops, rel=0.03)
    assert doc["gpu"] == "H100-PCIe" and doc["fingerprint"] == "simulated H100-PCIe"
    assert doc["fit"]["runs"] == [2] and len(doc["fit"]["points"]) == len(LOADS)  # the valid run only
    assert all(abs(p["tpot_residual"]) < 1e-3 for p in doc["fit"]["points"])
    assert doc["source"].startswith("orch device fit --experiment fit-1 --arm A: vLLM metrics of runs 2, points ")

    plan_file = env / "plan.yaml"
    plan_file.write_text(yaml.safe_dump(PLAN, sort_keys=False))

    def capacity() -> tuple[float, list[str]]:
        assert main(["plan", "simulate", str(plan_file), "--json", "--replications", "3"]) == 0
        out = json.loads(capsys.readouterr().out)
        return out["arms"]["A"]["capacity"]["standard"]["capacity_tok_s"], out["notes"]

    sheet, notes = capacity()
    assert main(["device", "fit", "--experiment", "fit-1", "--arm", "A", "--install"]) == 0
    text = capsys.readouterr().out
    assert "standard errors: t0" in text and str(env / "profiles" / "H100-PCIe.json") in text
    measured, notes_p = capacity()
    assert not any("device profile" in n for n in notes)
    assert any(n.startswith("arm A: device profile fit-1 arm A") for n in notes_p)
    assert measured < sheet  # t0 1.5 ms and 1.6 TB/s: slower than the datasheet H100 PCIe


def test_too_few_points_are_refused_in_one_line(env: Path, capsys) -> None:
    with Store.open() as store:
        seed(store, "fit-2", LOADS[:2])
    assert main(["device", "fit", "--experiment", "fit-2", "--arm", "A"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("cannot fit a device profile from fit-2 arm A: 2 point(s) with a mean TPOT; "
                           "the fit needs at least 3: run a rate search")
    assert main(["device", "fit", "--experiment", "fit-2", "--arm", "C"]) == 1
    assert "--arm: 'C' is not an arm of fit-2 (A, B)" in capsys.readouterr().err
    assert main(["device", "fit", "--experiment", "fit-2", "--arm", "B"]) == 1
    assert "experiment fit-2 has no valid run of arm B" in capsys.readouterr().err
    assert main(["device", "fit"]) == 1
    assert "give a probe file or --experiment NAME" in capsys.readouterr().err
