"""`orch demo` as a newcomer runs it (what `make demo` calls): the demo plan on embedded defaults
(SQLite, this machine, simulated engines behind the real vllm-router), registration to stored
verdict and report. Real time and real processes; it asserts what load cannot change (a verdict
of the registered bar, with its rule, is stored and read back), not which verdict: the timing
guards of a loaded machine may void and retry runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def test_orch_demo_runs_the_demo_plan_to_a_stored_verdict(tmp_path: Path) -> None:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ORCH_")},
           "ORCH_DATABASE_URL": f"sqlite:///{tmp_path / 'orch.sqlite'}", "ORCH_STATE_DIR": str(tmp_path / "state")}
    r = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "demo", "--json"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=840)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert doc["experiment"]["name"].startswith("demo-two-replicas")
    (v,) = doc["verdicts"]
    assert v["bar"] == "interactive-capacity" and v["verdict"] in ("ACCEPT", "REJECT", "INCONCLUSIVE")
    assert v["estimand"] == "median block ratio" and v["sequential"]["planned"] == 4
    assert Path(doc["report"]).is_file()
    read = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "verdict", doc["experiment"]["name"],
                           "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert read.returncode == 0, read.stderr[-2000:]
    assert json.loads(read.stdout)["verdicts"][0]["verdict"] == v["verdict"]
