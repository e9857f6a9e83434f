"""Performance model of a continuous-batching engine on a GPU (pure).

One worker = one vLLM engine on ``tp`` GPUs. The model answers: how many bytes the weights
and each token of KV cache take, how many tokens of KV fit, and how long one engine step takes
for a given mix of decode sequences and prefill chunks (DESIGN sections 5 and 8).

Step time (one forward pass over everything scheduled in the step):

    T = t0 + max(bytes / (eff_bw x B), flops / (eff_fl x F)) + all-reduce

- bytes: the weights once (MoE: active experts only) plus the KV cache every decode sequence
  reads (its whole context) plus the KV a prefill chunk reads of its earlier context;
- flops: 2 x active params per token processed, plus attention over the context;
- both per GPU: tensor parallelism splits weights, KV and flops over ``tp`` GPUs and adds two
  all-reduces of the activations per layer over NVLink.

Constants, each with its source:
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from orchestrator.plan import EngineConfig, GPUSpec, ModelSpec, SpeculativeConfig

# Seed notes ("The memory-bandwidth ceiling"): a well-written memory-bound kernel reaches about
# 90% of a GPU's peak bandwidth.
BANDWIDTH_EFFICIENCY = 0.90
# Seed notes ("Launch overhead"): a decode step of a 16.7M-parameter model takes ~0.5 ms, almost
# all launch overhead, and compiling the step removes 6-10x of it. vLLM captures decode steps in
# CUDA graphs (compiled), so t0 = 0.5 ms / 8 ~ 0.06 ms. (The seed's 0.3 ms is an uncompiled
# launch on a 7B step; it would be ~14% of an 8B FP8 H200 step, which the 90%-of-ceiling figure
# of the same notes rules out.)
STEP_OVERHEAD_S = 0.06e-3
# Not in the seed: the share of dense tensor peak that large prefill GEMMs reach in vLLM on
# Hopper. Public vLLM/SGLang prefill benchmarks report 50-65% model FLOP utilisation; 0.6 used.
COMPUTE_EFFICIENCY = 0.60
# Not in the seed: latency of one NCCL all-reduce of a small message over NVLink (NVIDIA
# nccl-tests report ~5-10 us at 8 GPUs); two all-reduces per layer (attention and MLP outputs).
ALLREDUCE_LATENCY_S = 8e-6
ALLREDUCES_PER_LAYER = 2
# Bytes per activation element moved by the all-reduce (bf16 activations).
ACTIVATION_BYTES = 2
# vLLM profiles peak activation memory before sizing the KV cache; for an 8B model at an
# 8k-token step budget it is ~1-2 GB per GPU (vLLM startup logs). Not in the seed.
ACTIVATION_RESERVE_BYTES = 1.5e9
# vLLM's KV block size (seed notes, "Prefix caching": blocks of 16 tokens, chained hashes).
BLOCK_TOKENS = 16
# Not in the seed: fixed cost of one NIXL KV pull (handshake, notification), from vLLM's
# NixlConnector design (~1 ms scale). The bytes then move at the link bandwidth.
KV_TRANSFER_LATENCY_S = 1e-3


def tokens_per_pass(k: int, acceptance: float) -> float:
    """Speculative decoding: expected tokens per verification pass, E = (1 - a^(k+1)) / (1 - a).

    Seed notes, equation (4): a = 0.75, k = 2 -> 2.31.
    """
    if k <= 0:
        return 1.0
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


def speculative_speedup(k: int, acceptance: float, draft_cost: float) -> float:
    """Seed notes, equation (5): speedup ~ E / (1 + k c) while a pass costs one plain step."""
    return tokens_per_pass(k, acceptance) / (1.0 + k * draft_cost)


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    """Part of a prompt computed in one step: ``tokens`` new ones after ``context`` earlier ones."""

    tokens: int
    context: int


@dataclass(frozen=True)
class WorkerModel:
    """The performance model of one engine worker (``tp`` GPUs of one type)."""

    gpu: GPUSpec
    model: ModelSpec
    tp: int = 1
    kv_cache_dtype: str = "auto"
    quantization: str = "none"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    prefix_caching: bool = True
    gpu_memory_utilization: float = 0.90
    speculative_k: int = 0
    speculative_acceptance: float = 0.7
    speculative_draft_cost: float = 0.05
    efficiency_scale: float = 1.0  # run-to-run jitter multiplies both efficiencies
    # A device measured rather than from a datasheet (DeviceProfile) overrides these; the
    # defaults are the constants above.
    step_overhead_s: float = STEP_OVERHEAD_S
    bandwidth_efficiency: float = BANDWIDTH_EFFICIENCY
    compute_efficiency: float = COMPUTE_EFFICIENCY
    kv_cache_bytes: float | None = None  # KV cache size when set (CPU: VLLM_CPU_KVCACHE_SPACE)
    # Fixed costs per sequence in a step, beyond bytes and flops (0 on GPUs: not modelled there;
    # a fitted CPU profile measures them): per decoding sequence, per prefill chunk.
    decode_seq_overhead_s: float = 0.0
    prefill_seq_overhead_s: float = 0.0

    @classmethod
    def from_engine(
        cls, gpu: GPUSpec, model: ModelSpec, tp: int, engine: EngineConfig, efficiency_scale: float = 1.0
    ) -> WorkerModel:
        """A worker configured from a plan's engine knobs."""
        spec: SpeculativeConfig | None = engine.speculative
        return cls(
            gpu=gpu,
            model=model,
            tp=tp,
            kv_cache_dtype=engine.kv_cache_dtype,
            quantization=engine.quantization,
            max_num_seqs=engine.max_num_seqs,
            max_num_batched_tokens=engine.max_num_batched_tokens,
            prefix_caching=engine.prefix_caching,
            gpu_memory_utilization=engine.gpu_memory_utilization,
            speculative_k=spec.num_speculative_tokens if spec else 0,
            speculative_acceptance=spec.acceptance if spec else 0.7,
            speculative_draft_cost=spec.draft_cost if spec else 0.05,
            efficiency_scale=efficiency_scale,
        )

    # --- memory -------------------------------------------------------------------------
    @property
    def weight_bytes(self) -> float:
        """All weights at the served precision, over the whole worker."""
        return self.model.weight_bytes(self.quantization)

    @property
    def step_weight_bytes(self) -> float:
        """Weight bytes one step reads, whole worker (MoE: active experts only)."""
        return self.model.active_weight_bytes(self.quantization)

    @property
    def kv_bytes_per_token(self) -> float:
        """KV bytes of one token over the whole worker (split over TP GPUs)."""
        return self.model.kv_bytes_per_token(self.kv_cache_dtype)

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens of KV cache that fit: usable memory minus weights and activations, in blocks
        (or ``kv_cache_bytes`` when the cache is sized explicitly)."""
        if self.kv_cache_bytes is not None:
            free = self.kv_cache_bytes
        else:
            usable = self.gpu.memory_bytes * self.gpu_memory_utilization * self.tp
            free = usable - self.weight_bytes - ACTIVATION_RESERVE_BYTES * self.tp
        blocks = int(max(free, 0.0) // (self.kv_bytes_per_token * BLOCK_TOKENS))
        return blocks * BLOCK_TOKENS

    def kv_capacity_sequences(self, context_tokens: float) -> int:
        """Sequences of ``context_tokens`` that fit in the cache, capped by max_num_seqs."""
        per_seq = math.ceil(context_tokens / BLOCK_TOKENS) * BLOCK_TOKENS
        return min(self.max_num_seqs, self.kv_capacity_tokens // max(per_seq, 1))

    # --- throughput ---------------------------------------------------------------------
    @property
    def _bandwidth(self) -> float:
        return self.gpu.bandwidth_bytes_s * self.tp * self.bandwidth_efficiency * self.efficiency_scale

    @property
    def _flops(self) -> float:
        peak = self.gpu.fp8_flops if self.quantization == "fp8" else self.gpu.bf16_flops
        return peak * self.tp * self.compute_efficiency * self.efficiency_scale

    @property
    def tokens_per_pass(self) -> float:
        """Tokens one decode sequence gains per step (speculative decoding: E > 1)."""
        return tokens_per_pass(self.speculative_k, self.speculative_acceptance)

    def allreduce_s(self, tokens: int) -> float:
        """Tensor-parallel all-reduces of one step (ring: 2 (tp-1)/tp of the bytes per GPU)."""
        if self.tp == 1 or tokens <= 0:
            return 0.0
        nbytes = tokens * self.model.hidden_size * ACTIVATION_BYTES
        per = ALLREDUCE_LATENCY_S + 2 * (self.tp - 1) / self.tp * nbytes / self.gpu.nvlink_bytes_s
        return self.model.layers * ALLREDUCES_PER_LAYER * per

    def _attention_flops(self, tokens: float, context: float) -> float:
        # QK^T and AV: 2 matmuls x 2 flops x layers x width x tokens x context attended.
        return 4.0 * self.model.layers * self.model.hidden_size * tokens * context

    def step_time_s(
        self,
        decode_seqs: int = 0,
        decode_context_tokens: float = 0.0,
        prefill: tuple[PrefillChunk, ...] | list[PrefillChunk] = (),
    ) -> float:
        """Duration of one engine step.

        ``decode_seqs`` sequences decode (each reads ``decode_context_tokens`` / decode_seqs of
        KV on average and, with speculative decoding, verifies k + 1 positions); ``prefill``
        chunks are computed in the same step (chunked prefill mixes them with decodes).
        """
        k = self.speculative_k
        decode_positions = decode_seqs * (k + 1)
        prefill_tokens = sum(c.tokens for c in prefill)
        if decode_seqs == 0 and prefill_tokens == 0:
            return 0.0
        nbytes = self.step_weight_bytes + decode_context_tokens * self.kv_bytes_per_token
        flops = 2.0 * self.model.active * (decode_positions + prefill_tokens)
        flops += self._attention_flops(decode_positions, decode_context_tokens / max(decode_seqs, 1))
        for c in prefill:
            nbytes += c.context * self.kv_bytes_per_token
            flops += self._attention_flops(c.tokens, c.context + c.tokens / 2.0)
        t = self.step_overhead_s + max(nbytes / self._bandwidth, flops / self._flops)
        if self.decode_seq_overhead_s or self.prefill_seq_overhead_s:
            t += decode_seqs * self.decode_seq_overhead_s + len(prefill) * self.prefill_seq_overhead_s
        t += self.allreduce_s(decode_positions + prefill_tokens)
        if k and decode_seqs:
            # k draft steps, each a fraction c of a plain decode pass of the same batch.
            plain = self.step_overhead_s + max(
                (self.step_weight_bytes + decode_context_tokens * self.kv_bytes_per_token) / self._bandwidth,
                2.0 * self.model.active * decode_seqs / self._flops,
            )
            t += k * self.speculative_draft_cost * plain
        return t

    def decode_step_s(self, batch: int, context_tokens: float) -> float:
        """T(b): one decode step of ``batch`` sequences of ``context_tokens`` each."""
        return self.step_time_s(decode_seqs=batch, decode_context_tokens=batch * context_tokens)

    def prefill_s(self, prompt_tokens: int, cached_tokens: int = 0) -> float:
        """Time to prefill one prompt alone, chunked by the step token budget."""
        t = 0.0
        done = cached_tokens
        while done < prompt_tokens:
            n = min(self.max_num_batched_tokens, prompt_tokens - done)
            t += self.step_time_s(prefill=(PrefillChunk(n, done),))
            done += n
        return t

    def ceiling_tokens_s(self) -> float:
        """Seed notes, equation (1): one stream cannot exceed B / W (peak bandwidth, whole worker)."""
        return self.gpu.bandwidth_bytes_s * self.tp / self.step_weight_bytes

    def kv_transfer_s(self, tokens: int, link_bytes_s: float) -> float:
        """Time to move ``tokens`` of KV from a prefill to a decode worker over a link per GPU."""
        if tokens <= 0:
            return 0.0
        return KV_TRANSFER_LATENCY_S + tokens * self.kv_bytes_per_token / (link_bytes_s * self.tp)


@dataclass(frozen=True)
class DeviceProfile:
    """A device described by what one engine step achieves on it, fitted from a few measured
    points of a real server (``benchmarks/sim_vs_vllm.py`` fits vLLM's CPU build) instead of a
    datasheet: effective bandwidth and FLOP/s (no efficiency factor applied on top), the fixed
    cost of a step ``t0``, the KV cache size of one engine, and optionally fixed costs per
    decoding sequence and per prefill chunk of a step (what a CPU engine spends per sequence in
    Python, which neither bytes nor flops describe)."""

    name: str
    bandwidth_bytes_s: float
    flops: float
    step_overhead_s: float
    kv_cache_bytes: float
    decode_seq_overhead_s: float = 0.0
    prefill_seq_overhead_s: float = 0.0

    def gpu_spec(self) -> GPUSpec:
        """The profile as a GPU type (the figures are effective; no NVLink: TP 1)."""
        return GPUSpec(
            name=self.name, memory_bytes=self.kv_cache_bytes, bandwidth_bytes_s=self.bandwidth_bytes_s,
            bf16_flops=self.flops, fp8_flops=self.flops, nvlink_bytes_s=self.bandwidth_bytes_s,
            node_labels=(self.name,), gpus_per_node=1,
        )

    def worker(self, model: ModelSpec, engine: EngineConfig, tp: int = 1) -> WorkerModel:
        """One engine on this device with a plan's engine knobs."""
        w = WorkerModel.from_engine(self.gpu_spec(), model, tp, engine)
        return replace(w, step_overhead_s=self.step_overhead_s, bandwidth_efficiency=1.0,
                       compute_efficiency=1.0, kv_cache_bytes=self.kv_cache_bytes,
                       decode_seq_overhead_s=self.decode_seq_overhead_s,
                       prefill_seq_overhead_s=self.prefill_seq_overhead_s)
