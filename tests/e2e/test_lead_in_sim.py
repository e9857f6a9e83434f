"""Lead-in runs (issue 31, ``design.carryover.lead_in_s``) on the plan's own backend, sim: the
simulated engines and the real router as processes on loopback, in real time. The virtual-time
path and the dry run are in test_lead_in_run.py, Kubernetes in test_k8s_experiment.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.e2e.helpers import BASE, ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_lead_ins_on_the_sim_backend_in_real_time(tmp_path) -> None:
    """The plan's own backend (sim: simulated engines and the real router as processes on
    loopback, real time): each block's lead-in deploys its processes, loads them and stops them;
    the command leaves none behind. Validity is not asserted (load decides it), only the path."""
    data = {**BASE, "name": "e2e-lead-in-sim",
            "search": {"rate": {"min": 1, "max": 4}, "precision": 0.25, "point_s": 2, "warmup_s": 0.5,
                       "cooldown_s": 0.5, "max_points": 2, "use_prior": False},
            "design": {"blocks": 2, "order": "ABBA", "seed": 5, "max_retries": 0, "carryover": {"lead_in_s": 1}}}
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump(data))
    env = {**os.environ, "ORCH_DATABASE_URL": f"sqlite:///{tmp_path / 'orch.sqlite'}",
           "ORCH_STATE_DIR": str(tmp_path / "state"), "ORCH_CACHE_DIR": str(tmp_path / "cache"),
           "ORCH_SKIP_CALIBRATION": "1"}
    r = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "run", str(plan), "--json"], cwd=ROOT,
                       capture_output=True, text=True, env=env, timeout=240)
    assert r.returncode in (0, 5), r.stderr[-3000:]  # 5: the gate's "incomplete" if load voided a run
    leads = [line for line in r.stderr.splitlines() if "lead-in" in line and "unmeasured" in line]
    assert [line.split(":")[0].strip() for line in leads][:2] == ["block 0", "block 1"], r.stderr[-3000:]
    doc = json.loads(r.stdout)
    status = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "status", doc["experiment"]["name"],
                             "--json"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
    runs = json.loads(status.stdout)["experiments"][0]["runs"]
    assert runs and all(run["attempt"] >= 0 for run in runs)
    left = subprocess.run(["pgrep", "-f", str(tmp_path / "state")], capture_output=True, text=True)
    assert not left.stdout.strip(), left.stdout  # every process the lead-ins and runs started is stopped
