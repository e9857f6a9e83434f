"""Issue 29: blocks are compared only under one prefill/decode placement per arm. A backend
that observed arm B's prefill and decode on one node in block 0 and on two in block 1 (what a
cluster scheduling freely does) gets block 1's B run a failing pd_placement guard: the run is
not counted and the verdict uses block 0 and 2 only. The executor, store and verdicts are real;
the engine's records come from the simulator in virtual time (no socket, no process)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.backends.base import Deployment
from orchestrator.backends.virtual import VirtualBackend
from orchestrator.control.executor import Executor, ExecutorConfig
from orchestrator.control.progress import PlainProgress
from orchestrator.store import Store
from tests.e2e.helpers import small_plan

pytestmark = pytest.mark.timeout(180)
SEARCH = {"rate": {"min": 1, "max": 4}, "precision": 0.25, "point_s": 2, "warmup_s": 0.5,
          "cooldown_s": 0.5, "max_points": 2, "use_prior": False}


class Placed(VirtualBackend):
    """The virtual backend whose arm B runs report where their prefill and decode pods ran."""

    def __init__(self, by_block: dict[int, str]):
        super().__init__()
        self.by_block = by_block

    def ready(self, deployment: Deployment, deadline_s: float) -> None:
        super().ready(deployment, deadline_s)
        key = deployment.key
        if key.arm == "B":
            observed = self.by_block[key.block]
            nodes = (["n1"], ["n1"]) if observed == "same-node" else (["n1"], ["n2"])
            deployment.fingerprint = replace(deployment.fingerprint, details={
                **deployment.fingerprint.details,
                "pd_placement": {"observed": observed, "prefill": nodes[0], "decode": nodes[1]}})


def test_a_block_whose_placement_differs_is_not_compared(store: Store, tmp_path: Path, no_sockets: None) -> None:
    plan = small_plan(name="placement", search=SEARCH, design={"blocks": 3, "order": "ABBA", "seed": 5,
                                                               "max_retries": 0},
                      bars=[{"id": "cap", "metric": "capacity", "class": "standard", "at_least": 0.5,
                             "confidence": 0.9}])
    backend = Placed({0: "same-node", 1: "cross-node", 2: "same-node"})
    out = Executor(store, backend, ExecutorConfig(state_dir=tmp_path / "state"), PlainProgress()).run(plan)
    runs = {(r.block, r.arm): r for r in store.runs(out.experiment_id)}
    guards = {k: [g for g in store.guard_results(r.id) if g.name == "pd_placement"] for k, r in runs.items()}
    assert all(not guards[(b, "A")] for b in range(3)), "a colocated arm has no placement to compare"
    assert [g.passed for g in guards[(0, "B")]] == [True]
    (bad,) = guards[(1, "B")]
    assert not bad.passed and "cross-node here, same-node in block 0" in bad.detail
    assert [g.passed for g in guards[(2, "B")]] == [True]
    (verdict,) = out.bars
    assert verdict.blocks == [0, 2], verdict.blocks
    assert "pd_placement guard failed" in verdict.dropped[1], verdict.dropped
