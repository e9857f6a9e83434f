"""`orch device probe --kubernetes`: the device probe as a Job on one GPU of the target pool.

The probe script (``orchestrator/sim/device_probe.py``: standard library + torch) goes into a
ConfigMap; a Job runs it once (``backoffLimit: 0``, a deadline, a TTL) in a public PyTorch image,
on a node of the GPU pool an arm of that GPU would use (the backend's node affinity, node
selector and tolerations, from ``render``), with Pod Security "restricted" settings. The result
comes back as one marked line of the pod's log (``--log-line``): no volume, no Service, nothing
to reach in the cluster but the API server. The Job and the ConfigMap are deleted whatever
happens (the ConfigMap is also owned by the Job, and the Job has a TTL, for a command that was
killed). What keeps the probe from running is one line: the scheduler's reason (no node with
the GPU, a taint, GPUs busy until the deadline), an image that cannot be pulled, OOMKilled, the
script's own last line.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.backends.kubernetes import naming
from orchestrator.backends.kubernetes.api import KubeApi, load_api_client
from orchestrator.backends.kubernetes.diagnose import no_matching_node, pod_state
from orchestrator.backends.kubernetes.render import base, gpu_affinity, pull_secrets, toleration
from orchestrator.errors import EnvironmentProblem, OrchestratorError, PermanentError, UserError
from orchestrator.plan.kubernetes import KubernetesSettings

Obj = dict[str, Any]
# A public PyTorch CUDA runtime image (torch 2.7.1, CUDA 12.8: Hopper and Blackwell, drivers >=
# 525 through CUDA's minor-version compatibility). The user's cluster pulls it; nothing here does.
PROBE_IMAGE = "pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime"
SCRIPT = Path(__file__).resolve().parents[2] / "sim" / "device_probe.py"
SCRIPT_KEY = "device_probe.py"
# The script's LOG_PREFIX (it is not imported: it stays a standalone file; a test pins the two).
LOG_PREFIX = "ORCH-DEVICE-PROBE-RESULT "
PROBE_LABEL = naming.LABEL_PREFIX + "device-probe"
DEFAULT_TIMEOUT_S = 1200
# The Job's own deadline ends a probe that overruns; this much more is the command's backstop.
CLIENT_GRACE_S = 60
# An image pull failing this long is a wrong --image or a registry the nodes cannot reach, not a
# hiccup (the kubelet's back-off reaches 5 minutes; a probe need not wait it out).
PULL_GRACE_S = 180.0


@dataclass(frozen=True)
class ProbeJobSpec:
    """What to probe where: the GPU type, the namespace, the image and the probe's options."""

    gpu: str
    namespace: str
    image: str = PROBE_IMAGE
    timeout_s: int = DEFAULT_TIMEOUT_S
    tiny: bool = False
    device: str | None = None
    repeats: int | None = None
    settings: KubernetesSettings = field(default_factory=KubernetesSettings)
    name: str = ""  # default: orch-device-probe-<gpu>-<random>
    script: str = ""  # default: the probe script of this installation

    @property
    def job_name(self) -> str:
        return self.name or probe_name(self.gpu)

    def probe_args(self) -> list[str]:
        out = ["--tiny"] if self.tiny else []
        out += ["--device", self.device] if self.device else []
        return out + (["--repeats", str(self.repeats)] if self.repeats else [])


