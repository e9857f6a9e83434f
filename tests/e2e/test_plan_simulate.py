"""`orch plan simulate` as a user runs it: exit 0 and one JSON document."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_plan_simulate_quickstart_json() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli.main", "plan", "simulate", "examples/quickstart.yaml",
         "--json", "--replications", "50", "--seed", "7"],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
        env={k: v for k, v in os.environ.items() if k != "ORCH_DEBUG"},
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)  # exactly one document
    assert set(doc["arms"]) == {"A", "B"}
    for arm in doc["arms"].values():
        cap = arm["capacity"]["interactive"]
        assert cap["capacity_tok_s"] > 0 and cap["at_rate"] > 0
    (bar,) = doc["bars"]
    assert bar["id"] == "interactive-capacity"
    assert bar["verdict"] in ("ACCEPT", "REJECT", "INCONCLUSIVE")
    assert 0.0 <= bar["power"] <= 1.0
    assert doc["gpu_hours"]["total"] > 0
    assert doc["seed"] == 7 and doc["replications"] == 50


def test_plan_simulate_closed_loop_is_a_user_error(tmp_path: Path) -> None:
    text = (ROOT / "examples/quickstart.yaml").read_text()
    text = text.replace("arrival: {process: poisson}", "closed: {users: 8}")
    text = text.split("bars:")[0] + "backend: sim\n"
    f = tmp_path / "closed.yaml"
    f.write_text(text)
    r = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "plan", "simulate", str(f)],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert "open-loop" in r.stderr and "Traceback" not in r.stderr
