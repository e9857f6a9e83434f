"""The Ray controller on a real local Ray cluster: `orch submit` queues experiments, a GPU pool
of one H100-PCIe runs them one at a time, status lives in the store. The experiments run on the
virtual backend (`backend: virtual`): the queue, the pool and the store are the subject, not
the servers, so each experiment takes seconds and every run is valid."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.store import Store
from tests.e2e.helpers import BASE
from tests.support.ray_head import ray_head as start_ray_head

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(900)


@pytest.fixture
def ray_head(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A local Ray head (tests/support/ray_head.py) with a GPU pool of one H100-PCIe."""
    env = {"ORCH_SKIP_CALIBRATION": "1", "ORCH_DATABASE_URL": f"sqlite:///{tmp_path / 'orch.sqlite'}",
           "ORCH_STATE_DIR": str(tmp_path / "state")}
    with start_ray_head(tmp_path, {"H100-PCIe": 1}, env) as head:
        yield head


def orch(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.main", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_submit_queues_on_gpu_pool_and_runs_to_done(ray_head, tmp_path: Path) -> None:
    address, env = ray_head
    plan = dict(BASE, name="ray-queue", backend="virtual")
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(yaml.safe_dump(plan))

    first = orch(env, "submit", str(plan_file), "--address", address, "--json")
    assert first.returncode == 0, first.stderr[-3000:]
    second = orch(env, "submit", str(plan_file), "--address", address, "--json")
    assert second.returncode == 0, second.stderr[-3000:]
    ids = [json.loads(first.stdout)["experiment_id"], json.loads(second.stdout)["experiment_id"]]
    assert json.loads(first.stdout)["gpus"] == {"H100-PCIe": 1.0}

    store = Store.open(env["ORCH_DATABASE_URL"])
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            states = [store.get_experiment(i).status for i in ids]
            if all(s in ("done", "failed", "cancelled") for s in states):
                break
            time.sleep(2)
        assert states == ["done", "done"], (states, (tmp_path / "ray-head.log").read_text()[-2000:])
        spans = []
        for i in ids:
            runs = store.runs(i)
            assert {(r.arm, r.valid) for r in runs if r.status == "done"} == {("A", True), ("B", True)}, runs
            assert {r.fingerprint["backend"] for r in runs} == {"virtual"}
            spans.append((min(r.started_at for r in runs), max(r.finished_at for r in runs)))
        # One H100-PCIe in the pool: the experiments never overlapped.
        (s1, e1), (s2, e2) = sorted(spans)
        assert e1 <= s2, spans
    finally:
        store.close()

    status = orch(env, "status", "--json")
    assert status.returncode == 0
    assert {e["status"] for e in json.loads(status.stdout)["experiments"]} == {"done"}


def test_submit_without_a_cluster_is_an_environment_error(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["ORCH_DATABASE_URL"] = f"sqlite:///{tmp_path / 'orch.sqlite'}"
    r = orch(env, "submit", "examples/quickstart.yaml")
    assert r.returncode == 2 and "no Ray cluster" in r.stderr and "Traceback" not in r.stderr
