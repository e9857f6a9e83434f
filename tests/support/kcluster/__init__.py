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
  through KUBECONFIG. Readiness from the container's readinessProbe; crashes, image pull
  failures and back-offs as the kubelet reports them.
- kube-proxy (``proxy``): a clusterIP (127.96.0.0/16) per non-headless Service, relaying TCP to
  ready pods.

``EmulatedCluster`` (``cluster``) ties them together; ``cluster_fixture`` makes a pytest fixture.
"""

from tests.support.kcluster.cluster import (
    GPU_TAINT,
    POD_SECURITY,
    QUOTA,
    EmulatedCluster,
    NodeSpec,
    cluster_fixture,
    cpu_node,
    default_nodes,
    gpu_node,
    loopback_ok,
)

__all__ = ["GPU_TAINT", "POD_SECURITY", "QUOTA", "EmulatedCluster", "NodeSpec", "cluster_fixture",
           "cpu_node", "default_nodes", "gpu_node", "loopback_ok"]