def api_client(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """An ApiClient as the other commands build one (in-cluster, else KUBECONFIG), or from the
    given kubeconfig file and/or context (a fresh client: the library's global one is untouched)."""
    if not kubeconfig and not context:
        return load_api_client()
    from kubernetes import config

    try:
        return config.new_client_from_config(config_file=kubeconfig, context=context)
    except (config.ConfigException, OSError, KeyError, TypeError, ValueError) as e:
        where = kubeconfig or "KUBECONFIG"
        raise EnvironmentProblem(f"cannot use {where}" + (f" context {context!r}" if context else "")
                                 + f": {e}") from e


SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def default_namespace(kubeconfig: str | None = None, context: str | None = None) -> str:
    """The namespace kubectl would use: the context's, in a pod its own, else ``default``."""
    if not kubeconfig and not context and SERVICE_ACCOUNT_NAMESPACE.is_file():
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    from kubernetes import config

    try:
        contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
    except (config.ConfigException, OSError, KeyError, TypeError, ValueError):
        return "default"
    chosen = next((c for c in contexts or [] if c.get("name") == context), None) if context else active
    return str(((chosen or {}).get("context") or {}).get("namespace") or "default")


def probe_name(gpu: str) -> str:
    """A fresh name: probes of the same GPU may run side by side."""
    return naming.dns_label(f"orch-device-probe-{gpu}-{secrets.token_hex(3)}")


def render_probe_job(spec: ProbeJobSpec) -> list[Obj]:
    """The ConfigMap holding the script and the Job that runs it, in apply order."""
    k = spec.settings
    name = spec.job_name
    labels = {PROBE_LABEL: name, **naming.MANAGED_BY}
    cm = base("device-probe", "ConfigMap")
    cm["metadata"] = {"name": name, "namespace": spec.namespace,
                      "labels": {**cm["metadata"]["labels"], **labels}}
    cm["data"] = {SCRIPT_KEY: spec.script or SCRIPT.read_text()}
    job = base("device-probe", "Job")
    job["metadata"] = {"name": name, "namespace": spec.namespace,
                       "labels": {**job["metadata"]["labels"], **labels}}
    job["spec"]["activeDeadlineSeconds"] = spec.timeout_s
    tpl = job["spec"]["template"]
    tpl["metadata"]["labels"] = {**tpl["metadata"]["labels"], **labels}
    pod = tpl["spec"]
    pull_secrets(pod, k.image_pull_secrets)
    pod["affinity"] = gpu_affinity(k, spec.gpu)
    if k.node_selector:
        pod["nodeSelector"] = dict(sorted(k.node_selector.items()))
    if k.tolerations:
        pod["tolerations"] = [toleration(t) for t in k.tolerations]
    c = pod["containers"][0]
    c["image"] = spec.image
    c["imagePullPolicy"] = k.image_pull_policy
    c["command"] = [*c["command"], *spec.probe_args()]
    for vol in pod["volumes"]:
        if "configMap" in vol:
            vol["configMap"]["name"] = name
    return [cm, job]


def parse_result(log: str) -> Obj:
    """The probe document from the last result line of the pod's log."""
    for line in reversed(log.splitlines()):
        at = line.find(LOG_PREFIX)
        if at >= 0:
            try:
                doc = json.loads(line[at + len(LOG_PREFIX):])
            except ValueError as e:
                raise UserError(f"the probe's result line in the pod's log is not JSON ({e})") from None
            if isinstance(doc, dict):
                return doc
    last = _last_line(log) or "(empty log)"
    raise UserError(f"the probe's pod finished but its log holds no result line; last line: {last}")


def job_outcome(job: Obj) -> tuple[str, str] | None:
    """("complete", "") or ("failed", "Reason: message") once the Job has ended, else None.
    Kubernetes 1.31+ says so first with SuccessCriteriaMet / FailureTarget, then Complete /
    Failed once its pods are gone: either is the end."""
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("status") != "True":
            continue
        if c.get("type") in ("Complete", "SuccessCriteriaMet"):
            return ("complete", "")
        if c.get("type") in ("Failed", "FailureTarget"):
            return ("failed", f"{c.get('reason') or 'Failed'}: {c.get('message') or ''}".rstrip(": "))
    return None


def terminated(pod: Obj) -> Obj | None:
    """The probe container's terminated state (its last instance's), if it ended."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        state = cs.get("state") or {}
        if state.get("terminated"):
            return dict(state["terminated"])
        last = (cs.get("lastState") or {}).get("terminated")
        if last:
            return dict(last)
    return None


def failure_line(spec: ProbeJobSpec, ns: str, name: str, why: str, pod: Obj | None, log_tail: str | None) -> str:
    """One line for the user: what ended the probe and, where there is one, the fix."""
    where = f"the probe Job {ns}/{name}"
    if pod is None:
        return _one_line(f"{where} failed before its pod ran ({why}); see `kubectl -n {ns} describe job {name}`")
    state = pod_state(pod)
    term = terminated(pod)
    if term is not None:
        code, reason = term.get("exitCode"), term.get("reason") or "Error"
        if reason == "OOMKilled":
            limit = _memory_limit(pod)
            return _one_line(f"{where}: pod {state.name} was OOMKilled (exit {code}) on node {state.node}: "
                             f"the probe outgrew its memory limit ({limit})")
        said = log_tail or _last_line(term.get("message") or "") or "(no output)"
        return _one_line(f"{where}: the probe failed in pod {state.name} on node {state.node} "
                         f"(exit {code}, {reason}): {said}")
    if why.startswith("DeadlineExceeded"):
        return _one_line(f"{where} ran out of its {spec.timeout_s} s (--timeout) with its pod "
                         f"{_pod_words(pod)}")
    return _one_line(f"{where} failed ({why}); its pod {_pod_words(pod)}")


def _pod_words(pod: Obj) -> str:
    state = pod_state(pod)
    if state.fatal_reason:
        return f"{state.name} failed: {state.fatal_reason}"
    if state.pulling:
        return f"{state.name} cannot pull its image: {state.pulling}"
    if not state.node:
        reason = state.pending_reason or "not scheduled yet"
        busy = " (no GPU of the pool free now: a longer --timeout waits for one)" if "Insufficient" in reason else ""
        return f"{state.name} unscheduled: {reason}{busy}"
    if state.phase == "Pending":
        return f"{state.name} starting on node {state.node} (image pull, container creation)"
    return f"{state.name} {state.phase} on node {state.node}"


def _memory_limit(pod: Obj) -> str:
    for c in (pod.get("spec") or {}).get("containers") or []:
        limit = ((c.get("resources") or {}).get("limits") or {}).get("memory")
        if limit:
            return str(limit)
    return "none set"


def _last_line(text: str) -> str:
    return next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "")


def _one_line(text: str) -> str:
    return " ".join(text.split())


class ProbeJobRunner:
    """Create the probe's objects, wait for its Job, read the result, delete the objects."""

    def __init__(self, api: KubeApi, poll_s: float = 2.0, log: Callable[[str], None] | None = None,
                 pull_grace_s: float = PULL_GRACE_S, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.api = api
        self.poll_s = poll_s
        self.log = log or (lambda line: None)
        self.pull_grace_s = pull_grace_s
        self._clock, self._sleep = clock, sleep

    def run(self, spec: ProbeJobSpec) -> Obj:
        """The probe document (the JSON the script writes), or a UserError in one line."""
        cm, job = render_probe_job(spec)
        ns, name = spec.namespace, job["metadata"]["name"]
        created: list[tuple[str, str]] = []
        try:
            self.api.apply(cm)
            created.append(("ConfigMap", name))
            done = self.api.apply(job)
            created.append(("Job", name))
            uid = (done.get("metadata") or {}).get("uid")
            if uid:  # the garbage collector takes the script with the Job (its TTL, a kill of ours)
                cm["metadata"]["ownerReferences"] = [
                    {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid}]
                self.api.apply(cm)
            self.log(f"probe Job {ns}/{name}: {spec.gpu}, image {spec.image}, deadline {spec.timeout_s} s")
            pod = self._wait(spec, ns, name)
            return parse_result(self.api.pod_log(ns, pod["metadata"]["name"]))
        except PermanentError as e:
            if f'namespaces "{ns}" not found' in str(e):
                raise UserError(f"namespace {ns!r} does not exist: give --namespace with one that does") from None
            raise
        finally:
            self._delete(ns, created)

    def _wait(self, spec: ProbeJobSpec, ns: str, name: str) -> Obj:
        deadline = self._clock() + spec.timeout_s + CLIENT_GRACE_S
        pulling_since: float | None = None
        shown = ""
        last_pod: Obj | None = None
        while True:
            job = self.api.get("Job", name, ns)
            if job is None:
                raise UserError(f"the probe Job {ns}/{name} was deleted while it ran")
            pods = self.api.list("Pod", ns, labels=f"{PROBE_LABEL}={name}")
            if pods:
                last_pod = max(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "")
            outcome = job_outcome(job)
            if outcome is not None and outcome[0] == "complete":
                if last_pod is None:
                    raise UserError(f"the probe Job {ns}/{name} completed but its pod is gone: no log to read")
                return last_pod
            if outcome is not None:
                raise UserError(failure_line(spec, ns, name, outcome[1], last_pod, self._log_tail(ns, last_pod)))
            now = self._clock()
            if last_pod is not None:
                state = pod_state(last_pod)
                self._fail_fast(spec, ns, name, last_pod)
                if state.pulling:
                    pulling_since = pulling_since if pulling_since is not None else now
                    if now - pulling_since >= self.pull_grace_s:
                        raise UserError(_one_line(
                            f"the probe Job {ns}/{name}: pod {state.name} cannot pull image {spec.image} "
                            f"for {now - pulling_since:.0f} s ({state.pulling}); give --image one the nodes can "
                            "pull, or the pull secret in the settings of --plan"))
                else:
                    pulling_since = None
                line = _pod_words(last_pod)
            else:
                line = "waiting for the Job's pod"
            if line != shown:
                self.log(f"probe Job {ns}/{name}: {line}")
                shown = line
            if now >= deadline:
                raise UserError(failure_line(spec, ns, name, "DeadlineExceeded", last_pod, None))
            self._sleep(self.poll_s)

    def _fail_fast(self, spec: ProbeJobSpec, ns: str, name: str, pod: Obj) -> None:
        """What waiting cannot fix: a container that cannot be created, a taint the pod does not
        tolerate, no node of the GPU type at all (busy GPUs are waited for, up to the deadline)."""
        state = pod_state(pod)
        where = f"the probe Job {ns}/{name}"
        if state.fatal_reason:
            raise UserError(_one_line(f"{where}: pod {state.name} {state.fatal_reason}"))
        reason = state.pending_reason or ""
        if "untolerated taint" in reason and "Insufficient" not in reason:
            raise UserError(_one_line(
                f"{where}: pod {state.name} unschedulable: {reason}; the GPU nodes carry a taint the probe "
                "does not tolerate: give --plan with kubernetes.tolerations that tolerate it"))
        if no_matching_node(state) and not self._gpu_nodes_exist(spec):
            k = spec.settings
            values = ", ".join(k.product_labels(spec.gpu))
            raise UserError(_one_line(
                f"{where}: pod {state.name} unschedulable: no node has {k.gpu_product_label} in [{values}] "
                f"({spec.gpu}); check --gpu, or give --plan whose kubernetes.gpu_products names this "
                "cluster's values"))

    def _gpu_nodes_exist(self, spec: ProbeJobSpec) -> bool:
        k = spec.settings
        try:
            return bool(self.api.list("Node", labels=f"{k.gpu_product_label} in ({','.join(k.product_labels(spec.gpu))})"))
        except PermanentError:  # not allowed to list nodes: cannot tell, so wait for the deadline
            return True

    def _log_tail(self, ns: str, pod: Obj | None) -> str | None:
        if pod is None or terminated(pod) is None:
            return None
        try:
            return _last_line(self.api.pod_log(ns, pod["metadata"]["name"])) or None
        except OrchestratorError:
            return None

    def _delete(self, ns: str, created: list[tuple[str, str]]) -> None:
        for kind, name in reversed(created):
            try:
                self.api.delete(kind, name, ns)
            except OrchestratorError as e:  # the run's own outcome is what to report
                self.log(f"could not delete {kind} {ns}/{name}: {e} (delete it by hand)")
