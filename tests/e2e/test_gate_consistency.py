"""`orch run --json` and `orch verdict --gate` give the same gate code (one completeness rule,
orchestrator/control/verdicts.py): here a block whose back-to-back guard fails, so it does not
count, and both say 5 even though every run is valid. In virtual time, through `orch` in this
process (no socket)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from orchestrator.store import Store
from tests.e2e.helpers import BASE, orch_here

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_sockets")]


def test_gate_code_of_run_and_verdict_agree_when_back_to_back_fails(tmp_path: Path, monkeypatch, capsys) -> None:
    def orch(*args: str, env: dict[str, str]) -> SimpleNamespace:
        code, out, err = orch_here(*args, env=env, monkeypatch=monkeypatch, capsys=capsys)
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)

    data = copy.deepcopy(BASE)
    data["name"] = "e2e-gate-b2b"
    data["search"] = {"rate": {"min": 1, "max": 4}, "precision": 0.25, "point_s": 2, "warmup_s": 0.5,
                      "cooldown_s": 0.5, "max_points": 2, "use_prior": False}
    # The arms of a block must run within 0.36 ms of each other: no block can (a run, even in
    # virtual time, takes longer to store), so the block's runs are valid but the block does not count.
    data["design"] = {"blocks": 1, "order": "ABBA", "seed": 5, "max_retries": 1, "window_h": 1e-7}
    data["bars"] = [{"id": "standard-capacity", "metric": "capacity", "class": "standard", "at_least": 1.0,
                     "confidence": 0.9}]
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(yaml.safe_dump(data, sort_keys=False))
    db = f"sqlite:///{tmp_path / 'orch.sqlite'}"
    env = {"ORCH_DATABASE_URL": db, "ORCH_STATE_DIR": str(tmp_path / "state")}

    run = orch("run", str(plan_file), "--backend", "virtual", "--json", "--allow-low-power", env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(run.stdout)
    assert {r["arm"] for r in doc["runs"] if r["valid"]} == {"A", "B"}, doc["runs"]
    assert doc["experiment"]["complete"] is False
    name = doc["experiment"]["name"]

    gate = orch("verdict", name, "--gate", "--json", env=env)
    assert gate.returncode == doc["gate_exit_code"] == 5, (gate.returncode, doc["gate_exit_code"],
                                                          gate.stdout[-2000:])
    assert json.loads(gate.stdout)["gate_exit_code"] == 5

    # It is the back-to-back guard that left the block out.
    with Store.open(db) as store:
        exp = store.get_experiment(name)
        assert exp.status == "done"
        guards = [g for r in store.runs(exp.id) for g in store.guard_results(r.id) if g.name == "back_to_back"]
    assert len(guards) == 2 and not any(g.passed for g in guards), guards
