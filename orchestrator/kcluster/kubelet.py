"""The kubelet: pods bound to a node get a loopback pod IP, their images "pulled", their
containers started as real processes (see ``containers``), readiness probed over HTTP, crashes
restarted with back-off, and deleted pods stopped gracefully; pod status is written the way
the kubelet writes it (phase, conditions, containerStatuses with image, imageID, state, lastState,
restartCount, ready) with the kubelet's events (Pulling, Pulled, Created, Started, Failed,
BackOff, Killing, Unhealthy).

A pod whose restartPolicy is Never (or OnFailure, once its container exits 0) keeps its
container terminated: the pod ends Succeeded (every exit 0) or Failed, as a Job's pod does.

Time is compressed: probe periods, pull and restart back-offs use the cluster's short settings,
while messages show the real kubelet's figures (``back-off 10s restarting failed container``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import ipaddress
import os
import random
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from orchestrator.kcluster.containers import (
    ContainerError,
    Launch,
    MountPending,
    container_env,
    host_launch,
    is_router,
    is_vllm,
    router_launch,
    vllm_launch,
)
from orchestrator.kcluster.objects import now
from orchestrator.kcluster.registry import not_found_message, transient_message
from orchestrator.plan import MODELS

if TYPE_CHECKING:
    from orchestrator.kcluster.cluster import EmulatedCluster

Obj = dict[str, Any]
REAL_BACKOFF_S = (10, 20, 40, 80, 160, 300)
# A docker reference: [registry[:port]/]path[:tag][@digest], path components lower case.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REGISTRY = r"(?:(?:localhost|[a-zA-Z0-9-]+(?:\.[a-zA-Z0-9-]+)+)(?::[0-9]+)?|[a-zA-Z0-9-]+:[0-9]+)/"
IMAGE_REF = re.compile(rf"(?:{_REGISTRY})?{_COMPONENT}(?:/{_COMPONENT})*"
                       r"(?::[\w][\w.-]{0,127})?(?:@sha256:[a-f0-9]{64})?")


def image_id(image: str) -> str:
    """``docker-pullable://<repo>@sha256:<hex>``, the digest derived from the image string."""
    repo = image.rsplit("@", 1)[0]
    last = repo.rsplit("/", 1)[-1]
    if ":" in last:
        repo = repo[: len(repo) - len(last)] + last.split(":", 1)[0]
    return f"docker-pullable://{repo}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"


@dataclass
class ContainerRun:
    """One container of a pod as the kubelet tracks it."""

    name: str
    image: str
    spec: Obj
    restarts: int = 0
    state: Obj = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: Obj = field(default_factory=dict)
    pulled: bool = False
    container_id: str = ""
    proc: subprocess.Popen[bytes] | None = None
    launch: Launch | None = None
    ready: bool = False
    started: bool = False
    next_at: float = 0.0  # next pull / start attempt
    probe_at: float = 0.0
    crash_forever: bool = False
    killed_by_us: bool = False
    log_path: Path | None = None
    finished: bool = False  # terminated for good (restartPolicy Never / OnFailure after exit 0)


@dataclass
class PodRun:
    uid: str
    namespace: str
    name: str
    node: str
    ip: str | None = None
    host_ip: str = ""
    created_at: float = 0.0
    start_time: str | None = None
    containers: dict[str, ContainerRun] = field(default_factory=dict)
    transitions: dict[str, tuple[str, str]] = field(default_factory=dict)  # condition -> (status, time)
    stopping: bool = False
    done: bool = False


class IpPool:
    """Addresses of a CIDR handed out in order from a random start, skipping any address where
    something already listens (another cluster on this machine, a leftover), with no early reuse
    (a freed address waits for the wrap)."""

    def __init__(self, cidr: str, skip: int = 2):
        self.net = ipaddress.ip_network(cidr)
        self.skip = skip
        size = self.net.num_addresses - 1
        self.next = random.SystemRandom().randrange(skip, max(skip + 1, size))
        self.used: set[str] = set()

    def take(self) -> str:
        size = self.net.num_addresses - 1
        busy = listening_ips()
        for _ in range(size):
            ip = str(self.net.network_address + self.next)
            self.next = self.next + 1 if self.next + 1 < size else self.skip
            if ip not in self.used and ip not in busy and not ip.endswith(".0") and not ip.endswith(".255"):
                self.used.add(ip)
                return ip
        raise RuntimeError(f"{self.net} is exhausted")

    def give(self, ip: str | None) -> None:
        self.used.discard(ip or "")


