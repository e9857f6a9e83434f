"""An emulated Kubernetes cluster for tests: the API server, scheduler, controllers, kubelet and
kube-proxy, on loopback, so the Kubernetes backend's real code path runs against it.

- API server (``apiserver``): kmock over real HTTP, driven by the official client, with a real
  server's object semantics (server-side apply, selectors, watch, graceful and cascading
  deletion, pod proxy forwarding for real, injected faults).
- Scheduler and controllers (``scheduler``, ``controllers``): Deployments -> ReplicaSets ->
  Pods; node affinity, node selectors, taints and tolerations, nvidia.com/gpu, CPU and memory
  requests, PersistentVolumeClaims, with kube-scheduler's messages; admission refusals.
- Kubelet (``kubelet``, ``containers``): a loopback pod IP per pod (127.77.0.0/16), the
  container's process started for real: the simulated engine (``orch sim serve``) for a vLLM
  container, its ``vllm serve`` arguments read as vLLM reads them; the real ``vllm-router`` for
  the router, whose own Kubernetes service discovery lists and watches the emulated API server
  through KUBECONFIG. Readiness from the container's readinessProbe (vLLM: /v1/models, router:
  /health); crashes, image pull failures and back-offs as the kubelet reports them; container
  logs through ``pods/NAME/log``; ``pods/NAME/portforward`` speaks the websocket protocol of
  ``kubectl port-forward``.
- kube-proxy (``proxy``): a clusterIP (127.96.0.0/16) per non-headless Service, relaying TCP to
  ready pods.

``EmulatedCluster`` (``cluster``) ties them together; ``tests/support/kcluster.py`` makes it a pytest fixture; ``orch k8s emulate`` runs it for a user.

    from orchestrator.kcluster import EmulatedCluster, cpu_node, gpu_node

    with EmulatedCluster(nodes=[gpu_node("h200-1"), gpu_node("h200-2"), cpu_node()]) as cluster:
        backend = KubernetesBackend(api=cluster.kube_api(), poll_s=0.1)   # or KUBECONFIG=cluster.kubeconfig
        dep = backend.deploy(plan, "B", RunKey(plan.name, "B", 0))       # plan: kubernetes.access service
        backend.ready(dep, deadline_s=45)                                # or auto: port-forward works too
        cluster.kill_role(dep.handles.namespace, "decode")            # restartCount 1, exit 137
        cluster.inject_fault("PATCH", "/deployments/", 409, times=2)     # then cluster.requests("PATCH", ...)
        cluster.reject_pods("quota"); cluster.fail_image_pull(times=3); cluster.taint_node("h200-1", "k", "v")
        backend.teardown(dep)
    assert not cluster.live_processes()

Everything is compressed in time (short probe periods and back-offs) and bound to loopback:
pods 127.77.0.0/16, clusterIPs 127.96.0.0/16, node addresses 127.78.0.0/16; an address where
something already listens (another cluster on the machine) is skipped.
"""

from orchestrator.kcluster.cluster import POD_SECURITY, QUOTA, EmulatedCluster, loopback_ok
from orchestrator.kcluster.nodes import (
           GKE_GPU_TAINT,
           GPU_TAINT,
           NodeSpec,
           cpu_node,
           default_nodes,
           gpu_node,
           parse_nodes,
)

__all__ = ["GKE_GPU_TAINT", "GPU_TAINT", "POD_SECURITY", "QUOTA", "EmulatedCluster", "NodeSpec",
           "cpu_node", "default_nodes", "gpu_node", "loopback_ok", "parse_nodes"]
