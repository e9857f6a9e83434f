"""Issue 29: weights are fetched once, not per attempt: a 4-block `orch run --backend kubernetes`
on the emulated cluster with the chart's weights claim (ORCH_K8S_MODEL_CACHE_PVC, what
modelCache sets) downloads the model once for every vLLM pod of every run, counted by the
emulated kubelet (which does with HF_HOME what vLLM does); each run stores its start-up time
and weights source. Real time with the plan's default guards: validity is not asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.backends.base import Fingerprint
from orchestrator.store import Store
from tests.support.kcluster import EmulatedCluster, cpu_node, gpu_node, loopback_ok

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "tests" / "e2e" / "plans" / "k8s-quickstart.yaml"
NAMESPACE, CLAIM = "llm-bench", "bench-orchestrator-model-cache"

pytestmark = [pytest.mark.timeout(900),
              pytest.mark.skipif(not loopback_ok("127.77.0.0/16"), reason="loopback range does not bind")]


def test_a_four_block_experiment_fetches_the_weights_once(tmp_path: Path) -> None:
    doc = yaml.safe_load(PLAN.read_text())
    doc["name"] = "k8s-weights"
    doc["design"]["blocks"] = 4
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(yaml.safe_dump(doc))
    nodes = [gpu_node("h200-a", pool="h200-pool"), gpu_node("h200-b", pool="h200-pool"), cpu_node()]
    with EmulatedCluster(nodes=nodes) as cluster:
        cluster.add_pvc(NAMESPACE, CLAIM)
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "ORCH_K8S_NAMESPACE": NAMESPACE,
               "ORCH_K8S_MODEL_CACHE_PVC": CLAIM, "ORCH_SKIP_CALIBRATION": "1",
               "ORCH_DATABASE_URL": f"sqlite:///{tmp_path / 'orch.sqlite'}",
               "ORCH_STATE_DIR": str(tmp_path / "state"), "ORCH_K8S_POLL_S": "0.2"}
        r = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "run", str(plan_file), "--backend",
                            "kubernetes", "--json", "--allow-low-power"], cwd=ROOT, capture_output=True, text=True,
                           env=env, timeout=800)
        assert r.returncode == 0, r.stderr[-4000:]
        out = json.loads(r.stdout)
        store = Store.open(env["ORCH_DATABASE_URL"])
        try:
            runs = store.runs(out["experiment"]["id"])
            assert {(x.block, x.arm) for x in runs} == {(b, a) for b in range(4) for a in "AB"}
            for run in runs:
                startup = Fingerprint.from_dict(run.fingerprint).details["startup"]
                assert startup["weights"] == f"PersistentVolumeClaim {CLAIM}" and startup["seconds"] > 0
        finally:
            store.close()
        # Every vLLM pod of every run (2 per run) loaded the model; one of them downloaded it.
        fetched = [f for f in cluster.weights.fetches if f.model == "Qwen/Qwen3-8B"]
        assert len(fetched) == 1 and fetched[0].volume == "persistentVolumeClaim", fetched
        assert "serving" in r.stderr and "weights: PersistentVolumeClaim" in r.stderr