def listening_ips() -> set[str]:
    """IPv4 addresses with a listening TCP socket on this machine (from /proc/net/tcp)."""
    out: set[str] = set()
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return out
    for line in lines:
        parts = line.split()
        if len(parts) > 3 and parts[3] == "0A":  # LISTEN
            out.add(str(ipaddress.IPv4Address(bytes.fromhex(parts[1].split(":")[0])[::-1])))
    return out


class Kubelet:
    """Every node's kubelet at once (one loop over the pods bound to any node)."""

    def __init__(self, cluster: EmulatedCluster):
        self.c = cluster
        self.api = cluster.apiserver
        self.pods: dict[str, PodRun] = {}  # by uid
        self.ips = IpPool(cluster.pod_cidr)
        self.logs = Path(cluster.workdir) / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self._http: aiohttp.ClientSession | None = None
        self._stopping: set[asyncio.Task[None]] = set()

    # -- the loop's step ------------------------------------------------------------------------

    async def sync(self) -> None:
        live = {}
        for pod in self.api.obj_list("pods"):
            node = (pod.get("spec") or {}).get("nodeName")
            if not node:
                continue
            uid = pod["metadata"]["uid"]
            live[uid] = pod
            run = self.pods.get(uid)
            if run is None:
                run = self.pods[uid] = self._admit(pod)
            if run.done:
                continue
            if pod["metadata"].get("deletionTimestamp") or self.api.obj_get("nodes", None, node) is None:
                if not run.stopping:
                    self._begin_stop(run, pod)
                continue
            await self._step(run, pod)
        for uid, run in list(self.pods.items()):
            if uid not in live:  # removed without us (force delete): stop what runs
                if not run.stopping:
                    self._begin_stop(run, None)
                if run.done:
                    del self.pods[uid]

    def _admit(self, pod: Obj) -> PodRun:
        meta = pod["metadata"]
        node = self.api.obj_get("nodes", None, pod["spec"]["nodeName"]) or {}
        host_ip = next((a["address"] for a in (node.get("status") or {}).get("addresses") or []
                        if a.get("type") == "InternalIP"), "")
        run = PodRun(uid=meta["uid"], namespace=meta["namespace"], name=meta["name"],
                     node=pod["spec"]["nodeName"], host_ip=host_ip, created_at=time.monotonic())
        for c in pod["spec"].get("containers") or []:
            run.containers[c["name"]] = ContainerRun(name=c["name"], image=c.get("image", ""), spec=c)
        return run

    async def _step(self, run: PodRun, pod: Obj) -> None:
        t = time.monotonic()
        if run.ip is None:  # the sandbox: an IP once the start delay passed
            if t - run.created_at < self.c.start_delay_s:
                self._write_status(run, pod)
                return
            run.ip = self.ips.take()
            run.start_time = now()
        for cr in run.containers.values():
            await self._step_container(run, pod, cr, t)
        self._write_status(run, pod)

    async def _step_container(self, run: PodRun, pod: Obj, cr: ContainerRun, t: float) -> None:
        if cr.finished:
            return
        if not cr.pulled:
            if t < cr.next_at:
                return
            self._pull(run, pod, cr, t)
            if not cr.pulled:
                return
        if cr.proc is None:  # not running: (re)start when the back-off allows
            if t >= cr.next_at:
                self._start(run, pod, cr, t)
            return
        if cr.proc.poll() is not None:
            self._exited(run, pod, cr, cr.proc.returncode, t)
            return
        if t >= cr.probe_at:
            cr.probe_at = t + self.c.probe_period_s
            ok = await self._probe(run, cr)
            if ok != cr.ready:
                cr.ready = ok
                if not ok and cr.started:
                    self.api.record_event(pod, "Unhealthy", "Readiness probe failed: "
                                          "connection refused", "Warning", host=run.node)
            cr.started = True

    def _pull(self, run: PodRun, pod: Obj, cr: ContainerRun, t: float) -> None:
        if not IMAGE_REF.fullmatch(cr.image):  # never pulled: the reference does not parse
            msg = (f'Failed to apply default image tag "{cr.image}": couldn\'t parse image name '
                   f'"{cr.image}": invalid reference format')
            if cr.state.get("waiting", {}).get("reason") != "InvalidImageName":
                self.api.record_event(pod, "InspectFailed", msg, "Warning", host=run.node)
                self.api.record_event(pod, "Failed", "Error: InvalidImageName", "Warning", host=run.node)
            cr.state = {"waiting": {"reason": "InvalidImageName", "message": msg}}
            cr.next_at = t + self.c.pull_backoff_s
            return
        if not self.c.image_exists(cr.image):  # not in the registry: every attempt fails alike
            known = self.c.registry.known_repository(cr.image)
            self._pull_failed(run, pod, cr, t, not_found_message(cr.image, known))
            return
        if self.c.take_pull_failure(cr.image):  # a registry hiccup: a later attempt succeeds
            self._pull_failed(run, pod, cr, t, transient_message(cr.image))
            return
        if cr.state.get("waiting", {}).get("reason") not in ("ErrImagePull", "ImagePullBackOff"):
            self.api.record_event(pod, "Pulling", f'Pulling image "{cr.image}"', host=run.node)
        self.api.record_event(pod, "Pulled", f'Successfully pulled image "{cr.image}" in 1.2s '
                              "(1.2s including waiting). Image size: 8421337018 bytes.", host=run.node)
        cr.pulled = True
        cr.next_at = t

    def _pull_failed(self, run: PodRun, pod: Obj, cr: ContainerRun, t: float, msg: str) -> None:
        """ErrImagePull on the first failure, ImagePullBackOff until the next attempt, with the
        kubelet's events; retried after the back-off."""
        reason = "ErrImagePull"
        if cr.state.get("waiting", {}).get("reason") in ("ErrImagePull", "ImagePullBackOff"):
            reason = "ImagePullBackOff"
            msg = f'Back-off pulling image "{cr.image}": ErrImagePull: {msg}'
            self.api.record_event(pod, "BackOff", f'Back-off pulling image "{cr.image}"', "Normal", host=run.node)
            self.api.record_event(pod, "Failed", "Error: ImagePullBackOff", "Warning", host=run.node)
        else:
            self.api.record_event(pod, "Pulling", f'Pulling image "{cr.image}"', host=run.node)
            self.api.record_event(pod, "Failed", f'Failed to pull image "{cr.image}": {msg}', "Warning",
                                  host=run.node)
            self.api.record_event(pod, "Failed", "Error: ErrImagePull", "Warning", host=run.node)
        cr.state = {"waiting": {"reason": reason, "message": msg}}
        cr.next_at = t + self.c.pull_backoff_s

    def _start(self, run: PodRun, pod: Obj, cr: ContainerRun, t: float) -> None:
        cr.container_id = "containerd://" + hashlib.sha256(f"{run.uid}/{cr.name}/{cr.restarts}".encode()).hexdigest()
        cr.ready = False
        status_pod = {**pod, "status": {**(pod.get("status") or {}), "podIP": run.ip, "hostIP": run.host_ip}}
        try:
            env = container_env(cr.spec, status_pod,
                                lambda kind, name, key: self.c.lookup_ref(run.namespace, kind, name, key))
        except ContainerError as e:  # a missing Secret or ConfigMap: the container is never created
            cr.state = {"waiting": {"reason": "CreateContainerConfigError", "message": e.message}}
            self.api.record_event(pod, "Failed", f"Error: {e.message}", "Warning", host=run.node)
            cr.next_at = t + self.c.restart_backoff_s
            return
        started = now()
        if cr.crash_forever:
            self._crashed(run, pod, cr, 1, started, t, "")
            return
        try:
            node = self.api.obj_get("nodes", None, run.node) or {}
            host = self.c.host_executables(cr.image)
            if host is not None:
                launch = host_launch(cr.spec, status_pod, host, self.logs.parent / "volumes" / run.uid,
                                     lambda name: self._configmap(run.namespace, name))
            elif is_vllm(cr.spec):
                launch = vllm_launch(cr.spec, pod, node, run.ip or "")
                # vLLM fetches the weights into HF_HOME unless an earlier pod left them there.
                model = MODELS[launch.details["model"]]
                self.c.weights.load(cr.spec, pod, run.node, cr.restarts, model.hf_id or model.name,
                                    int(model.weight_bytes()))
            elif is_router(cr.spec):
                launch = router_launch(cr.spec, run.ip or "", self._pod_kubeconfig(pod))
            else:
                raise ContainerError(f"the emulated kubelet cannot run image {cr.image!r} "
                                     "(it runs vllm-openai and vllm-router images)", exit_code=1)
        except MountPending as e:  # not created yet: the kubelet retries the mount
            cr.state = {"waiting": {"reason": "ContainerCreating"}}
            self.api.record_event(pod, "FailedMount", e.message, "Warning", host=run.node)
            cr.next_at = t + self.c.restart_backoff_s
            return
        except ContainerError as e:
            log = self._log_path(run, cr)
            log.write_text(e.message + "\n")
            cr.log_path = log
            self.api.record_event(pod, "Created", f"Created container: {cr.name}", host=run.node)
            self.api.record_event(pod, "Started", f"Started container {cr.name}", host=run.node)
            self._crashed(run, pod, cr, e.exit_code, started, t, e.message)
            return
        log = self._log_path(run, cr)
        cr.log_path = log
        full_env = {**os.environ, **env, **launch.env, "PYTHONUNBUFFERED": "1", **self.c.process_env}
        with open(log, "ab") as out:
            cr.proc = subprocess.Popen(launch.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True, env=full_env, cwd=self.c.workdir)
        cr.launch = launch
        cr.killed_by_us = False
        cr.state = {"running": {"startedAt": started}}
        cr.started = False
        cr.probe_at = t
        self.c.started_processes.append((cr.proc, run.namespace, run.name, cr.name))
        self.api.record_event(pod, "Created", f"Created container: {cr.name}", host=run.node)
        self.api.record_event(pod, "Started", f"Started container {cr.name}", host=run.node)

    def _exited(self, run: PodRun, pod: Obj, cr: ContainerRun, code: int, t: float) -> None:
        started = (cr.state.get("running") or {}).get("startedAt") or now()
        cr.proc = None
        if code < 0:  # killed by a signal: the runtime reports 128 + signal
            code = 128 - code
        self._crashed(run, pod, cr, code, started, t, "")

    def _crashed(self, run: PodRun, pod: Obj, cr: ContainerRun, code: int, started: str, t: float,
                 message: str) -> None:
        finished = now()
        term = {"exitCode": code, "reason": "Completed" if code == 0 else "Error", "startedAt": started,
                "finishedAt": finished, "containerID": cr.container_id}
        if message and cr.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            term["message"] = message
        policy = (pod.get("spec") or {}).get("restartPolicy", "Always")
        if policy == "Never" or (policy == "OnFailure" and code == 0):  # not restarted: terminated for good
            if code != 0 and not message and cr.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
                log = cr.log_path.read_text(errors="replace") if cr.log_path and cr.log_path.exists() else ""
                if log.strip():
                    term["message"] = "\n".join(log.strip().splitlines()[-80:])
            cr.state = {"terminated": term}
            cr.finished = True
            cr.ready = cr.started = False
            return
        cr.last_state = {"terminated": term}
        cr.restarts += 1
        cr.ready = False
        cr.started = False
        real = REAL_BACKOFF_S[min(cr.restarts - 1, len(REAL_BACKOFF_S) - 1)]
        shown = f"{real // 60}m{real % 60}s" if real >= 60 else f"{real}s"
        cr.state = {"waiting": {"reason": "CrashLoopBackOff", "message": (
            f"back-off {shown} restarting failed container={cr.name} pod={run.name}_{run.namespace}({run.uid})")}}
        cr.next_at = t + min(self.c.restart_backoff_s * 2 ** (cr.restarts - 1), self.c.restart_backoff_s * 8)
        self.api.record_event(pod, "BackOff", f"Back-off restarting failed container {cr.name} in pod "
                              f"{run.name}_{run.namespace}({run.uid})", "Warning", host=run.node)

    async def _probe(self, run: PodRun, cr: ContainerRun) -> bool:
        probe = cr.spec.get("readinessProbe")
        if not probe:
            return True
        get = probe.get("httpGet")
        if get is None:
            return True
        port = get.get("port")
        if isinstance(port, str) and not port.isdigit():
            port = next((p["containerPort"] for p in cr.spec.get("ports") or [] if p.get("name") == port), None)
            if port is None:
                return False
        url = f"http://{run.ip}:{port}{get.get('path') or '/'}"
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0))
        try:
            async with self._http.get(url) as r:
                await r.read()
                return 200 <= r.status < 400
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False

    # -- stopping -------------------------------------------------------------------------------

    def _begin_stop(self, run: PodRun, pod: Obj | None) -> None:
        run.stopping = True
        if pod is not None:
            for cr in run.containers.values():
                if cr.proc is not None:
                    self.api.record_event(pod, "Killing", f"Stopping container {cr.name}", host=run.node)
        grace = (pod or {}).get("metadata", {}).get("deletionGracePeriodSeconds", 30) if pod else 0
        task = asyncio.get_running_loop().create_task(self._stop_pod(run, pod, grace))
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def _stop_pod(self, run: PodRun, pod: Obj | None, grace: float) -> None:
        grace = min(float(grace or 0), self.c.max_grace_s)
        await asyncio.gather(*(stop_proc(cr.proc, grace) for cr in run.containers.values() if cr.proc))
        for cr in run.containers.values():
            cr.proc = None
            cr.ready = False
        self.ips.give(run.ip)
        run.done = True
        if pod is not None:
            self.api.obj_remove("pods", run.namespace, run.name)

    def kill(self, uid: str, restart: bool) -> None:
        run = self.pods.get(uid)
        if run is None:
            raise KeyError(uid)
        for cr in run.containers.values():
            cr.crash_forever = cr.crash_forever or not restart
            if cr.proc is not None and cr.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(cr.proc.pid, signal.SIGKILL)

    async def shutdown(self) -> None:
        procs = [cr.proc for run in self.pods.values() for cr in run.containers.values() if cr.proc]
        await asyncio.gather(*(stop_proc(p, 2.0) for p in procs))
        for t in list(self._stopping):
            with contextlib.suppress(BaseException):
                await t
        if self._http is not None:
            await self._http.close()

    # -- status ---------------------------------------------------------------------------------

    def _pod_kubeconfig(self, pod: Obj) -> str:
        """The kubeconfig a container reaches the API server with: its pod's service account
        token (``system:serviceaccount:NS:SA``), none when the pod does not mount it."""
        spec = pod.get("spec") or {}
        meta = pod["metadata"]
        if spec.get("automountServiceAccountToken") is False:
            return self.c.kubeconfig_for(None, anonymous=True)
        return self.c.kubeconfig_for(f"system:serviceaccount:{meta['namespace']}:"
                                     f"{spec.get('serviceAccountName') or 'default'}")

    def _configmap(self, namespace: str, name: str) -> dict[str, str] | None:
        cm = self.api.obj_get("configmaps", namespace, name)
        return None if cm is None else {k: str(v) for k, v in (cm.get("data") or {}).items()}

    def _log_path(self, run: PodRun, cr: ContainerRun) -> Path:
        return self.logs / f"{run.namespace}_{run.name}_{cr.name}_{cr.restarts}.log"

    def read_log(self, namespace: str, pod: str, container: str | None, previous: bool) -> str | None:
        run = next((r for r in self.pods.values() if r.namespace == namespace and r.name == pod), None)
        if run is None or not run.containers:
            return None
        cr = run.containers.get(container or "") or next(iter(run.containers.values()))
        if cr.finished and not previous:  # terminated for good: its one log
            path = self.logs / f"{namespace}_{pod}_{cr.name}_{cr.restarts}.log"
            return path.read_text(errors="replace") if path.exists() else None
        # The current instance's log, or, while it waits to restart, the last one's (as kubectl
        # logs shows a crash-looping container); --previous: the last terminated instance.
        n = cr.restarts - 1 if previous or cr.proc is None else cr.restarts
        path = self.logs / f"{namespace}_{pod}_{cr.name}_{n}.log"
        if not path.exists():
            return None
        return path.read_text(errors="replace")

    def _write_status(self, run: PodRun, pod: Obj) -> None:
        status = self.pod_status(run, pod.get("status") or {})
        if status != pod.get("status"):
            new = copy.deepcopy(pod)
            new["status"] = status
            self.api.obj_put(new, "pods")

    def _cond(self, run: PodRun, type_: str, ok: bool) -> Obj:
        value = "True" if ok else "False"
        prev = run.transitions.get(type_)
        if prev is None or prev[0] != value:
            run.transitions[type_] = prev = (value, now())
        out: Obj = {"type": type_, "status": value, "lastProbeTime": None, "lastTransitionTime": prev[1]}
        if not ok and type_ in ("Ready", "ContainersReady"):
            out["reason"] = "ContainersNotReady"
            waiting = [n for n, c in run.containers.items() if not c.ready]
            out["message"] = f"containers with unready status: [{' '.join(waiting)}]"
        return out

    def pod_status(self, run: PodRun, old: Obj) -> Obj:
        ready = bool(run.containers) and all(c.ready for c in run.containers.values())
        ever_ran = any(c.launch is not None or c.restarts or c.finished for c in run.containers.values())
        done = bool(run.containers) and all(c.finished for c in run.containers.values())
        sched = next((c for c in old.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
        conditions = [
            self._cond(run, "PodReadyToStartContainers", run.ip is not None),
            self._cond(run, "Initialized", True),
            self._cond(run, "Ready", ready),
            self._cond(run, "ContainersReady", ready),
            sched or {"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                      "lastTransitionTime": now()},
        ]
        statuses = []
        for cr in run.containers.values():
            cs: Obj = {"name": cr.name, "image": cr.image, "imageID": image_id(cr.image) if cr.pulled else "",
                       "ready": cr.ready, "started": "running" in cr.state and cr.started,
                       "restartCount": cr.restarts, "state": copy.deepcopy(cr.state),
                       "lastState": copy.deepcopy(cr.last_state)}
            if cr.container_id:
                cs["containerID"] = cr.container_id
            statuses.append(cs)
        phase = "Running" if ever_ran else "Pending"
        if done:
            ok = all(c.state["terminated"].get("exitCode") == 0 for c in run.containers.values())
            phase = "Succeeded" if ok else "Failed"
            for cond in conditions:
                if cond["type"] in ("Ready", "ContainersReady"):
                    cond["reason"] = "PodCompleted"
                    cond.pop("message", None)
        out: Obj = {"phase": phase, "conditions": conditions,
                    "hostIP": run.host_ip, "hostIPs": [{"ip": run.host_ip}],
                    "qosClass": old.get("qosClass", "Burstable"), "containerStatuses": statuses}
        if run.ip:
            out["podIP"] = run.ip
            out["podIPs"] = [{"ip": run.ip}]
        if run.start_time:
            out["startTime"] = run.start_time
        return out


async def stop_proc(proc: subprocess.Popen[bytes] | None, grace: float) -> None:
    """SIGTERM the process group, SIGKILL it after ``grace`` seconds; reap the leader."""
    if proc is None:
        return
    pgid = proc.pid
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while proc.poll() is None and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)  # whatever is left in the group, leader or not
    for _ in range(100):
        if proc.poll() is not None:
            break
        await asyncio.sleep(0.02)
