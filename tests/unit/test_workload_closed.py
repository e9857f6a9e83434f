"""Closed loop: what a closed-loop plan may ask (no capacity, no rate), and the seed's open vs
closed effect on the simulated engine in virtual time (examples/open-vs-closed.yaml)."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.analysis.metrics import point_metrics
from orchestrator.errors import PlanError
from orchestrator.loadgen.schedules import open_loop_offsets
from orchestrator.loadgen.workloads import build_requests, iter_requests
from orchestrator.plan import load_plan_file, validate_plan
from orchestrator.plan.workload import OpenLoop
from orchestrator.sim.engine import Windows, cluster_for_arm, simulate_open_loop
from orchestrator.sim.engine.virtual import simulate_closed_loop

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "open-vs-closed.yaml"


def _example_data() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def _paths(data: dict) -> list[str]:
    with pytest.raises(PlanError) as e:
        validate_plan(data)
    return [p.path for p in e.value.plan_problems]


def test_capacity_bar_on_closed_loop_is_refused_at_its_path() -> None:
    data = _example_data()
    data["bars"][1] = {"id": "cap", "metric": "capacity", "class": "standard", "at_least": 1.1}
    assert _paths(data) == ["bars.1.metric"]


def test_rate_on_a_closed_loop_bar_is_refused() -> None:
    data = _example_data()
    data["bars"][0]["rate"] = 2.0
    assert _paths(data) == ["bars.0.rate"]


def test_open_loop_point_bar_still_needs_its_rate() -> None:
    data = _example_data()
    data["workload"].pop("closed")
    data["workload"]["arrival"] = {"process": "poisson"}
    assert _paths(data) == ["bars.0.rate", "bars.1.rate"]
    data["bars"][0]["rate"] = data["bars"][1]["rate"] = 1.0
    assert validate_plan(data).bars[0].rate == 1.0


def test_plan_validate_refuses_capacity_on_closed_loop_in_one_line(tmp_path: Path) -> None:
    text = EXAMPLE.read_text().replace("metric: goodput_at", "metric: capacity")
    f = tmp_path / "closed-capacity.yaml"
    f.write_text(text)
    r = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "plan", "validate", str(f)],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 1, r.stderr
    problems = [ln for ln in r.stderr.splitlines() if not ln.startswith("warning:")]
    assert len(problems) == 1 and problems[0].startswith("bars.0.metric: capacity comes from open-loop runs only")
    assert "Traceback" not in r.stderr


def test_iter_requests_is_build_requests_without_an_end() -> None:
    plan = load_plan_file(EXAMPLE)
    data = copy.deepcopy(_example_data())
    data["workload"]["prompts"] = {"input_tokens": {"mean": 40}, "conversations": 3, "turns": 2}
    w = validate_plan(data).workload
    it = iter_requests(w, 5)
    endless = [next(it) for _ in range(20)]
    assert endless[:13] == build_requests(w, 13, 5)
    assert plan.workload.closed is not None and plan.workload.arrival is None


def test_example_open_loop_beyond_capacity_reports_less_than_the_closed_loop() -> None:
    """The seed's effect: the same server holds its throughput at N closed-loop users, and
    open loop beyond capacity (here twice the closed loop's request rate) reports less."""
    plan = load_plan_file(EXAMPLE)
    closed = plan.workload.closed
    assert closed is not None
    cluster = cluster_for_arm(plan.model, plan.arm("A"), plan.router_for("A"), plan.sim, with_faults=False)
    s = plan.search
    win = Windows(s.warmup_s, s.point_s, s.cooldown_s)

    def metrics(res):
        n = sum(1 for r in res.records if r.phase == "measure")
        return point_metrics(res.records, plan.classes, window_s=s.point_s, n_scheduled=n)

    requests = build_requests(plan.workload, 600, 1)
    c = metrics(simulate_closed_loop(cluster, requests, closed.users, win, drain_s=10, seed=1))
    rate = 2 * c.achieved_rate
    offsets = open_loop_offsets(OpenLoop(), rate, win.total_s, 1)
    o_res = simulate_open_loop(cluster, build_requests(plan.workload, len(offsets), 1), offsets, win,
                               drain_s=10, seed=1)
    o = metrics(o_res)
    assert c.per_class["standard"].attainment >= 0.9  # the closed loop keeps its users served
    assert o_res.preemptions > 0  # beyond capacity: the KV cache fills, sequences are recomputed
    assert o.throughput_tok_s < 0.9 * c.throughput_tok_s, (o.throughput_tok_s, c.throughput_tok_s)
