"""`orch demo` as a newcomer runs it (what `make demo` calls): the demo plan on embedded defaults
(SQLite, this machine, the simulated engine in virtual time), registration to stored verdict
and report. Virtual time is deterministic: the obvious win is accepted at the first look and the
blocks after it are not run. (`orch run` of a plan on live simulated servers is what the sim
backend's e2e tests run.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def _orch(*args: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _env(tmp_path: Path) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("ORCH_")},
            "ORCH_DATABASE_URL": f"sqlite:///{tmp_path / 'orch.sqlite'}", "ORCH_STATE_DIR": str(tmp_path / "state")}


def _read_back(doc: dict, env: dict[str, str]) -> dict:
    assert doc["experiment"]["name"].startswith("demo-two-replicas")
    assert Path(doc["report"]).is_file()
    read = _orch("verdict", doc["experiment"]["name"], "--json", env=env, timeout=120)
    assert read.returncode == 0, read.stderr[-2000:]
    (v,) = doc["verdicts"]
    assert json.loads(read.stdout)["verdicts"][0]["verdict"] == v["verdict"]
    assert v["bar"] == "interactive-capacity" and v["estimand"] == "median block ratio"
    return v


def test_orch_demo_runs_in_virtual_time_and_stops_at_the_first_decisive_look(tmp_path: Path) -> None:
    env = _env(tmp_path)
    r = _orch("demo", "--json", env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    v = _read_back(json.loads(r.stdout), env)
    assert v["verdict"] == "ACCEPT" and v["sequential"]["stopped"] and v["sequential"]["blocks"] == 2
