"""Cluster settings of a plan run on Kubernetes: where objects go and what the cluster calls things.

The arm says *what* to serve (GPU type, pools, engine knobs); these settings say how this
cluster names and provides it: the namespace, images, the values of the GPU product node label,
the model cache volume, scheduling constraints. Defaults follow the public docs of vLLM and
NVIDIA GPU Feature Discovery, so a plain GPU cluster needs none of them.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from orchestrator.plan.base import CrossFieldError, StrictModel
from orchestrator.plan.catalog import GPUS, canonical_gpu

# A Kubernetes quantity of bytes such as 16Gi or 512Mi (the forms a size limit is written in).
_BYTES_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|K|M|G|T)?$")
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


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
    router_image: str = Field(
        default="vllm/vllm-router:v0.1.17",
        description="vllm-router image (repository:tag) run in front of every arm.",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="Pull policy of every container."
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
        default="model-cache",
        description="PersistentVolumeClaim holding downloaded weights (mounted at /models as "
        "HF_HOME); none: an emptyDir, weights fetched at every start.",
    )
    hf_token_secret: str | None = Field(
        default=None,
        description="Secret with key `token` given to vLLM as HF_TOKEN (gated models).",
    )
    shm_size: str = Field(
        default="16Gi", description="Size of the memory-backed /dev/shm (NCCL needs it with TP>1)."
    )
    cpu_per_gpu: int = Field(default=8, ge=1, description="CPU cores requested per GPU of a worker.")
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
        description="How long a vLLM pod may take to load weights before the startup probe "
        "restarts it (sets the probe's failure threshold).",
    )
    termination_grace_s: int = Field(
        default=60, ge=0, description="Graceful termination period of vLLM pods, s."
    )
    ucx_tls: str = Field(
        default="cuda_ipc,cuda_copy,tcp",
        description="UCX_TLS of NIXL KV transfer (add rc for RDMA between nodes).",
    )
    access: Literal["auto", "service", "port-forward"] = Field(
        default="auto",
        description="How the controller reaches the router: the in-cluster Service, a "
        "port-forward, or auto (Service when running inside the cluster).",
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
        if problems:
            raise CrossFieldError(problems)
        return self

    def product_labels(self, gpu_type: str) -> tuple[str, ...]:
        """Label values that select ``gpu_type`` nodes (the catalog's when not overridden)."""
        return self.gpu_products.get(gpu_type) or GPUS[gpu_type].node_labels
