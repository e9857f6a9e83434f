"""The nodes of an emulated cluster: GPU nodes labelled as NVIDIA GPU Feature Discovery and
Karpenter label them, CPU nodes, and ``--nodes H200=2,H100-SXM=1`` (the GPU catalog's names)
as ``orch k8s emulate`` reads it."""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.plan import GPUS

# The NVIDIA GPU operator's taint (no value); GKE's is nvidia.com/gpu=present:NoSchedule.
GPU_TAINT = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}
GKE_GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
PRODUCTS = {  # product label -> (instance type, GPU memory MiB)
    "NVIDIA-H200": ("p5en.48xlarge", 143771),
    "NVIDIA-H200-141GB-HBM3e": ("p5en.48xlarge", 143771),
    "NVIDIA-H100-80GB-HBM3": ("p5.48xlarge", 81559),
    "NVIDIA-H100-PCIe": ("a3-highgpu-8g", 81559),
}

@dataclass
class NodeSpec:
    """A node: its name, labels, GPUs, CPU, memory and taints."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    gpus: int = 0
    cpu: str = "16"
    memory: str = "64Gi"
    taints: list[dict[str, str]] = field(default_factory=list)
    unschedulable: bool = False


def gpu_node(name: str, product: str = "NVIDIA-H200", gpus: int = 8, pool: str | None = None,
             driver: str = "570.133.20", taints: list[dict[str, str]] | None = None,
             labels: dict[str, str] | None = None) -> NodeSpec:
    """A GPU node labelled as NVIDIA GPU Feature Discovery and Karpenter label one, with the GPU
    operator's ``nvidia.com/gpu:NoSchedule`` taint unless ``taints`` is given."""
    instance, mem = PRODUCTS.get(product, ("gpu-node", 81559))
    pool = pool or ("h200" if "H200" in product else "h100")
    return NodeSpec(name=name, gpus=gpus, cpu="192", memory="2000Gi",
                    taints=[dict(GPU_TAINT)] if taints is None else taints, labels={
                        "nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(gpus),
                        "nvidia.com/gpu.memory": str(mem), "nvidia.com/gpu.present": "true",
                        "nvidia.com/cuda.driver-version.full": driver,
                        "nvidia.com/cuda.driver.major": driver.split(".")[0],
                        "karpenter.sh/nodepool": pool, "node.kubernetes.io/instance-type": instance,
                        **(labels or {})})


def cpu_node(name: str = "cpu-1", cpu: str = "16", memory: str = "64Gi") -> NodeSpec:
    return NodeSpec(name=name, cpu=cpu, memory=memory, labels={
        "karpenter.sh/nodepool": "general", "node.kubernetes.io/instance-type": "m7i.4xlarge"})


def default_nodes() -> list[NodeSpec]:
    """Two H200 nodes (8 GPUs each, tainted) and one CPU node (for the router)."""
    return [gpu_node("h200-1"), gpu_node("h200-2"), cpu_node("cpu-1")]


def parse_nodes(text: str) -> list[NodeSpec]:
    """``H200=2,H100-SXM=1,cpu=1``: GPU nodes by catalog name (8 GPUs each, the catalog's
    first product label), numbered ``h200-1``, ``h200-2``, ...; ``cpu=N`` CPU nodes (one when
    not given: the router runs on an untainted node). ValueError naming what is wrong."""
    counts: dict[str, int] = {}
    for item in [p.strip() for p in text.split(",")]:
        name, sep, count = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"{item!r} is not NAME=COUNT (e.g. H200=2,H100-SXM=1,cpu=1)")
        key = "cpu" if name.lower() == "cpu" else next((g for g in GPUS if g.lower() == name.lower()), None)
        if key is None:
            raise ValueError(f"unknown GPU type {name!r}: one of {', '.join(GPUS)}, or cpu")
        if not count.strip().isdigit():
            raise ValueError(f"{item!r}: the count must be a whole number >= 0")
        if key in counts:
            raise ValueError(f"{name} is given twice")
        counts[key] = int(count)
    counts.setdefault("cpu", 1)
    if not any(counts.values()):
        raise ValueError("no nodes: give at least one node")
    nodes: list[NodeSpec] = []
    for key, n in counts.items():
        for i in range(1, n + 1):
            if key == "cpu":
                nodes.append(cpu_node(f"cpu-{i}"))
            else:
                gpu = GPUS[key]
                nodes.append(gpu_node(f"{key.lower()}-{i}", product=gpu.node_labels[0], gpus=gpu.gpus_per_node))
    return nodes
