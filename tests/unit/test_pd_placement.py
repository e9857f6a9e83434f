"""Issue 29: prefill/decode placement as a factor and a fingerprint. The plan pins it
(kubernetes.placement renders required pod (anti-)affinity between the run's prefill and
decode pods), the backend observes it (analysis.guards.pd_placement_of over the pods' nodes),
and a block whose placement for an arm differs from the first counted block is not compared
(analysis.guards.placement_consistency)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.analysis.guards import pd_placement_of, placement_consistency
from orchestrator.backends.base import RunKey
from orchestrator.backends.kubernetes import naming
from orchestrator.backends.kubernetes.render import render_arm
from orchestrator.plan import Plan, load_plan_file, plan_hash, validate_plan
from tests.unit.test_k8s_render import assert_valid_k8s

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
DISAGG = ROOT / "examples" / "disagg-vs-colocated-h200.yaml"


def test_placement_is_read_from_the_nodes_of_each_role() -> None:
    assert pd_placement_of(["n1"], ["n1"]) == "same-node"
    assert pd_placement_of(["n1", "n2"], ["n2", "n1"]) == "same-node"
    assert pd_placement_of(["n1"], ["n2"]) == "cross-node"
    assert pd_placement_of(["n1", "n2"], ["n2"]) == "mixed"


def test_a_block_is_compared_only_under_the_placement_of_the_first_counted_block() -> None:
    assert placement_consistency("B", "cross-node", None).passed  # the first block sets it
    assert placement_consistency("B", "same-node", (0, "same-node")).passed
    g = placement_consistency("B", "cross-node", (0, "same-node"))
    assert not g.passed and g.name == "pd_placement"
    assert "cross-node here, same-node in block 0" in g.detail and "kubernetes.placement" in g.detail


def _plan(placement: str | None) -> Plan:
    plan = load_plan_file(DISAGG)
    if placement is None:
        return plan
    doc = plan.model_dump(mode="json", by_alias=True, exclude_none=True)
    doc["kubernetes"] = {**doc.get("kubernetes", {}), "placement": placement}
    return validate_plan(doc)


def _affinity(plan: Plan, role: str) -> dict[str, Any]:
    objs = render_arm(plan, "B", RunKey(plan.name, "B", 0))
    (dep,) = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["labels"][naming.ROLE_LABEL] == role]
    for o in objs:
        assert_valid_k8s(o, f"placement {plan.kubernetes.placement}:")
    return dep["spec"]["template"]["spec"]["affinity"]


def test_placement_renders_required_pod_affinity_between_the_runs_prefill_and_decode() -> None:
    free = _plan(None)
    assert free.kubernetes.placement == "free"
    assert set(_affinity(free, "prefill")) == {"nodeAffinity"}  # the scheduler decides
    assert plan_hash(free) == plan_hash(_plan("free"))  # left out of the canonical plan at its default

    same = _affinity(_plan("same-node"), "decode")
    (term,) = same["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchExpressions"] == [
        {"key": naming.ROLE_LABEL, "operator": "In", "values": ["prefill", "decode"]}]
    assert naming.RUN_LABEL in term["labelSelector"]["matchLabels"]  # this run's pods only

    for role, other in (("prefill", "decode"), ("decode", "prefill")):
        spread = _affinity(_plan("spread"), role)
        (term,) = spread["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["labelSelector"]["matchLabels"][naming.ROLE_LABEL] == other
    # A colocated arm has no prefill/decode pair: nothing added.
    plan = _plan("spread")
    objs = render_arm(plan, "A", RunKey(plan.name, "A", 0))
    assert all(set(o["spec"]["template"]["spec"].get("affinity", {})) <= {"nodeAffinity"}
               for o in objs if o["kind"] == "Deployment")
