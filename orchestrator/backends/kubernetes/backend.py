"""KubernetesBackend: deploy an arm with server-side apply, wait for it, scrape it, tear it down.

One run's objects are labelled with experiment, run, arm and role and owned by one ConfigMap,
so teardown is one delete on a real cluster (the garbage collector takes the dependents); the
backend also deletes each object it applied, and ``cleanup`` finds leftovers of a crashed
attempt by label, so neither depends on the garbage collector.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from orchestrator import logs
from orchestrator.analysis.guards import pd_placement_of
from orchestrator.backends.base import Deployment, Endpoint, Fingerprint, RunKey
from orchestrator.backends.kubernetes import naming
from orchestrator.backends.kubernetes.api import KubeApi, in_cluster, load_api_client
from orchestrator.backends.kubernetes.diagnose import (
    PodState,
    failed_create_events,
    no_matching_node,
    pod_state,
    progress_line,
    replica_failure,
    unschedulable_fix,
    warning_events,
)
from orchestrator.backends.kubernetes.render import (
    HTTP_PORT,
    LOADGEN_ROLE,
    ROUTER_METRICS_PORT,
    kv_transport,
    owner_reference,
    render_arm,
    render_load_generator,
    weights_source,
)
from orchestrator.backends.readiness import wait_until_serving
from orchestrator.engines import ENGINES, engine_for
from orchestrator.errors import OrchestratorError, PermanentError, TransientError, UserError
from orchestrator.loadgen.path import measure_path
from orchestrator.loadgen.remote import RemoteDriver
from orchestrator.plan import Plan, plan_hash

_log = logs.get_logger(__name__)

# GPU Feature Discovery labels read for the environment fingerprint.
DRIVER_LABELS = ("nvidia.com/cuda.driver-version.full", "nvidia.com/cuda.driver.major")
# Node pool labels of the common managed clusters (GKE, EKS, AKS, Karpenter, OpenShift).
NODE_POOL_LABELS = (
    "cloud.google.com/gke-nodepool", "eks.amazonaws.com/nodegroup", "kubernetes.azure.com/agentpool",
    "karpenter.sh/nodepool", "node.kubernetes.io/instance-type",
)
# Kinds a run creates in its namespace, deleted in this order by cleanup (router first).
RUN_KINDS = ("Deployment", "Service", "RoleBinding", "Role", "ServiceAccount", "ConfigMap")
PLAN_HASH_ANNOTATION = "orchestrator/plan-sha256"


@dataclass
class KubeHandles:
    """What the Kubernetes backend keeps of a deployed arm: where its objects are and what
    ready() waits for."""

    namespace: str
    engine: str
    run: str  # the run's name (objects' prefix, the port-forward's key)
    run_selector: str  # label selector of the run's pods
    objects: list[tuple[str, str]]  # (kind, name) in creation order
    deployments: list[str]
    router_service: str
    use_service: bool  # reach the router through its Service (in the cluster), not a port-forward
    expected_pods: int
    gpu_label: str
    gpu_values: list[str]
    restarts_at_ready: int | None = None  # container restarts counted when it became ready
    # The run's in-cluster load generator (orch outside the cluster): its pods' selector.
    loadgen_selector: str | None = None
    deployed_at: float = 0.0  # time.monotonic() at deploy: the start-up time is measured from it


class KubernetesBackend:
    """The Backend protocol on a Kubernetes cluster (see orchestrator/backends/base.py)."""

    name = "kubernetes"

    def __init__(
        self,
        api: KubeApi | None = None,
        namespace: str | None = None,
        endpoint_url: str | None = None,
        poll_s: float = 2.0,
        probe: Callable[[Endpoint, float], None] | None = None,
        log: Callable[[str], None] | None = None,  # None: this module's logger (orchestrator.logs)
    ):
        """``namespace`` overrides the plan's (the chart sets ORCH_K8S_NAMESPACE to its own);
        ``endpoint_url`` reaches the router at a fixed URL (an ingress, or a port-forward run
        by hand; ORCH_K8S_ENDPOINT) instead of the Service or a port-forward of our own."""
        self._api = api
        self.namespace = namespace or os.environ.get("ORCH_K8S_NAMESPACE") or None
        # The chart's weights cache (modelCache: a ReadWriteMany claim in its namespace), used by
        # every plan that names no weights source of its own.
        self.model_cache_pvc = os.environ.get("ORCH_K8S_MODEL_CACHE_PVC") or None
        self._warned: set[str] = set()  # experiments told that each pod downloads the weights
        self.endpoint_url = endpoint_url or os.environ.get("ORCH_K8S_ENDPOINT") or None
        self.poll_s = poll_s
        self.probe = probe or probe_completion
        self.log = log or _log.info
        self._namespaces: dict[str, set[str]] = {}  # experiment -> namespaces deployed to
        self._given: dict[str, set[str]] = {}  # experiment -> of those, namespaces it did not create
        self._forwards: dict[str, list[Any]] = {}  # run name -> its PortForwards

    @classmethod
    def from_environment(cls, log: Callable[[str], None] | None = None) -> KubernetesBackend:
        """The backend as `orch run --backend kubernetes` and the Ray controller build it: the
        cluster from the in-cluster service account or KUBECONFIG, ORCH_K8S_NAMESPACE and
        ORCH_K8S_ENDPOINT from the environment. Fails here, not at the first deploy, when no
        cluster is configured."""
        poll = float(os.environ.get("ORCH_K8S_POLL_S") or 2.0)
        return cls(api=KubeApi(load_api_client()), poll_s=poll, log=log)

    def sends_load_here(self, plan: Plan) -> bool:
        """In the cluster (the Service) or to a fixed URL; outside it each run's load-generator
        pod sends the load."""
        return self.endpoint_url is not None or self._use_service(plan)

    def startup_budget_s(self, plan: Plan, arm: str) -> float:
        """The plan's start-up budget (image pull, weights, compile, CUDA graphs)."""
        return float(plan.kubernetes.startup_timeout_s)

    @property
    def api(self) -> KubeApi:
        if self._api is None:
            self._api = KubeApi(load_api_client())
        return self._api

    # -- deploy ---------------------------------------------------------------------------

    def deploy(self, plan: Plan, arm: str, key: RunKey) -> Deployment:
        """Apply the arm's objects (server-side apply). What waiting cannot fix is refused
        before anything is applied (a missing weights claim); a deploy that fails half-way
        deletes what it applied, so a retry never competes with its own leftovers for GPUs."""
        hashed, plan = plan, self._with_weights_cache(plan)
        objs = render_arm(plan, arm, key, namespace=self.namespace)
        use_service = self.endpoint_url is None and self._use_service(plan)
        # Outside the cluster, the load is sent from a pod next to the router (measured traffic
        # never crosses the port-forward); this process keeps control.
        agent = self.endpoint_url is None and not use_service
        if agent:
            if plan.workload.kind == "closed":
                raise UserError(
                    "workload.closed: a closed loop is measured from inside the cluster only (its users "
                    "pace themselves by each reply, so they run where orch runs): run it with `orch "
                    "submit` on the chart, or from a pod in the cluster (kubernetes.access: service)")
            if plan.workload.kind == "sessions" and plan.workload.source is not None:
                raise UserError(
                    "workload.source: a data file replayed as sessions is read where its sessions are "
                    "played (each turn is built from the reply before it), and the in-cluster load "
                    "generator does not have the file: run from a pod in the cluster that has it "
                    "(kubernetes.access: service)")
            objs.append(render_load_generator(plan, key, objs[-1]["metadata"]["namespace"]))
        owned = objs[0]["kind"] == "Namespace"  # the tool's own namespace for the experiment
        if owned:
            self._ensure_namespace(objs.pop(0), float(plan.kubernetes.startup_timeout_s))
        owner, rest = objs[0], objs[1:]
        ns = owner["metadata"]["namespace"]
        self._namespaces.setdefault(key.experiment, set()).add(ns)
        if not owned:
            self._given.setdefault(key.experiment, set()).add(ns)
        self._check_weights(plan, ns)
        self._warn_downloads(plan, key.experiment)
        owner["metadata"]["annotations"] = {PLAN_HASH_ANNOTATION: plan_hash(hashed)}
        applied: list[tuple[str, str]] = []
        try:
            done = self.api.apply(owner)
            applied.append(("ConfigMap", owner["metadata"]["name"]))
            refs = [owner_reference(done)] if (done.get("metadata") or {}).get("uid") else []
            for obj in rest:
                if refs:
                    obj["metadata"]["ownerReferences"] = refs
                self.api.apply(obj)
                applied.append((obj["kind"], obj["metadata"]["name"]))
        except BaseException:
            self._delete_all(ns, applied)
            raise
        arm_spec = plan.arm(arm)
        return Deployment(
            key=key,
            endpoint=Endpoint(url=self.endpoint_url or "", model=engine_for(arm_spec).served_name(plan)),
            fingerprint=Fingerprint(backend=self.name, engine_version=arm_spec.engine.version,
                                    gpu_type=arm_spec.gpu, namespace=ns,
                                    kv_transport=kv_transport(plan, arm_spec),
                                    details={"weights": weights_source(plan)}),
            handles=KubeHandles(
                namespace=ns,
                engine=arm_spec.engine.kind,
                run=naming.run_name(key),
                run_selector=f"{naming.RUN_LABEL}={naming.run_labels(key)[naming.RUN_LABEL]}",
                objects=[(o["kind"], o["metadata"]["name"]) for o in objs],
                deployments=[o["metadata"]["name"] for o in objs if o["kind"] == "Deployment"],
                router_service=naming.object_name(key, "router"),
                use_service=use_service,
                expected_pods=sum(p.replicas for p in arm_spec.pools().values()) + 1,
                gpu_label=plan.kubernetes.gpu_product_label,
                gpu_values=list(plan.kubernetes.product_labels(arm_spec.gpu or "")),
                loadgen_selector=(f"{naming.RUN_LABEL}={naming.label_value(naming.object_name(key, LOADGEN_ROLE))}"
                                  if agent else None),
                deployed_at=time.monotonic(),
            ),
        )

    def _ensure_namespace(self, ns_obj: dict[str, Any], wait_s: float) -> None:
        """The experiment's own namespace, created if missing. One still being deleted (the
        final cleanup of a failed attempt of this experiment, just rerun) refuses new objects
        until it is gone: waited for, up to ``wait_s``."""
        name = ns_obj["metadata"]["name"]
        deadline = time.monotonic() + wait_s
        shown = False
        while True:
            current = self.api.get("Namespace", name)
            if current is None:
                self.api.apply(ns_obj)
                return
            if not (current.get("metadata") or {}).get("deletionTimestamp"):
                return
            if time.monotonic() >= deadline:
                raise TransientError(f"namespace {name} is still being deleted after {wait_s:.0f}s (the "
                                     "cleanup of an earlier attempt of this experiment)", delay=30.0)
            if not shown:
                self.log(f"namespace {name} is being deleted (an earlier attempt's cleanup): waiting")
                shown = True
            time.sleep(self.poll_s)

    def _with_weights_cache(self, plan: Plan) -> Plan:
        """``plan`` with the chart's weights claim (ORCH_K8S_MODEL_CACHE_PVC) when it names no
        weights source of its own; rendering only: the registered plan and its hash stay."""
        k = plan.kubernetes
        if self.model_cache_pvc is None or k.model_cache_pvc or k.model_cache_host_path:
            return plan
        return plan.model_copy(update={"kubernetes": k.model_copy(update={"model_cache_pvc": self.model_cache_pvc})})

    def _warn_downloads(self, plan: Plan, experiment: str) -> None:
        """Once per experiment: without a cache every pod downloads the weights, every attempt."""
        k = plan.kubernetes
        if k.model_cache_pvc or k.model_cache_host_path or experiment in self._warned:
            return
        self._warned.add(experiment)
        self.log(f"weights: every vLLM pod downloads {plan.model.weight_bytes() / 1e9:.1f} GB of {plan.model.name} "
                 "into an emptyDir, on every attempt of every block; give them a cache that outlives a pod: "
                 "kubernetes.model_cache_pvc (a ReadWriteMany claim), or the chart's modelCache")

    def _check_weights(self, plan: Plan, ns: str) -> None:
        claim = plan.kubernetes.model_cache_pvc
        if claim and self.api.get("PersistentVolumeClaim", claim, ns) is None:
            raise PermanentError(
                f"kubernetes.model_cache_pvc: the PersistentVolumeClaim {claim!r} does not exist in namespace "
                f"{ns!r}, so every vLLM pod would stay Pending: create it there (kubectl -n {ns} apply -f "
                "<claim>.yaml), or drop model_cache_pvc to download the weights into an emptyDir"
            )

    def _delete_all(self, ns: str, objects: list[tuple[str, str]]) -> None:
        for kind, name in reversed(objects):
            try:
                self.api.delete(kind, name, ns)
            except OrchestratorError as e:  # the original failure is the one to report
                self.log(f"could not delete {kind} {ns}/{name} after a failed deploy: {e}")

    def _use_service(self, plan: Plan) -> bool:
        access = plan.kubernetes.access
        return access == "service" or (access == "auto" and in_cluster())

    # -- ready ----------------------------------------------------------------------------

    def ready(self, deployment: Deployment, deadline_s: float) -> None:
        """Wait for every pod to be Ready, then for the router to serve the readiness check.

        Progress (scheduled / pulling / starting / ready) is logged as it changes. Raises
        PermanentError at once for what waiting cannot fix, with the fix: a crash loop, the
        cluster refusing to create pods (Pod Security, quota: the admission message), no node
        with the GPU type, an untolerated taint, a missing claim. Waits through image pull
        back-off and busy GPUs; TransientError at the deadline naming each pod's state."""
        h = deployment.handles_as(KubeHandles)
        key = deployment.key
        deadline = time.monotonic() + deadline_s
        shown = ""
        expected = h.expected_pods + (1 if h.loadgen_selector else 0)
        while True:
            pods = self.api.list("Pod", h.namespace, labels=h.run_selector)
            loadgen = self.api.list("Pod", h.namespace, labels=h.loadgen_selector) if h.loadgen_selector else []
            states = [pod_state(p) for p in pods + loadgen]
            self._fail_fast(deployment, states)
            line = progress_line(states, expected)
            if line != shown:
                self.log(f"arm {key.arm} block {key.block}: {line}")
                shown = line
            if (len(pods) >= h.expected_pods and len(loadgen) >= expected - h.expected_pods
                    and all(s.ready for s in states)):
                break
            if time.monotonic() >= deadline:
                raise TransientError(self._not_ready_message(deployment, states, deadline_s), delay=30.0)
            time.sleep(self.poll_s)
        self._record_fingerprint(deployment, pods)
        self._ensure_endpoint(deployment, pods, loadgen)
        self.probe(deployment.endpoint, max(deadline - time.monotonic(), 5.0))
        # Start-up (scheduling, image pulls, weights, compile) to serving: stored with the run.
        seconds = round(time.monotonic() - h.deployed_at, 1)
        weights = deployment.fingerprint.details.get("weights")
        deployment.fingerprint = replace(deployment.fingerprint, details={
            **deployment.fingerprint.details, "startup": {"seconds": seconds, "weights": weights}})
        self.log(f"arm {key.arm} block {key.block}: serving {seconds:.0f}s after deploy (weights: {weights})")

    def _fail_fast(self, deployment: Deployment, states: list[PodState]) -> None:
        h = deployment.handles_as(KubeHandles)
        ns = h.namespace
        for s in states:
            if s.fatal_reason:
                raise PermanentError(f"{s.line()}; see `kubectl -n {ns} logs {s.name}`")
            fix = unschedulable_fix(s)
            if fix:
                raise PermanentError(f"{s.line()}; {fix}")
            if no_matching_node(s) and not self._gpu_nodes_exist(h):
                raise PermanentError(
                    f"{s.line()}; no node has {h.gpu_label} in {h.gpu_values}: "
                    "check the GPU type, or set kubernetes.gpu_products to this cluster's values"
                )
        if len(states) < h.expected_pods + (1 if h.loadgen_selector else 0):
            refused = [f"{name}: {msg}" for name in h.deployments
                       if (msg := replica_failure(self.api.get("Deployment", name, ns) or {}))]
            if not refused:
                refused = failed_create_events(self.api.list("Event", ns), tuple(h.deployments))
            if refused:
                raise PermanentError(
                    f"the cluster refused to create the pods of {h.run}: {refused[0]} (an admission "
                    f"policy: Pod Security level or a ResourceQuota of namespace {ns}; run in a namespace "
                    "that admits them or raise the quota)"
                )

    def alive(self, deployment: Deployment) -> bool:
        """Every pod of the run is still Ready and none restarted since it became ready."""
        h = deployment.handles_as(KubeHandles)
        pods = self.api.list("Pod", h.namespace, labels=h.run_selector)
        restarts = sum(int(cs.get("restartCount", 0)) for p in pods
                       for cs in (p.get("status") or {}).get("containerStatuses") or [])
        return (len(pods) >= h.expected_pods and all(pod_state(p).ready for p in pods)
                and restarts <= (restarts if h.restarts_at_ready is None else h.restarts_at_ready))

    def _gpu_nodes_exist(self, h: KubeHandles) -> bool:
        values = ",".join(h.gpu_values)
        return bool(self.api.list("Node", labels=f"{h.gpu_label} in ({values})"))

    def _not_ready_message(self, deployment: Deployment, states: list[Any], deadline_s: float) -> str:
        h = deployment.handles_as(KubeHandles)
        events = warning_events(self.api.list("Event", h.namespace), {s.name for s in states})
        lines = [s.line() for s in states if not s.ready] or ["no pods yet"]
        msg = (f"{h.run}: {sum(s.ready for s in states)}/{h.expected_pods} pods ready after "
               f"{deadline_s:.0f}s; " + "; ".join(lines))
        return msg + (f"; events: {' | '.join(events)}" if events else "")

    def _record_fingerprint(self, deployment: Deployment, pods: list[dict[str, Any]]) -> None:
        images: dict[str, str] = {}
        nodes: set[str] = set()
        by_role: dict[str, list[str]] = {}
        for pod in pods:
            if pod_state(pod).role == "router":  # a CPU pod: what it runs on is not the arm's GPUs
                continue
            node = (pod.get("spec") or {}).get("nodeName")
            if node:
                nodes.add(node)
                by_role.setdefault(pod_state(pod).role or "", []).append(node)
            for cs in (pod.get("status") or {}).get("containerStatuses") or []:
                if cs.get("imageID"):
                    images[cs.get("image", cs.get("name", "?"))] = cs["imageID"]
        products: set[str] = set()
        drivers: set[str] = set()
        pools: set[str] = set()
        gpu_label = deployment.handles_as(KubeHandles).gpu_label
        for name in sorted(nodes):
            labels = ((self.api.get("Node", name) or {}).get("metadata") or {}).get("labels") or {}
            if gpu_label in labels:
                products.add(labels[gpu_label])
            drivers.update(labels[k] for k in DRIVER_LABELS[:1] if k in labels)
            if not any(k in labels for k in DRIVER_LABELS[:1]) and DRIVER_LABELS[1] in labels:
                drivers.add(labels[DRIVER_LABELS[1]])
            pools.update(f"{k}={labels[k]}" for k in NODE_POOL_LABELS if k in labels)
        deployment.handles_as(KubeHandles).restarts_at_ready = sum(
            int(cs.get("restartCount", 0)) for p in pods for cs in (p.get("status") or {}).get("containerStatuses") or [])
        observed: dict[str, Any] = dict(nodes=nodes, images=set(images.values()), gpu_products=products,
                                        driver_versions=drivers, node_pools=pools)
        version = self._served_version(deployment, pods)
        if version:
            path = ENGINES[deployment.handles_as(KubeHandles).engine].version_path
            observed.update(engine_version=version, engine_version_source=path)
        deployment.fingerprint = deployment.fingerprint.observed(**observed)
        if "prefill" in by_role or "decode" in by_role:  # disaggregated: where the KV hand-off ran
            placement = {"observed": pd_placement_of(by_role.get("prefill", []), by_role.get("decode", [])),
                         "prefill": sorted(by_role.get("prefill", [])), "decode": sorted(by_role.get("decode", []))}
            deployment.fingerprint = replace(deployment.fingerprint, details={
                **deployment.fingerprint.details, "pd_placement": placement})

    def _served_version(self, deployment: Deployment, pods: list[dict[str, Any]]) -> str | None:
        """The engine's own version of a worker (vLLM's ``GET /version``, SGLang's
        ``GET /get_server_info``: its ``version``), through the API server's pod proxy."""
        path = ENGINES[deployment.handles_as(KubeHandles).engine].version_path
        versions = set()
        for pod in pods:
            st = pod_state(pod)
            if st.role == "router":
                continue
            try:
                text = self.api.proxy_get(deployment.handles_as(KubeHandles).namespace, st.name, HTTP_PORT, path)
                v = json.loads(text).get("version")
            except (OrchestratorError, ValueError, AttributeError):
                continue
            if isinstance(v, str) and v:
                versions.add(v)
        return ",".join(sorted(versions)) or None

    def _ensure_endpoint(self, deployment: Deployment, pods: list[dict[str, Any]],
                         loadgen: list[dict[str, Any]]) -> None:
        """Where the load goes and where control goes. In the cluster: the router Service's
        cluster IP for both. With a fixed URL (an ingress): that URL. Outside the cluster: the
        load is sent by the run's load-generator pod to the router's Service, this process
        sends it each point over a port-forward of that pod, and reaches the router itself
        (readiness, tokenizer) over a port-forward of its own. The round trip of the load's
        path is measured from where the load is sent (the access_path guard reads it)."""
        h = deployment.handles_as(KubeHandles)
        ep = deployment.endpoint
        workers = [p for p in pods if pod_state(p).role != "router"]
        metrics = tuple(
            f"http://{(p.get('status') or {}).get('podIP')}:{HTTP_PORT}/metrics" for p in workers
        )
        load_url: str | None = None
        url, mode = ep.url, "endpoint"
        if h.use_service or h.loadgen_selector:
            svc = self.api.get("Service", h.router_service, h.namespace) or {}
            ip = (svc.get("spec") or {}).get("clusterIP")
            if not ip or ip == "None":
                raise TransientError(f"Service {h.namespace}/{h.router_service} has no cluster IP yet",
                                     delay=5.0)
            url, mode = f"http://{ip}:{HTTP_PORT}", "service"
        if h.loadgen_selector:
            load_url, url = url, self._forward(h, pods, "router").url
            agent_pf = self._forward(h, loadgen, None)
            agent = RemoteDriver(agent_pf.url, where=f"the load generator {h.namespace}/{agent_pf.pod}")
            deployment.driver = agent
            mode = "in-cluster load generator"
        deployment.endpoint = Endpoint(url=url, model=ep.model, metrics_urls=metrics, load_url=load_url)
        path: dict[str, Any] = {"mode": mode, "url": load_url or url}
        if load_url is not None:
            path.update(agent.path(load_url))
        elif mode != "service":
            path.update(measure_path(url))
        deployment.fingerprint = replace(deployment.fingerprint,
                                         details={**deployment.fingerprint.details, "access_path": path})

    def _forward(self, h: KubeHandles, pods: list[dict[str, Any]], role: str | None) -> Any:
        """A port-forward of this process to the (first) pod of ``role`` (None: any), kept with
        the run and closed at its teardown."""
        from orchestrator.backends.kubernetes.portforward import PortForward

        pod = next(p for p in pods if role is None or pod_state(p).role == role)
        pf = PortForward(self.api.api_client, h.namespace, pod["metadata"]["name"], HTTP_PORT, log=self.log)
        self._forwards.setdefault(h.run, []).append(pf)
        return pf

    # -- scrape ---------------------------------------------------------------------------

    def scrape(self, deployment: Deployment) -> dict[str, str]:
        """Prometheus text of every worker (port 8000) and the router (29000), fetched through
        the API server's pod proxy so it works from inside and outside the cluster."""
        h = deployment.handles_as(KubeHandles)
        out: dict[str, str] = {}
        for pod in self.api.list("Pod", h.namespace, labels=h.run_selector):
            state = pod_state(pod)
            if not state.ready:
                continue
            port = ROUTER_METRICS_PORT if state.role == "router" else HTTP_PORT
            ip = (pod.get("status") or {}).get("podIP")
            out[f"http://{ip}:{port}/metrics"] = self.api.proxy_get(h.namespace, state.name, port, "/metrics")
        return out

    # -- teardown and cleanup -------------------------------------------------------------

    def teardown(self, deployment: Deployment) -> None:
        """Delete the owner (dependents follow) and every object applied; idempotent."""
        h = deployment.handles_as(KubeHandles)
        for pf in self._forwards.pop(h.run, []):
            pf.close()
        for kind, name in reversed(h.objects):
            if kind != "Namespace":
                self.api.delete(kind, name, h.namespace)

    def cleanup(self, experiment: str, final: bool = False) -> int:
        """Delete every object labelled with ``experiment`` in the namespaces it may use;
        ``final``: also the namespace the backend created for the experiment (not earlier: a
        namespace being deleted refuses new objects for a while).

        Only that namespace (``orch-<experiment>``, labelled as ours) is ever read or deleted:
        a configured namespace (ORCH_K8S_NAMESPACE: the chart's, whose Role grants nothing on
        namespaces) or one the plan names is the user's, and is never looked at."""
        namespaces = set(self._namespaces.get(experiment, set()))
        namespaces.add(self.namespace or naming.experiment_namespace(experiment))
        selector = f"{naming.EXPERIMENT_LABEL}={naming.label_value(experiment.lower())}"
        removed = 0
        for ns in sorted(namespaces):
            for kind in RUN_KINDS:
                for obj in self.api.list(kind, ns, labels=selector):
                    removed += self.api.delete(kind, obj["metadata"]["name"], ns)
        if final:
            own = self._own_namespace(experiment)
            if own is not None:  # by name (get + delete: no cluster-wide list of namespaces needed)
                want = {naming.EXPERIMENT_LABEL: naming.label_value(experiment.lower()), **naming.MANAGED_BY}
                labels = ((self.api.get("Namespace", own) or {}).get("metadata") or {}).get("labels") or {}
                if all(labels.get(k) == v for k, v in want.items()):
                    removed += self.api.delete("Namespace", own)
            self._namespaces.pop(experiment, None)
            self._given.pop(experiment, None)
        return removed

    def _own_namespace(self, experiment: str) -> str | None:
        """The namespace this backend creates for ``experiment`` (``orch-<experiment>``), or
        None where it creates none: a namespace is configured, or this process deployed the
        experiment only into namespaces given to it (the plan's)."""
        if self.namespace is not None:
            return None
        own = naming.experiment_namespace(experiment)
        deployed = self._namespaces.get(experiment, set())
        if deployed and own not in deployed - self._given.get(experiment, set()):
            return None
        return own


def probe_completion(endpoint: Endpoint, deadline_s: float) -> None:
    """Until ``deadline_s``: the one readiness check through the router."""
    wait_until_serving(endpoint, deadline_s, f"router at {endpoint.url}", health_urls=[endpoint.url], poll_s=0.5)
