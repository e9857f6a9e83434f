"""``EmulatedCluster``: an API server, scheduler, controllers, kubelet and kube-proxy on
loopback, in one background thread with its own event loop (see the package docstring)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import ipaddress
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import kmock

from orchestrator.kcluster.access import ClusterAccess
from orchestrator.kcluster.apiserver import ApiServer
from orchestrator.kcluster.controllers import Controllers
from orchestrator.kcluster.kubelet import IpPool, Kubelet
from orchestrator.kcluster.nodes import NodeSpec, default_nodes
from orchestrator.kcluster.objects import KIND_TO_PLURAL, RESOURCES, Fault, now
from orchestrator.kcluster.proxy import KubeProxy
from orchestrator.kcluster.rbac import BOOTSTRAP
from orchestrator.kcluster.registry import Registry, repository
from orchestrator.kcluster.selectors import matches_labels
from orchestrator.kcluster.tls import Certificates, make_certificates, server_factory
from orchestrator.kcluster.weights import WeightStore

Obj = dict[str, Any]
T = TypeVar("T")

POD_SECURITY = (
    'pods "{pod}" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != '
    'false (container "{container}" must set securityContext.allowPrivilegeEscalation=false), unrestricted '
    'capabilities (container "{container}" must set securityContext.capabilities.drop=["ALL"]), '
    'runAsNonRoot != true (pod or container "{container}" must set securityContext.runAsNonRoot=true), '
    'seccompProfile (pod or container "{container}" must set securityContext.seccompProfile.type to '
    '"RuntimeDefault" or "Localhost")'
)
QUOTA = (
    'pods "{pod}" is forbidden: exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu={gpus}, '
    "used: requests.nvidia.com/gpu=8, limited: requests.nvidia.com/gpu=8"
)
PRESETS = {"pod-security": POD_SECURITY, "quota": QUOTA}


@dataclass
class Refusal:
    message: str
    selector: str | None
    times: int | None
    namespace: str | None


class EmulatedCluster(ClusterAccess):
    """A Kubernetes cluster on loopback for tests. Use as a context manager::

        with EmulatedCluster() as cluster:
            api = KubeApi(cluster.api_client())
            ...

    ``nodes``: NodeSpecs (default: ``default_nodes()``). Timings (seconds, compressed from a real
    cluster's): ``tick_s`` the controllers' and kubelet's loop, ``start_delay_s`` a bound pod's
    ContainerCreating before it gets an IP, ``probe_period_s`` readiness probes,
    ``pull_backoff_s`` and ``restart_backoff_s`` (doubling, capped at 8x) the back-offs,
    ``max_grace_s`` the cap on a pod's termination grace. ``pod_cidr`` / ``service_cidr``:
    loopback ranges of pod IPs and clusterIPs. ``process_env``: extra environment for every
    started process. ``workdir``: logs and the kubeconfig (default: a temporary folder, removed).
    ``tls``: serve HTTPS (a CA of its own, in the kubeconfigs), as a real API server does.
    ``cluster_network``: Service cluster IPs answer only the pods' processes, as a clusterIP
    routes only inside a real cluster (a workstation's orch cannot reach them); off, any local
    process may (a test standing in for a process inside the cluster)."""

    def __init__(self, nodes: list[NodeSpec] | None = None, *, tick_s: float = 0.05,
                 start_delay_s: float = 0.1, probe_period_s: float = 0.1, pull_backoff_s: float = 0.3,
                 restart_backoff_s: float = 0.3, max_grace_s: float = 5.0,
                 pod_cidr: str = "127.77.0.0/16", service_cidr: str = "127.96.0.0/16",
                 node_cidr: str = "127.78.0.0/16", enforce_namespaces: bool = True,
                 process_env: dict[str, str] | None = None, workdir: str | Path | None = None,
                 tls: bool = True, cluster_network: bool = False):
        self.node_specs = default_nodes() if nodes is None else list(nodes)
        self.tick_s, self.start_delay_s, self.probe_period_s = tick_s, start_delay_s, probe_period_s
        self.pull_backoff_s, self.restart_backoff_s, self.max_grace_s = pull_backoff_s, restart_backoff_s, max_grace_s
        self.pod_cidr, self.service_cidr = pod_cidr, service_cidr
        self.process_env = dict(process_env or {})
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="kcluster-"))
        self.kubeconfig = str(self.workdir / "kubeconfig")
        self.apiserver = ApiServer(enforce_namespaces=enforce_namespaces)
        self.started_processes: list[tuple[subprocess.Popen[bytes], str, str, str]] = []
        self._service_ips = IpPool(service_cidr, skip=10)
        self._node_ips = IpPool(node_cidr, skip=2)
        self._reserved_ips: dict[tuple[str, str], str] = {}
        self._pull_failures: dict[str | None, int] = {}
        self._refusals: list[Refusal] = []
        self._host_images: dict[str, dict[str, str]] = {}  # image prefix -> program -> path here
        self.registry = Registry()
        self.weights = WeightStore()  # which volumes hold which weights; every download counted
        self.tls = tls
        self.cluster_network = cluster_network
        self.certificates: Certificates | None = None
        self.errors: list[BaseException] = []  # exceptions of the control loop (should stay empty)
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> EmulatedCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._loop = asyncio.new_event_loop()
        started = threading.Event()
        failure: list[BaseException] = []

        async def main() -> None:
            try:
                self.certificates = make_certificates(self.workdir / "pki") if self.tls else None
                ctx = self.certificates.server_context() if self.certificates else None
                async with self.apiserver, kmock.Server(self.apiserver, server_cls=server_factory(ctx)) as server:
                    self.url = str(server.url).rstrip("/")
                    self._wake = asyncio.Event()
                    self._stop = asyncio.Event()
                    self.apiserver.allocate_cluster_ip = self._allocate_cluster_ip
                    self.apiserver.on_change = self._wake.set
                    self.kubelet = Kubelet(self)
                    self.controllers = Controllers(self)
                    self.proxy = KubeProxy(self.apiserver, self.pod_pids if self.cluster_network else None)
                    self.apiserver.read_log = self.kubelet.read_log
                    self._write_kubeconfig()
                    for ns in ("default", "kube-system"):
                        self.apiserver.obj_create({"kind": "Namespace", "metadata": {"name": ns}})
                    for obj in copy.deepcopy(BOOTSTRAP):
                        self.apiserver.obj_create(obj)
                    for spec in self.node_specs:
                        self._create_node(spec)
                    started.set()
                    await self._control_loop()
                    await self.proxy.shutdown()
                    await self.kubelet.shutdown()
                    await self.apiserver.aclose()
            except BaseException as e:  # noqa: BLE001 - reported to the starting thread
                failure.append(e)
                started.set()
                raise

        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(main(),),
                                        name="kcluster", daemon=True)
        self._thread.start()
        if not started.wait(20) or failure:
            raise RuntimeError(f"the emulated cluster did not start: {failure}")

    async def _control_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self.controllers.sync()
                await self.kubelet.sync()
                await self.proxy.sync()
            except Exception as e:  # noqa: BLE001 - kept for tests to assert on
                self.errors.append(e)
                import traceback

                traceback.print_exc()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), 0.01)  # a floor against busy loops
            if self._stop.is_set():
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.tick_s)

    def stop(self) -> None:
        """Stop every process started (by process group), close relays and the API server."""
        if self._loop is None or self._thread is None:
            return
        stop_event = getattr(self, "_stop", None)
        with contextlib.suppress(RuntimeError):
            if stop_event is not None:
                self._loop.call_soon_threadsafe(stop_event.set)
        self._thread.join(30)
        for proc, *_ in self.started_processes:  # belt and braces: nothing may outlive the cluster
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, 9)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)
        if not self._thread.is_alive():
            self._loop.close()
        self._loop = None
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _call(self, fn: Callable[[], T], timeout: float = 30.0) -> T:
        """Run ``fn`` on the cluster's loop (the store is only touched there)."""
        assert self._loop is not None, "the cluster is not running"

        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def _write_kubeconfig(self) -> None:
        self.kubeconfig_for(None, path=self.kubeconfig)

    # -- nodes, namespaces, volumes -------------------------------------------------------------

    def _create_node(self, spec: NodeSpec) -> None:
        cap = {"cpu": spec.cpu, "memory": spec.memory, "pods": "110", "ephemeral-storage": "500Gi"}
        if spec.gpus:
            cap["nvidia.com/gpu"] = str(spec.gpus)
        ip = self._node_ips.take()
        self.apiserver.obj_create({
            "kind": "Node",
            "metadata": {"name": spec.name, "labels": {
                "kubernetes.io/hostname": spec.name, "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64", **spec.labels}},
            "spec": {"taints": copy.deepcopy(spec.taints), **({"unschedulable": True} if spec.unschedulable else {})},
            "status": {
                "capacity": cap, "allocatable": dict(cap),
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "message": "kubelet is posting ready status", "lastHeartbeatTime": now(),
                                "lastTransitionTime": now()}],
                "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": spec.name}],
                "nodeInfo": {"kubeletVersion": "v1.31.4", "containerRuntimeVersion": "containerd://1.7.23",
                             "osImage": "Amazon Linux 2023", "architecture": "amd64", "operatingSystem": "linux",
                             "kernelVersion": "6.1.0"},
            },
        }, "nodes")

    def add_node(self, spec: NodeSpec) -> None:
        self._call(lambda: self._create_node(spec))

    def remove_node(self, name: str) -> None:
        """The node goes away (scale-down, failure): its pods are deleted and their processes stop."""
        self._call(lambda: self.apiserver.obj_remove("nodes", None, name))

    def remove_gpu_nodes(self) -> list[str]:
        names = [n["metadata"]["name"] for n in self.objects("Node").values()
                 if "nvidia.com/gpu" in (n["status"].get("capacity") or {})]
        for n in names:
            self.remove_node(n)
        return names

    def _node(self, name: str) -> Obj:
        node = self.apiserver.obj_get("nodes", None, name)
        if node is None:
            raise KeyError(f"no node {name}")
        return node

    def taint_node(self, name: str, key: str, value: str = "", effect: str = "NoSchedule") -> None:
        def do() -> None:
            node = copy.deepcopy(self._node(name))
            taints = [t for t in node["spec"].get("taints") or [] if not (t["key"] == key and t["effect"] == effect)]
            node["spec"]["taints"] = [*taints, {"key": key, "value": value, "effect": effect}]
            self.apiserver.obj_put(node, "nodes")

        self._call(do)

    def untaint_node(self, name: str, key: str) -> None:
        def do() -> None:
            node = copy.deepcopy(self._node(name))
            node["spec"]["taints"] = [t for t in node["spec"].get("taints") or [] if t["key"] != key]
            self.apiserver.obj_put(node, "nodes")

        self._call(do)

    def add_namespace(self, name: str) -> None:
        def do() -> None:
            if self.apiserver.obj_get("namespaces", None, name) is None:
                self.apiserver.obj_create({"kind": "Namespace", "metadata": {"name": name}})

        self._call(do)

    def add_pvc(self, namespace: str, name: str, size: str = "500Gi") -> None:
        """A bound PersistentVolumeClaim (creates the namespace if missing, as an admin would)."""
        self.add_namespace(namespace)
        self._call(lambda: self.apiserver.obj_create({
            "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": namespace},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": size}}}}))

    def add_secret(self, namespace: str, name: str, data: dict[str, str]) -> None:

        self.add_namespace(namespace)
        self._call(lambda: self.apiserver.obj_create({
            "kind": "Secret", "metadata": {"name": name, "namespace": namespace}, "type": "Opaque",
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}))

    def lookup_ref(self, namespace: str, kind: str, name: str, key: str) -> str | None:
        """A Secret's or ConfigMap's key (for env valueFrom), None if missing (loop thread)."""

        obj = self.apiserver.obj_get(KIND_TO_PLURAL[kind], namespace, name)
        if obj is None or key not in (obj.get("data") or {}):
            return None
        value = obj["data"][key]
        return base64.b64decode(value).decode() if kind == "Secret" else value

    # -- services -------------------------------------------------------------------------------

    def _allocate_cluster_ip(self, svc: Obj) -> str:
        key = (svc["metadata"].get("namespace") or "default", svc["metadata"]["name"])
        return self._reserved_ips.pop(key, None) or self._service_ips.take()

    def reserve_cluster_ip(self, namespace: str, name: str) -> str:
        """The clusterIP the Service ``namespace/name`` will get when it is created (so a client can
        be pointed at it before the Service exists)."""
        def do() -> str:
            key = (namespace, name)
            if key not in self._reserved_ips:
                self._reserved_ips[key] = self._service_ips.take()
            return self._reserved_ips[key]

        return self._call(do)

    def service_url(self, namespace: str, name: str, port: int | None = None) -> str:
        svc = self.get("Service", name, namespace)
        if svc is None:
            raise KeyError(f"service {namespace}/{name}")
        port = port or svc["spec"]["ports"][0]["port"]
        return f"http://{svc['spec']['clusterIP']}:{port}"

    # -- failure injection ----------------------------------------------------------------------

    def fail_image_pull(self, times: int = 1, image: str | None = None) -> None:
        """The next ``times`` pull attempts (of ``image``, or any image) fail for a while (the
        registry's rate limit): the container shows ``ErrImagePull``, then ``ImagePullBackOff``
        until the next attempt; then pulls succeed."""
        self._call(lambda: self._pull_failures.__setitem__(image, self._pull_failures.get(image, 0) + times))

    def run_on_host(self, image: str, executables: dict[str, str] | None = None) -> None:
        """Containers whose image starts with ``image`` run their own command on this machine
        (a Job's script, say): mounted ConfigMaps and emptyDirs are folders of the workdir, and
        ``executables`` maps the command's program (``{"python": sys.executable}``) to one here."""
        self._call(lambda: self._host_images.__setitem__(image, dict(executables or {})))

    def missing_image(self, image: str) -> None:
        """``image`` does not exist in its registry: every pull of it fails with containerd's
        ``not found`` (``ErrImagePull``, then ``ImagePullBackOff``), for good."""
        self.registry.declare_missing(image)

    def add_image(self, repository: str) -> None:
        """Images of ``repository`` (any tag; an fnmatch pattern such as ``ghcr.io/org/*``)
        exist, besides the project's own (``orchestrator.kcluster.registry``)."""
        self.registry.add(repository)

    def image_exists(self, image: str) -> bool:
        return self.registry.exists(image) or self.host_executables(image) is not None

    def host_executables(self, image: str) -> dict[str, str] | None:
        """The programs of an image whose containers run their own command here: one a test
        registered (``run_on_host``), else the orchestrator's own image (any registry, any tag:
        its ``orch`` is this checkout's, next to this interpreter)."""
        found = next((v for k, v in self._host_images.items() if image.startswith(k)), None)
        if found is None and repository(image).rsplit("/", 1)[-1] == "orchestrator":
            found = {"orch": str(Path(sys.executable).with_name("orch"))}
        return found

    def take_pull_failure(self, image: str) -> bool:
        for key in (image, None):
            if self._pull_failures.get(key, 0) > 0:
                self._pull_failures[key] -= 1
                return True
        return False

    def reject_pods(self, message: str = "pod-security", selector: str | None = None,
                    times: int | None = None, namespace: str | None = None) -> None:
        """Admission refuses new pods (whose template labels match ``selector``), ``times`` times or
        until ``allow_pods()``. ``message``: ``"pod-security"``, ``"quota"`` or a text with
        ``{pod}``, ``{container}``, ``{gpus}`` placeholders."""
        r = Refusal(PRESETS.get(message, message), selector, times, namespace)
        self._call(lambda: self._refusals.append(r))

    def allow_pods(self) -> None:
        self._call(self._refusals.clear)

    def admission_refusal(self, namespace: str, rs_name: str, template: Obj) -> str | None:
        labels = (template.get("metadata") or {}).get("labels") or {}
        for r in self._refusals:
            if r.namespace not in (None, namespace) or not matches_labels(labels, r.selector):
                continue
            if r.times is not None:
                if r.times <= 0:
                    continue
                r.times -= 1
            containers = (template.get("spec") or {}).get("containers") or [{}]
            gpus = sum(int(float(((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0)))
                       for c in containers)
            return r.message.format(pod=f"{rs_name}-", container=containers[0].get("name", "main"), gpus=gpus)
        return None

    def kill_pod(self, name: str, namespace: str | None = None, restart: bool = True) -> None:
        """Kill the pod's processes (SIGKILL: exit 137). The kubelet restarts the container after
        a back-off (restartCount + 1); with ``restart=False`` every restart crashes (CrashLoopBackOff)."""
        pod = self._find_pod(name, namespace)
        self._call(lambda: self.kubelet.kill(pod["metadata"]["uid"], restart))

    def kill_role(self, namespace: str, role: str, index: int = 0, restart: bool = True) -> str:
        """Kill the ``index``-th pod (by name) labelled ``orchestrator/role=<role>``; its name."""
        pods = sorted(self.pods(namespace, f"orchestrator/role={role}"), key=lambda p: p["metadata"]["name"])
        name = pods[index]["metadata"]["name"]
        self.kill_pod(name, namespace, restart)
        return name

    def inject_fault(self, method: str, part: str, status: int, times: int = 1, message: str | None = None) -> Fault:
        """The next ``times`` requests of ``method`` ("*": any) whose path contains ``part`` get
        HTTP ``status`` with the Status body a real server sends (403 names the RBAC verb)."""
        f = Fault(method.upper() if method != "*" else "*", part, status, times, message)
        self._call(lambda: self.apiserver.faults.append(f))
        return f

    # -- inspection -----------------------------------------------------------------------------

    def objects(self, kind: str, namespace: str | None = None) -> dict[str, Obj]:
        """``{name: object}`` of a kind (``Deployment`` or ``deployments``), copies."""
        plural = KIND_TO_PLURAL.get(kind, kind)
        if plural not in RESOURCES:
            raise KeyError(kind)
        return self._call(lambda: {o["metadata"]["name"]: copy.deepcopy(o)
                                   for o in self.apiserver.obj_list(plural, namespace)})

    def get(self, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        plural = KIND_TO_PLURAL.get(kind, kind)
        return self._call(lambda: copy.deepcopy(self.apiserver.obj_get(plural, namespace, name)))

    def pods(self, namespace: str | None = None, labels: str | None = None) -> list[Obj]:
        return self._call(lambda: [copy.deepcopy(p) for p in self.apiserver.obj_list("pods", namespace, labels)])

    def events(self, namespace: str | None = None, involved: str | None = None,
               reason: str | None = None) -> list[Obj]:
        evs = self._call(lambda: [copy.deepcopy(e) for e in self.apiserver.obj_list("events", namespace)])
        return [e for e in evs if (involved is None or e["involvedObject"].get("name") == involved)
                and (reason is None or e.get("reason") == reason)]

    def _find_pod(self, name: str, namespace: str | None) -> Obj:
        found = [p for p in self.pods(namespace) if p["metadata"]["name"] == name]
        if not found:
            raise KeyError(f"no pod {name!r}")
        return found[0]

    def process(self, pod: str, namespace: str | None = None, container: str | None = None) -> dict[str, Any]:
        """The running process of a pod's container: pid, the argv it was started with, its
        /proc cmdline now (vllm-router retitles itself ``vllm::router``), kind, details."""
        p = self._find_pod(pod, namespace)

        def do() -> dict[str, Any]:
            run = self.kubelet.pods[p["metadata"]["uid"]]
            cr = run.containers[container] if container else next(iter(run.containers.values()))
            if cr.proc is None or cr.launch is None:
                raise KeyError(f"{pod}: no process running")
            return {"pid": cr.proc.pid, "argv": list(cr.launch.argv), "cmdline": _cmdline(cr.proc.pid),
                    "kind": cr.launch.kind, "details": dict(cr.launch.details), "ip": run.ip,
                    "port": cr.launch.port}

        return self._call(do)

    def pod_pids(self) -> set[int]:
        """Every process of the pods' containers (their process groups: what they started too)."""
        out: set[int] = set()
        for proc, *_ in list(self.started_processes):
            if proc.poll() is None:
                out.add(proc.pid)
            out.update(_group_members(proc.pid))
        return out

    def live_processes(self) -> list[dict[str, Any]]:
        """Processes this cluster started that still run (or whose process group has members)."""
        out = []
        for proc, ns, pod, container in list(self.started_processes):
            alive = proc.poll() is None or bool(_group_members(proc.pid))
            if alive:
                out.append({"pid": proc.pid, "namespace": ns, "pod": pod, "container": container})
        return out

    def requests(self, method: str, part: str) -> int:
        """How many requests of ``method`` ("*": any) whose path contains ``part`` arrived."""
        return len(self.request_log(method, part))

    def request_log(self, method: str = "*", part: str = "") -> list[tuple[str, str]]:
        reqs = self._call(lambda: list(self.apiserver._requests))
        return [(r.method.value, str(r.url.path_qs)) for r in reqs
                if method in ("*", r.method.value) and part in r.url.path]

    def logs(self, pod: str, namespace: str | None = None, container: str | None = None,
             previous: bool = False) -> str:
        p = self._find_pod(pod, namespace)
        return self._call(lambda: self.kubelet.read_log(p["metadata"]["namespace"], pod, container, previous)) or ""

    def wait_for(self, predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05,
                 what: str = "condition") -> Any:
        """Poll ``predicate`` until truthy; its value, or AssertionError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(interval)


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _group_members(pgid: int) -> list[int]:
    from orchestrator.backends.processes import group_members

    return group_members(pgid)


def loopback_ok(cidr: str) -> bool:
    """Whether addresses of ``cidr`` bind here (all of 127.0.0.0/8 does on Linux)."""
    import socket

    ip = str(next(ipaddress.ip_network(cidr).hosts()))
    try:
        with socket.socket() as s:
            s.bind((ip, 0))
        return True
    except OSError:
        return False
