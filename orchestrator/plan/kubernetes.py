"""Cluster settings of a plan run on Kubernetes: where objects go and what the cluster calls things.

The arm says *what* to serve (GPU type, pools, engine knobs); these settings say how this
cluster names and provides it: the namespace, images, the values of the GPU product node label,
the model cache volume, scheduling constraints. Defaults follow the public docs of vLLM and
NVIDIA GPU Feature Discovery, so a plain GPU cluster needs none of them.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from orchestrator.plan.base import CrossFieldError, StrictModel, omit_while
from orchestrator.plan.catalog import GPUS, canonical_gpu

# A Kubernetes quantity of bytes such as 16Gi or 512Mi (the forms a size limit is written in).
_BYTES_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|K|M|G|T)?$")
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# A Secret's name: a DNS subdomain (lower-case labels joined by dots, at most 253 characters).
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
SecretName = Annotated[str, Field(min_length=1, max_length=253, pattern=_DNS_SUBDOMAIN)]


SGLANG_IMAGE_REPOSITORY = "lmsysorg/sglang"
# The chart's default image (helm/orchestrator: orchestrator:<appVersion>), the Dockerfile's tag.
LOADGEN_IMAGE = "orchestrator:0.1.0"


def _default_gpu_products() -> dict[str, tuple[str, ...]]:
    return {name: spec.node_labels for name, spec in GPUS.items()}


class Toleration(StrictModel):
    """A toleration added to every vLLM pod (e.g. for tainted GPU node pools)."""

    key: str = Field(default="", description="Taint key; empty with operator Exists matches all.")
    operator: Literal["Exists", "Equal"] = Field(default="Exists", description="How `value` is compared.")
    value: str = Field(default="", description="Taint value (operator Equal).")
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = Field(
        default="", description="Taint effect tolerated; empty: all."
    )


class KvNetwork(StrictModel):
    """RDMA for NIXL's KV transfer between nodes. Off by default: TCP works on any cluster
    (slower between nodes); RDMA needs the RDMA device plugin and a namespace whose Pod
    Security level admits IPC_LOCK (privileged; baseline does not)."""

    rdma: bool = Field(default=False, description="Ask for an RDMA device and let UCX use it (rc).")
    resource: str = Field(
        default="rdma/ib", min_length=1,
        description="Extended resource of the RDMA device plugin (e.g. rdma/ib, rdma/rdma_shared_device_a).",
    )
    count: int = Field(default=1, ge=1, le=16, description="RDMA devices per P/D pod.")
    ucx_net_devices: str | None = Field(
        default=None, description="UCX_NET_DEVICES (e.g. mlx5_0:1); default: UCX picks.",
    )
    network_annotation: str | None = Field(
        default=None,
        description="Multus secondary network (k8s.v1.cni.cncf.io/networks) of P/D pods, e.g. an SR-IOV network.",
    )

    @property
    def transport(self) -> str:
        return "rdma" if self.rdma else "tcp"


class KubernetesSettings(StrictModel):
    """How arms are laid out on a Kubernetes cluster (backend: kubernetes)."""

    namespace: str | None = Field(
        default=None,
        max_length=63,
        pattern=_DNS_LABEL,
        description="Namespace of every object; default: one per experiment, `orch-<experiment>` "
        "(created if missing; needs permission to create namespaces).",
    )
    image_repository: str = Field(
        default="vllm/vllm-openai",
        description="vLLM image; the tag is the arm's engine.version.",
    )
    sglang_image_repository: str = Field(
        default=SGLANG_IMAGE_REPOSITORY,
        description="SGLang image of arms with engine.kind sglang (workers and their sglang_router); "
        "the tag is the arm's engine.version.",
    )
    router_image: str = Field(
        default="vllm/vllm-router:v0.1.17",
        description="vllm-router image (repository:tag) run in front of every arm.",
    )
    placement: Literal["free", "same-node", "spread"] = Field(
        default="free",
        description="Where a disaggregated arm's prefill and decode pods go relative to each other: "
        "same-node (the KV hand-off stays inside a node: NVLink or PCIe), spread (never on one "
        "node: the KV crosses the network), or free (the scheduler decides). Either way the "
        "placement each run got is observed and stored, and blocks whose placement differs "
        "for an arm are not compared.",
    )
    loadgen_image: str = Field(
        default=LOADGEN_IMAGE,
        min_length=1,
        max_length=512,
        description="The orchestrator's own image (repository:tag, what the Dockerfile builds), run "
        "as each run's in-cluster load generator when orch runs outside the cluster (a "
        "port-forward for control only; measured traffic stays in the cluster).",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="Pull policy of every container."
    )
    image_pull_secrets: tuple[SecretName, ...] = Field(
        default=(),
        description="Names of Secrets (type kubernetes.io/dockerconfigjson) that every pod of an "
        "arm pulls its images with (a private registry or mirror). They must exist in the arm's "
        "namespace: name one that holds them (kubernetes.namespace, or the chart's namespace).",
    )
    gpu_product_label: str = Field(
        default="nvidia.com/gpu.product",
        description="Node label that names the GPU product (NVIDIA GPU Feature Discovery).",
    )
    gpu_products: dict[str, tuple[str, ...]] = Field(
        default_factory=_default_gpu_products,
        description="GPU type -> values of gpu_product_label that identify it on this cluster "
        "(a set: H200 shows as NVIDIA-H200 or NVIDIA-H200-141GB-HBM3e).",
    )
    model_cache_pvc: str | None = Field(
        default=None,
        max_length=253,
        pattern=_DNS_SUBDOMAIN,
        description="Weights from an existing PersistentVolumeClaim (mounted at /models as "
        "HF_HOME; the first pod downloads, later ones reuse). Needs kubernetes.namespace: a claim "
        "lives in a namespace, and the default one is created per experiment. Default (neither "
        "this nor model_cache_host_path): download into an emptyDir at every start.",
    )
    model_cache_host_path: str | None = Field(
        default=None,
        pattern=r"^/",
        description="Weights from a folder on each GPU node (a hostPath volume, e.g. a node-local "
        "NVMe cache). Needs a namespace whose Pod Security level is privileged: baseline forbids "
        "hostPath.",
    )
    hf_token_secret: str | None = Field(
        default=None,
        description="Secret with key `token` given to vLLM as HF_TOKEN (gated models).",
    )
    shm_size: str = Field(
        default="16Gi", description="Size of the memory-backed /dev/shm (NCCL needs it with TP>1)."
    )
    cpu_per_gpu: int = Field(default=8, ge=1, le=1024, description="CPU cores requested per GPU of a worker (at most 1024).")
    memory_per_gpu: str = Field(default="64Gi", description="Memory requested per GPU of a worker.")
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Extra node labels every vLLM pod requires."
    )
    tolerations: tuple[Toleration, ...] = Field(
        default=(Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),),
        description="Tolerations of every vLLM pod (default: the usual nvidia.com/gpu taint).",
    )
    startup_timeout_s: int = Field(
        default=1800,
        ge=60,
        le=7 * 24 * 3600,
        description="Start-up budget of an arm: how long its pods may take to be scheduled, pull "
        "images, load weights, compile and answer a test completion (a cold 8B start on H200 "
        "takes 5-15 minutes). The orchestrator waits this long before it gives an attempt up, "
        "and it sets the startup probe's failure threshold.",
    )
    termination_grace_s: int = Field(
        default=60, ge=0, le=86_400, description="Graceful termination period of vLLM pods, s (at most 86400)."
    )
    ucx_tls: str = Field(
        default="cuda_ipc,cuda_copy,tcp",
        description="UCX_TLS of NIXL KV transfer without RDMA (kv_network.rdma adds rc).",
    )
    kv_network: KvNetwork = Field(
        default_factory=lambda: KvNetwork(),
        description="The network NIXL moves KV over between prefill and decode pods.",
    )
    access: Literal["auto", "service", "port-forward"] = Field(
        default="auto",
        description="Where the load is sent from. service: from this process, to the router's "
        "in-cluster Service (orch runs in the cluster: orch submit, a pod). port-forward: from a "
        "load-generator pod of each run (kubernetes.loadgen_image) next to the router, while orch, "
        "outside the cluster, keeps control over port-forwards. auto: service inside the cluster, "
        "else port-forward.",
    )

    @field_validator("gpu_products")
    @classmethod
    def _known_gpus(cls, v: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        out: dict[str, tuple[str, ...]] = {}
        for name, values in v.items():
            if not values:
                raise ValueError(f"{name}: give at least one label value")
            out[canonical_gpu(name)] = tuple(values)
        return dict(sorted(out.items()))

    @model_validator(mode="after")
    def _quantities(self) -> KubernetesSettings:
        problems = [
            (name, f"{getattr(self, name)!r} is not a byte quantity such as 16Gi")
            for name in ("shm_size", "memory_per_gpu")
            if not _BYTES_QUANTITY.match(getattr(self, name))
        ]
        if self.model_cache_pvc and self.model_cache_host_path:
            problems.append(("model_cache_host_path", "give the weights one source: model_cache_pvc or "
                             "model_cache_host_path, not both"))
        if self.model_cache_pvc and self.namespace is None:
            problems.append(("model_cache_pvc", f"the claim {self.model_cache_pvc!r} must exist in the arms' "
                             "namespace, but none is set (the default namespace is created per experiment, "
                             "empty): set kubernetes.namespace to the namespace that holds the claim, or "
                             "drop model_cache_pvc to download the weights into an emptyDir"))
        if problems:
            raise CrossFieldError(problems)
        return self

    @model_serializer(mode="wrap")
    def _omit_default_sglang_image(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Added after plans were registered: left out at its default (every plan keeps its hash).
        return omit_while(handler(self), {"sglang_image_repository": SGLANG_IMAGE_REPOSITORY,
                                          "loadgen_image": LOADGEN_IMAGE, "placement": "free"})

    def image_repository_for(self, engine: str) -> str:
        """The image repository of an engine's workers (``vllm`` or ``sglang``)."""
        return self.sglang_image_repository if engine == "sglang" else self.image_repository

    def product_labels(self, gpu_type: str) -> tuple[str, ...]:
        """Label values that select ``gpu_type`` nodes (the catalog's when not overridden)."""
        return self.gpu_products.get(gpu_type) or GPUS[gpu_type].node_labels
