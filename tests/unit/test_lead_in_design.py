"""Lead-in runs in the plan language, the design and the price (``design.carryover.lead_in_s``,
issue 31). The executor's side is tests/integration/test_lead_in.py."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from orchestrator.backends.base import RunKey
from orchestrator.control.design import carryover_warnings, lead_in_runs
from orchestrator.control.dryrun import DEPLOY_S, simulate_plan
from orchestrator.plan import Plan, plan_hash
from tests.unit.test_dryrun import small_plan
from tests.unit.test_plan_hashes import ROOT

LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")  # Kubernetes' own


def _with(plan: Plan, **carryover: object) -> Plan:
    data = plan.model_dump(mode="json", by_alias=True)
    data["design"]["carryover"] = carryover
    return Plan.model_validate(data)


def test_off_by_default_and_a_plan_without_it_hashes_as_before() -> None:
    plan = small_plan()
    assert plan.design.carryover.lead_in_s == 0 and lead_in_runs(plan) == {}
    assert "lead_in_s" not in plan.model_dump_json()
    assert plan_hash(_with(plan, lead_in_s=0)) == plan_hash(plan)
    assert plan_hash(_with(plan, lead_in_s=30)) != plan_hash(plan)


def test_one_lead_in_a_block_for_two_arms_and_one_per_later_run_for_more() -> None:
    plan = _with(small_plan(), lead_in_s=30)  # 3 blocks ABBA: A first, B first, A first
    assert lead_in_runs(plan) == {"A": 2, "B": 1}
    data = plan.model_dump(mode="json", by_alias=True)
    data["arms"]["C"] = dict(data["arms"]["A"])
    data["design"]["blocks"] = 6
    three = Plan.model_validate(data)
    assert sum(lead_in_runs(three).values()) == 6 * 2  # before the first run and before the third


def test_a_lead_in_names_its_resources_with_valid_labels() -> None:
    key = RunKey("exp-1", "B", 3, -2)
    assert key.is_lead_in and key.slug == "exp-1-b-b3-lead2"
    assert all(LABEL_VALUE.match(v) for v in key.labels().values()), key.labels()
    assert key.labels()["orchestrator/attempt"] == "lead2"
    assert RunKey("exp-1", "B", 3, 0).slug == "exp-1-b-b3-t0"  # measured runs keep their names


def test_the_dry_run_prices_the_lead_ins() -> None:
    plan = small_plan()
    with_lead = _with(plan, lead_in_s=60)
    base, led = simulate_plan(plan, replications=10), simulate_plan(with_lead, replications=10)
    gpus = {"A": 1, "B": 2}
    extra = sum(gpus[a] * (DEPLOY_S + 60) * k / 3600 for a, k in lead_in_runs(with_lead).items())
    assert led.gpu_hours == pytest.approx(base.gpu_hours + extra)
    assert any(n.startswith("lead-in runs: 3 (A 2, B 1)") for n in led.notes)


def test_a_bar_at_a_rate_without_lead_ins_is_warned(tmp_path) -> None:
    data = yaml.safe_load((ROOT / "examples" / "open-vs-closed.yaml").read_text())
    f = tmp_path / "plan.yaml"
    f.write_text(yaml.safe_dump(data))
    r = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "plan", "validate", str(f)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "design.carryover.lead_in_s: bar(s) standard-goodput-at-users" in r.stderr + r.stdout
    data["design"].setdefault("carryover", {})["lead_in_s"] = 60
    f.write_text(yaml.safe_dump(data))
    r = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "plan", "validate", str(f)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "lead_in_s" not in r.stderr + r.stdout
    assert carryover_warnings(small_plan()) == []  # a capacity bar: its search's resolution absorbs it


def test_a_negative_lead_in_is_refused_with_its_field_path(tmp_path) -> None:
    data = yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text())
    data.setdefault("design", {}).setdefault("carryover", {})["lead_in_s"] = -5
    f = tmp_path / "plan.yaml"
    f.write_text(yaml.safe_dump(data))
    r = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "plan", "validate", str(f)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "design.carryover.lead_in_s" in r.stderr and "Traceback" not in r.stderr
