"""The device probe's Job (`orch device probe --kubernetes`): strictly valid objects, placed as the
backend places an arm of the GPU, Pod Security "restricted", and the words a failure ends in."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.backends.base import RunKey
from orchestrator.backends.kubernetes import probe_job
from orchestrator.backends.kubernetes.probe_job import (
    LOG_PREFIX,
    SCRIPT,
    ProbeJobSpec,
    default_namespace,
    failure_line,
    job_outcome,
    parse_result,
    render_probe_job,
)
from orchestrator.backends.kubernetes.render import render_arm
from orchestrator.cli import device_cmd
from orchestrator.cli.main import main
from orchestrator.errors import UserError
from orchestrator.plan import validate_plan
from orchestrator.sim import device_probe
from tests.unit.test_k8s_render import ROOT, assert_valid_k8s, pod_security_problems

NAME = "orch-device-probe-h200-abc123"


def _render(**kw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    cm, job = render_probe_job(ProbeJobSpec(gpu=kw.pop("gpu", "H200"), namespace="ml", name=NAME, **kw))
    return cm, job


def _plan(kubernetes: dict[str, Any]) -> Any:
    data = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    data["backend"] = "kubernetes"
    data["kubernetes"] = kubernetes
    return validate_plan(data)


def test_the_configmap_and_job_validate_strictly_against_the_kubernetes_schemas() -> None:
    for obj in render_probe_job(ProbeJobSpec(gpu="H200", namespace="ml", tiny=True, repeats=3, device="cuda")):
        assert_valid_k8s(obj, "device probe:")
    plan = _plan({"namespace": "ml", "image_pull_secrets": ["creds"], "node_selector": {"pool": "gpu"},
                  "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "h200", "effect": "NoSchedule"}]})
    for obj in render_probe_job(ProbeJobSpec(gpu="H100-SXM", namespace="ml", settings=plan.kubernetes)):
        assert_valid_k8s(obj, "device probe with settings:")


def test_the_job_runs_once_with_a_deadline_a_ttl_and_one_gpu() -> None:
    cm, job = _render(timeout_s=900, tiny=True, repeats=3)
    assert [cm["kind"], job["kind"]] == ["ConfigMap", "Job"]
    spec = job["spec"]
    assert spec["backoffLimit"] == 0 and spec["activeDeadlineSeconds"] == 900 and spec["ttlSecondsAfterFinished"] > 0
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    (c,) = pod["containers"]
    assert c["image"] == probe_job.PROBE_IMAGE
    assert c["command"] == ["python", "/probe/device_probe.py", "--out", "-", "--log-line", "--tiny", "--repeats", "3"]
    assert c["resources"]["requests"]["nvidia.com/gpu"] == c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # The script the pod runs is this installation's, byte for byte, from the ConfigMap it mounts.
    assert cm["data"] == {"device_probe.py": SCRIPT.read_text()}
    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert vols[mounts["/probe"]]["configMap"]["name"] == cm["metadata"]["name"] == job["metadata"]["name"] == NAME
    # Both objects and the pod carry the label the command finds the pod by.
    for labels in (cm["metadata"]["labels"], job["metadata"]["labels"], spec["template"]["metadata"]["labels"]):
        assert labels[probe_job.PROBE_LABEL] == NAME and labels["app.kubernetes.io/managed-by"] == "orchestrator"
    assert job["metadata"]["namespace"] == cm["metadata"]["namespace"] == "ml"


def test_the_pod_is_restricted_with_a_read_only_root_and_tmp_on_an_empty_dir() -> None:
    _, job = _render()
    pod = job["spec"]["template"]["spec"]
    assert pod_security_problems(pod, "restricted") == []
    psc, (c,) = pod["securityContext"], pod["containers"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0 and psc["seccompProfile"]["type"] == "RuntimeDefault"
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["readOnlyRootFilesystem"] is True
    tmp = next(m for m in c["volumeMounts"] if m["mountPath"] == "/tmp")
    assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == tmp["name"])
    assert {"name": "HOME", "value": "/tmp"} in c["env"]
    # The check sees what the settings guard: a root user is out.
    bad = copy.deepcopy(pod)
    bad["securityContext"]["runAsUser"] = 0
    assert pod_security_problems(bad, "restricted")


@pytest.mark.parametrize("kubernetes", [
    {},
    {"gpu_product_label": "cloud.google.com/gke-accelerator", "gpu_products": {"H200": ["nvidia-h200-141gb"]},
     "node_selector": {"pool": "gpu"}, "image_pull_secrets": ["creds"], "image_pull_policy": "Always",
     "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "h200", "effect": "NoSchedule"}]},
], ids=["catalog", "cluster-settings"])
def test_the_pod_lands_where_the_backend_puts_an_arm_of_that_gpu(kubernetes: dict[str, Any]) -> None:
    plan = _plan(kubernetes)
    worker = next(o for o in render_arm(plan, "A", RunKey(plan.name, "A", 0))
                  if o["kind"] == "Deployment" and o["metadata"]["labels"]["orchestrator/role"] == "worker")
    arm_pod = worker["spec"]["template"]["spec"]
    assert plan.arm("A").gpu == "H200"
    _, job = _render(settings=plan.kubernetes)
    pod = job["spec"]["template"]["spec"]
    for key in ("affinity", "nodeSelector", "tolerations", "imagePullSecrets"):
        assert pod.get(key) == arm_pod.get(key), key
    assert pod["containers"][0]["imagePullPolicy"] == arm_pod["containers"][0]["imagePullPolicy"]
    values = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"][0]["values"]
    assert values == list(plan.kubernetes.product_labels("H200"))  # the catalog's unless overridden


def test_the_result_line_is_found_among_other_output_and_a_missing_one_is_named() -> None:
    doc = json.loads((ROOT / "tests" / "fixtures" / "probe" / "tiny-cpu.json").read_text())
    log = ("/opt/conda/lib/python3.11/site-packages/torch/cuda/__init__.py: UserWarning: something\n"
           f"{LOG_PREFIX}{json.dumps(doc, separators=(',', ':'))}\nexiting\n")
    assert parse_result(log) == doc
    with pytest.raises(UserError, match="holds no result line; last line: Killed"):
        parse_result("loading\nKilled\n")


def test_the_log_prefix_and_defaults_are_the_scripts_and_the_clis() -> None:
    assert LOG_PREFIX == device_probe.LOG_PREFIX
    assert (device_cmd.PROBE_IMAGE, device_cmd.DEFAULT_TIMEOUT_S) == (probe_job.PROBE_IMAGE, probe_job.DEFAULT_TIMEOUT_S)
    assert SCRIPT == device_cmd.PROBE_SCRIPT


def test_the_scripts_log_line_leaves_its_local_output_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    doc = {"kind": device_probe.KIND, "x": [1, 2]}
    monkeypatch.setattr(device_probe, "probe", lambda tiny, device, repeats: doc)
    device_probe.main(["--out", "-"])
    assert capsys.readouterr().out == json.dumps(doc, indent=1) + "\n"
    device_probe.main(["--out", "-", "--log-line"])
    assert capsys.readouterr().out == LOG_PREFIX + json.dumps(doc, separators=(",", ":")) + "\n"
    device_probe.main(["--out", str(tmp_path / "p.json"), "--log-line"])
    assert capsys.readouterr().out.startswith(LOG_PREFIX)
    assert json.loads((tmp_path / "p.json").read_text()) == doc


def test_job_outcomes_of_old_and_new_clusters() -> None:
    def job(*conds: tuple[str, str, str]) -> dict[str, Any]:
        return {"status": {"conditions": [{"type": t, "status": s, "reason": r, "message": "m"} for t, s, r in conds]}}

    assert job_outcome(job()) is None
    assert job_outcome(job(("Complete", "True", ""))) == ("complete", "")
    assert job_outcome(job(("SuccessCriteriaMet", "True", "CompletionsReached"))) == ("complete", "")
    assert job_outcome(job(("FailureTarget", "True", "DeadlineExceeded"))) == ("failed", "DeadlineExceeded: m")
    assert job_outcome(job(("Failed", "True", "BackoffLimitExceeded"))) == ("failed", "BackoffLimitExceeded: m")
    assert job_outcome(job(("Failed", "False", "x"))) is None


def _pod(status: dict[str, Any], node: str | None = "h200-1") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "probe", "resources": {"limits": {"memory": "16Gi"}}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": "p-1", "labels": {}}, "spec": spec, "status": status}


def test_failures_read_as_one_line_with_the_pods_reason() -> None:
    spec = ProbeJobSpec(gpu="H200", namespace="ml", timeout_s=600)
    oom = _pod({"phase": "Failed", "containerStatuses": [
        {"name": "probe", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]})
    line = failure_line(spec, "ml", NAME, "BackoffLimitExceeded: Job has reached the specified backoff limit", oom, None)
    assert line == (f"the probe Job ml/{NAME}: pod p-1 was OOMKilled (exit 137) on node h200-1: "
                    "the probe outgrew its memory limit (16Gi)")
    pulling = _pod({"phase": "Pending", "containerStatuses": [{"name": "probe", "state": {"waiting": {
        "reason": "ImagePullBackOff", "message": 'Back-off pulling image "pytorch/pytorch:nope"'}}}]})
    line = failure_line(spec, "ml", NAME, "DeadlineExceeded: Job was active longer than specified deadline", pulling, None)
    assert line.startswith(f"the probe Job ml/{NAME} ran out of its 600 s (--timeout) with its pod p-1 cannot pull")
    assert "ImagePullBackOff" in line and "\n" not in line
    crashed = _pod({"phase": "Failed", "containerStatuses": [{"name": "probe", "state": {"terminated": {
        "exitCode": 1, "reason": "Error", "message": "Traceback (most recent call last):\n  ...\nOSError: boom\n"}}}]})
    assert failure_line(spec, "ml", NAME, "BackoffLimitExceeded", crashed, None).endswith("(exit 1, Error): OSError: boom")
    assert failure_line(spec, "ml", NAME, "BackoffLimitExceeded", crashed, "last log line").endswith(": last log line")
    assert "before its pod ran" in failure_line(spec, "ml", NAME, "FailedCreate", None, None)


def test_the_default_namespace_is_the_kubeconfig_contexts(tmp_path: Path) -> None:
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "a",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "a", "context": {"cluster": "c", "user": "u", "namespace": "ml"}},
                     {"name": "b", "context": {"cluster": "c", "user": "u"}}]}))
    assert default_namespace(str(cfg)) == "ml"
    assert default_namespace(str(cfg), "b") == "default"
    assert default_namespace(str(tmp_path / "missing")) == "default"


def test_cluster_flags_without_kubernetes_and_kubernetes_without_gpu_are_refused(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["device", "probe", "--gpu", "H200"]) == 1
    assert "--gpu: only with --kubernetes" in capsys.readouterr().err
    assert main(["device", "probe", "--kubernetes"]) == 1
    assert "--kubernetes needs --gpu" in capsys.readouterr().err
    assert main(["device", "probe", "--kubernetes", "--gpu", "Z9000"]) == 1
    assert "--gpu: unknown GPU type 'Z9000'" in capsys.readouterr().err
