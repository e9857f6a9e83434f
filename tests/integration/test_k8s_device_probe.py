"""`orch device probe --kubernetes` against the emulated cluster (orchestrator/kcluster/).

`orch` runs as a user runs it (a subprocess with KUBECONFIG): the official client creates the
ConfigMap and the Job through the emulated API server, the Job controller makes its pod, the
scheduler places it on the H200 node by the backend's node affinity and toleration, and the
kubelet runs the container's own command (``python /probe/device_probe.py --out - --log-line
--tiny``) on this machine with the ConfigMap mounted: the real probe script, from the ConfigMap,
on this CPU, with the vLLM venv's torch (the main venv has none; without it, a stand-in python
prints the probe file the script wrote, tests/fixtures/probe/tiny-cpu.json). Failures: an
unschedulable pod until the Job's deadline, no node of the GPU at all, the script failing.
an image that cannot be pulled, an interrupt. Each ends in one line on stderr, exit 1, and
the Job and ConfigMap deleted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.backends.kubernetes.probe_job import (
    LOG_PREFIX,
    PROBE_IMAGE,
    ProbeJobRunner,
    ProbeJobSpec,
)
from orchestrator.backends.vllm_env import VllmEnv
from orchestrator.errors import UserError
from orchestrator.sim.profiles import read_probe
from tests.support.kcluster import EmulatedCluster, cpu_node, gpu_node, loopback_ok

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "probe" / "tiny-cpu.json"
H100 = "NVIDIA-H100-80GB-HBM3"

pytestmark = [pytest.mark.skipif(not loopback_ok("127.77.0.0/16"), reason="loopback range does not bind"),
              pytest.mark.timeout(180)]


def torch_python(tmp_path: Path) -> tuple[str, bool]:
    """A python with torch (the vLLM venv's), else a stand-in that prints the fixture's result line."""
    venv = VllmEnv.default().python
    if venv.exists() and subprocess.run([str(venv), "-c", "import torch"], capture_output=True).returncode == 0:
        return str(venv), True
    stub = tmp_path / "python-stub"
    stub.write_text(f"#!{sys.executable}\nimport json\n"
                    f"print({LOG_PREFIX!r} + json.dumps(json.load(open({str(FIXTURE)!r}))), flush=True)\n")
    stub.chmod(0o755)
    return str(stub), False


def orch(cluster: EmulatedCluster, *args: str, flags: bool = False) -> subprocess.CompletedProcess[str]:
    """``orch device probe --kubernetes ARGS`` with KUBECONFIG, or ``flags``: --kubeconfig and
    --context instead (KUBECONFIG pointing nowhere)."""
    env = {**os.environ, "KUBECONFIG": cluster.kubeconfig, "ORCH_K8S_POLL_S": "0.1"}
    if flags:
        env["KUBECONFIG"] = "/nonexistent/kubeconfig"
        args = (*args, "--kubeconfig", cluster.kubeconfig, "--context", "kcluster")
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "device", "probe", "--kubernetes", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=150)


def assert_cleaned_up(cluster: EmulatedCluster) -> None:
    """The Job, its pod and the ConfigMap are gone (the pod after its graceful stop)."""
    assert cluster.objects("Job", "default") == {}
    assert [n for n in cluster.objects("ConfigMap", "default") if n.startswith("orch-device-probe")] == []
    cluster.wait_for(lambda: not cluster.pods("default"), timeout=15, what="the probe's pod to go")
    assert not cluster.live_processes()


def deletes(cluster: EmulatedCluster) -> list[str]:
    return [path for _, path in cluster.request_log("DELETE") if "orch-device-probe" in path]


def test_the_probe_runs_as_a_job_on_the_h200_pool_and_its_log_becomes_the_probe_file(tmp_path: Path) -> None:
    python, real = torch_python(tmp_path)
    out = tmp_path / "probe.json"
    with EmulatedCluster(nodes=[gpu_node("h100-1", product=H100), gpu_node("h200-1"), cpu_node()]) as cluster:
        cluster.run_on_host("pytorch/pytorch:", {"python": python})
        r = orch(cluster, "--gpu", "h200", "--tiny", "--repeats", "3", "--out", str(out))
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        # Placed by the backend's affinity on the H200 node (the H100 node has GPUs free too).
        scheduled = [e["message"] for e in cluster.events("default", reason="Scheduled")]
        assert len(scheduled) == 1 and scheduled[0].endswith(" to h200-1"), scheduled
        assert [e for e in cluster.events("default", reason="Completed") if e["involvedObject"]["kind"] == "Job"]
        assert_cleaned_up(cluster)
        assert sorted(p.split("/")[-2] for p in deletes(cluster)) == ["configmaps", "jobs"]
    p = read_probe(out)
    assert p.shape.name == "tiny-llama" and p.kv_read and p.gemm and p.steps
    if real:  # this machine's CPU, measured in the "pod" just now
        assert p.device.type == "cpu" and p.elapsed_s > 0
    else:
        assert json.loads(out.read_text()) == json.loads(FIXTURE.read_text())
    assert "tiny-llama shape" in r.stdout and f"-> {out}" in r.stdout and "GEMM:" in r.stdout
    assert f"image {PROBE_IMAGE}" in r.stdout  # the progress names what the cluster pulls


def test_a_pod_unschedulable_until_the_deadline_fails_in_one_line_and_is_cleaned_up(tmp_path: Path) -> None:
    # An H200 node with no GPU free: the scheduler says Insufficient nvidia.com/gpu, waiting may
    # help, so the command waits, until the Job's own deadline fails it.
    with EmulatedCluster(nodes=[gpu_node("h200-1", gpus=0), cpu_node()]) as cluster:
        cluster.run_on_host("pytorch/pytorch:", {"python": sys.executable})
        r = orch(cluster, "--gpu", "H200", "--timeout", "2", "--out", str(tmp_path / "p.json"))
        assert r.returncode == 1, r.stdout + r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, r.stderr
        assert "ran out of its 2 s (--timeout)" in lines[0] and "unscheduled: Unschedulable" in lines[0]
        assert "Insufficient nvidia.com/gpu" in lines[0], lines[0]
        assert [e for e in cluster.events("default", reason="DeadlineExceeded")]
        assert_cleaned_up(cluster)
    assert not (tmp_path / "p.json").exists()


def test_no_node_of_the_gpu_fails_at_once_naming_the_label_values(tmp_path: Path) -> None:
    with EmulatedCluster(nodes=[gpu_node("h100-1", product=H100), cpu_node()]) as cluster:
        r = orch(cluster, "--gpu", "H200", "--timeout", "600", "--out", str(tmp_path / "p.json"), flags=True)
        assert r.returncode == 1, r.stdout + r.stderr
        (line,) = r.stderr.strip().splitlines()
        assert line.startswith("the probe Job default/orch-device-probe-h200-"), line  # the context's namespace
        assert "no node has nvidia.com/gpu.product in [NVIDIA-H200, NVIDIA-H200-141GB-HBM3e] (H200)" in line, line
        assert_cleaned_up(cluster)


def test_a_failing_probe_script_surfaces_its_last_line(tmp_path: Path) -> None:
    crash = tmp_path / "python-crash"
    crash.write_text("#!/bin/sh\necho 'loading torch' \necho 'RuntimeError: CUDA error: no kernel image is "
                     "available for execution on the device' >&2\nexit 1\n")
    crash.chmod(0o755)
    with EmulatedCluster(nodes=[gpu_node("h200-1"), cpu_node()]) as cluster:
        cluster.run_on_host("pytorch/pytorch:", {"python": str(crash)})
        r = orch(cluster, "--gpu", "H200", "--out", str(tmp_path / "p.json"))
        assert r.returncode == 1, r.stdout + r.stderr
        (line,) = r.stderr.strip().splitlines()
        assert "the probe failed in pod orch-device-probe-h200-" in line and "on node h200-1 (exit 1, Error)" in line
        assert line.endswith("RuntimeError: CUDA error: no kernel image is available for execution on the device")
        assert [e for e in cluster.events("default", reason="BackoffLimitExceeded")]
        assert_cleaned_up(cluster)


def test_an_image_that_cannot_be_pulled_fails_after_the_grace_and_an_interrupt_still_cleans_up() -> None:
    with EmulatedCluster(nodes=[gpu_node("h200-1"), cpu_node()]) as cluster:
        with pytest.raises(UserError, match="namespace 'nope' does not exist: give --namespace"):
            ProbeJobRunner(cluster.kube_api()).run(ProbeJobSpec(gpu="H200", namespace="nope"))
        cluster.fail_image_pull(times=10_000)
        runner = ProbeJobRunner(cluster.kube_api(), poll_s=0.05, pull_grace_s=1.0)
        spec = ProbeJobSpec(gpu="H200", namespace="default", image="pytorch/pytorch:no-such-tag")
        with pytest.raises(UserError) as err:
            runner.run(spec)
        (line,) = str(err.value).splitlines()
        assert "cannot pull image pytorch/pytorch:no-such-tag" in line and "ImagePullBackOff" in line, line
        assert_cleaned_up(cluster)

        def interrupted(s: float) -> None:
            raise KeyboardInterrupt

        runner = ProbeJobRunner(cluster.kube_api(), sleep=interrupted)
        with pytest.raises(KeyboardInterrupt):
            runner.run(ProbeJobSpec(gpu="H200", namespace="default"))
        assert_cleaned_up(cluster)
