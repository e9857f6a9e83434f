"""Plans and stored experiments that several tests seed the same way: quickstart's plan under
another name, backend or GPU, and an experiment caught mid-run (for `orch status`)."""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.plan import Plan, validate_plan
from orchestrator.store import Store

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"


def quickstart_plan(name: str, backend: str, gpu: str = "H200") -> Plan:
    """examples/quickstart.yaml named ``name`` on ``backend``, arm A on ``gpu``."""
    data = yaml.safe_load(QUICKSTART.read_text())
    data["name"], data["backend"] = name, backend
    data["arms"]["A"]["gpu"] = gpu
    return validate_plan(data)


def running_experiment(url: str, plan: Plan, name: str) -> int:
    """A running experiment of ``plan``: block 0 arm A done and valid (one point), arm B
    running with one point so far."""
    with Store.open(url) as st:
        exp = st.create_experiment(st.register_plan(plan).id, name=name)
        st.set_experiment_status(exp, "running")
        a = st.start_run(exp, "A", 0, 0, 0, st.deployment_config(plan, "A"))
        st.record_point(a, seq=0, window_start_s=0, window_end_s=1, offered_rate=2.0,
                        per_class={"interactive": {"attainment": 0.97}})
        st.finish_run(a, "done", True)
        b = st.start_run(exp, "B", 0, 1, 0, st.deployment_config(plan, "B"))
        st.record_point(b, seq=0, window_start_s=0, window_end_s=1, offered_rate=1.5,
                        per_class={"interactive": {"attainment": 0.93}})
        return exp
