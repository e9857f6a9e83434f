"""Device profiles from a probe of the hardware (issue 21), pure: read the file
``sim/device_probe.py`` writes, fit a ``DeviceProfile`` from it, and find the profile that
matches an arm's GPU. Profiles are plain JSON files (one per device), not database rows."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError

from orchestrator.errors import UserError
from orchestrator.plan import GPUS, ModelSpec
from orchestrator.plan.base import StrictModel
from orchestrator.sim.model import DeviceProfile

PROBE_KIND = "orchestrator-device-probe"
# KV reads of fewer tokens than this per sequence are mostly launch cost, not bytes: left out
# of the KV bandwidth fit (they are what the step overhead measures).
MIN_KV_CONTEXT = 64
# A fitted profile's KV cache when the probe ran on a CPU (host memory is no GPU's HBM): vLLM's
# CPU backend sizes its cache from VLLM_CPU_KVCACHE_SPACE, 1 GiB by the local backend's default
# (backends/local/commands.py; benchmarks/sim_vs_vllm.py uses the same).
CPU_KV_CACHE_BYTES = 2**30


class ProbeDevice(StrictModel):
    type: Literal["cuda", "cpu"]
    name: str
    fingerprint: str
    memory_bytes: float = Field(gt=0)
    torch: str
    cuda_graphs: bool
    threads: int


class ProbeShape(StrictModel):
    name: str
    hidden: int = Field(gt=0)
    layers: int = Field(gt=0)
    heads: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    intermediate: int = Field(gt=0)
    vocab: int = Field(gt=0)
    tied: bool

    def model_spec(self) -> ModelSpec:
        """The shape as the simulator's model: params from the matrices (bf16)."""
        h, hd = self.hidden, self.head_dim
        per_layer = h * (self.heads + 2 * self.kv_heads) * hd + self.heads * hd * h + 3 * h * self.intermediate
        params = self.layers * per_layer + self.vocab * h * (1 if self.tied else 2)
        return ModelSpec(name=self.name, params=params, layers=self.layers, kv_heads=self.kv_heads,
                         head_dim=hd, hidden_size=h)


class KVRead(StrictModel):
    batch: int = Field(gt=0)
    context: int = Field(gt=0)
    seconds: float = Field(gt=0)
    bytes_s: float = Field(gt=0)


class GemmRate(StrictModel):
    tokens: int = Field(gt=0)
    seconds: float = Field(gt=0)
    flops_s: float = Field(gt=0)


class StepTime(StrictModel):
    kind: Literal["decode", "prefill"]
    seconds: float = Field(gt=0)
    batch: int | None = None
    context: int | None = None
    tokens: int | None = None
    source: str | None = None  # reference files: where a figure was measured


class ProbeFile(StrictModel):
    """What ``orch device probe`` writes."""

    kind: Literal["orchestrator-device-probe"]
    version: Literal[1]
    device: ProbeDevice
    shape: ProbeShape
    dtype: Literal["bf16"]
    weights_stream_bytes_s: float = Field(gt=0)
    kv_read: tuple[KVRead, ...]
    gemm: tuple[GemmRate, ...]
    step_overhead_s: float = Field(ge=0)
    steps: tuple[StepTime, ...] = ()
    elapsed_s: float = Field(ge=0)
    note: str = ""


def read_probe(path: Path) -> ProbeFile:
    """A probe file, or a UserError naming what is wrong with it."""
    try:
        return ProbeFile.model_validate_json(path.read_text())
    except OSError as e:
        raise UserError(f"{path}: {e.strerror or e}") from None
    except ValidationError as e:
        raise UserError(f"{path}: not a device probe file", [f"{path}: {_first(e)}"]) from None


def read_profile(path: Path) -> DeviceProfile:
    """A profile file (``orch device fit`` writes them)."""
    try:
        return DeviceProfile.model_validate_json(path.read_text())
    except OSError as e:
        raise UserError(f"{path}: {e.strerror or e}") from None
    except ValidationError as e:
        raise UserError(f"{path}: not a device profile", [f"{path}: {_first(e)}"]) from None


def write_profile(profile: DeviceProfile, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile.model_dump(mode="json"), indent=1) + "\n")


def _first(e: ValidationError) -> str:
    err = e.errors()[0]
    return f"{'.'.join(str(x) for x in err['loc']) or '(file)'}: {err['msg']}"


def gpu_of_fingerprint(fingerprint: str) -> str | None:
    """The catalog GPU whose node label is the probed device's name ('NVIDIA H200' is the
    label 'NVIDIA-H200'), or None."""
    name = fingerprint.split("|", 1)[0].strip().replace(" ", "-")
    for key, spec in GPUS.items():
        if name in spec.node_labels:
            return key
    return None


def fit_profile(probe: ProbeFile, name: str | None = None, gpu: str | None = None,
                kv_cache_bytes: float | None = None, source: str | None = None) -> DeviceProfile:
    """The probe's measurements as a profile: the weights' stream rate, the KV read rate by
    batch (median over the contexts of a batch), the GEMM rate by tokens, the step overhead."""
    if gpu is not None and gpu not in GPUS:
        raise UserError(f"--gpu: unknown GPU {gpu!r}; known: {', '.join(GPUS)}")
    gpu = gpu or gpu_of_fingerprint(probe.device.fingerprint)
    by_batch: dict[int, list[float]] = {}
    for k in probe.kv_read:
        if k.context >= MIN_KV_CONTEXT:
            by_batch.setdefault(k.batch, []).append(k.bytes_s)
    if not by_batch:
        raise UserError(f"the probe has no KV read of at least {MIN_KV_CONTEXT} tokens of context")
    if not probe.gemm:
        raise UserError("the probe has no GEMM rate")
    kv = tuple((float(b), statistics.median(v)) for b, v in sorted(by_batch.items()))
    gemm = tuple(sorted((float(g.tokens), g.flops_s) for g in probe.gemm))
    cpu = probe.device.type == "cpu"
    return DeviceProfile(
        name=name or f"{probe.device.name} ({probe.shape.name} probe)", gpu=gpu,
        fingerprint=probe.device.fingerprint,
        source=source or (f"orch device probe: {probe.device.name}, torch {probe.device.torch}, "
                          f"{probe.shape.name} shape, CUDA graphs {probe.device.cuda_graphs}"),
        bandwidth_bytes_s=probe.weights_stream_bytes_s, flops=max(f for _, f in gemm),
        step_overhead_s=probe.step_overhead_s,
        kv_cache_bytes=kv_cache_bytes or (CPU_KV_CACHE_BYTES if cpu else None),
        memory_bytes=None if cpu else probe.device.memory_bytes,
        kv_bandwidth_by_batch=kv, flops_by_tokens=gemm,
    )


def profiles_in(directory: Path) -> list[DeviceProfile]:
    """Every profile file (``*.json``) of a directory, by file name."""
    if not directory.is_dir():
        raise UserError(f"{directory}: not a directory of device profiles")
    return [read_profile(p) for p in sorted(directory.glob("*.json"))]


def profile_for(gpu: str | None, profiles: list[DeviceProfile]) -> DeviceProfile | None:
    """The profile that describes an arm's GPU: the first of that GPU, else one for every GPU."""
    for p in profiles:
        if p.gpu is not None and p.gpu == gpu:
            return p
    return next((p for p in profiles if p.gpu is None), None)
