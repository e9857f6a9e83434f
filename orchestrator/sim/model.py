"""Performance model of a continuous-batching engine on a GPU (pure).

One worker = one vLLM engine on ``tp`` GPUs. The model answers: how many bytes the weights
and each token of KV cache take, how many tokens of KV fit, and how long one engine step takes
for a given mix of decode sequences and prefill chunks (DESIGN sections 5 and 8).

Step time (one forward pass over everything scheduled in the step; issue 21):

    T = t0 + max(W_step / bw, linear_flops / F(tokens)) + max(KV / bw_kv(seqs), attn_flops / F(tokens))
        + all-reduce + per-sequence costs (+ draft passes)

- the linear layers (weights) and attention run as separate kernels one after the other, so
  each has its own roof and near the ridge their times add (one max over the whole step was
  3-19% low against a real H200, issue 21);
- W_step: the weights a step reads (MoE: active experts only), **without the input embedding**:
  a step gathers one row of it per token, it never streams it (a tied LM head does read it);
- linear_flops: 2 x body params per token processed, plus 2 x LM-head params per *sampled*
  position only (each decode position, one per prefill chunk), never per prompt token;
- KV: the cache every decode sequence reads (its whole context) plus what a prefill chunk reads
  of its earlier context; attn_flops: QK^T and AV over the context;
- bw, F: datasheet peak x an efficiency; a measured ``DeviceProfile`` gives its own effective
  rates instead, with the KV read rate by batch and the GEMM rate by tokens (small batches
  and chunks reach far less of the peak than the big ones);
- per GPU: tensor parallelism splits weights, KV and flops over ``tp`` GPUs and adds two
  all-reduces of the activations per layer over NVLink.

The seed's single-stream ceiling B / W (585 tok/s, H200, W = 8.2 GB of FP8 Qwen3-8B) is an
upper bound that counts every weight byte; the model reads fewer bytes (no embedding) at 90%
of B plus t0, so its single stream lands a little under the ceiling (~94% of it on the
datasheet profile), never above: ``ceiling_tokens_s`` keeps the seed's arithmetic exactly.

Constants, each with its source:
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, replace
from functools import cached_property

from pydantic import Field, field_validator

from orchestrator.plan import GPUS, EngineConfig, GPUSpec, ModelSpec, SpeculativeConfig
from orchestrator.plan.base import StrictModel

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
# Vocabulary size and whether the LM head is the input embedding (tied), from each model's
# config.json (vocab_size, tie_word_embeddings). The plan's ModelSpec has no vocabulary; a model
# not listed here gets no embedding/LM-head correction (its step is then a little slow).
VOCABULARY: dict[str, tuple[int, bool]] = {
    "qwen3-8b": (151_936, False),
    "llama-3.1-70b": (128_256, False),
    "qwen3-30b-a3b": (151_936, False),
    "tiny-llama": (2_027, True),  # the test tier's model (backends/vllm_env.py)
}


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
    # The server's front end (HTTP, tokenization, the hop to the engine core), per request:
    # the latency a request spends there before the engine sees it, and the time it takes from
    # the engine's own cores (a CPU build's API server shares them; 0 on a GPU, whose host
    # cores are apart). Measured against CPU vLLM (issue 21): without them a fit pushes the
    # client's extra ~5 ms of TTFT into t0 and over-predicts TPOT by 40-60%.
    frontend_latency_s: float = 0.0
    frontend_cpu_s: float = 0.0
    # Measured rate curves (DeviceProfile), per GPU, effective (no efficiency factor on top):
    # KV read bytes/s by sequences reading in a step, and linear-layer FLOP/s by tokens in a
    # step; interpolated in log(x), held flat past the ends. Empty: the datasheet rates.
    kv_bandwidth_by_batch: tuple[tuple[float, float], ...] = ()
    flops_by_tokens: tuple[tuple[float, float], ...] = ()

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

    @cached_property
    def _vocab_params(self) -> tuple[float, float]:
        """(embedding params a step never streams, LM-head params) of the whole model."""
        vocab, tied = VOCABULARY.get(self.model.name, (0, True))
        head = float(vocab * self.model.hidden_size)
        return (0.0 if tied else head), head

    @property
    def decode_weight_bytes(self) -> float:
        """Weight bytes one step streams, whole worker: ``step_weight_bytes`` less the input
        embedding (untied models; a step gathers one row of it per token)."""
        embedding, _ = self._vocab_params
        per = self.step_weight_bytes / self.model.active
        return self.step_weight_bytes - embedding * per

    def linear_flops(self, tokens: float, sampled: float) -> float:
        """FLOPs of the linear layers: 2 x body params per token, 2 x LM-head params per sampled
        position (the embedding is a gather: no FLOPs)."""
        embedding, head = self._vocab_params
        return 2.0 * (self.model.active - embedding - head) * tokens + 2.0 * head * sampled

    @cached_property
    def _rates(self) -> tuple[float, float, float, float, float]:
        """Per-step constants of the hot path: (weights read time, KV bytes/token, attention
        FLOPs per token-context pair, body FLOPs per token, head FLOPs per sampled position)."""
        embedding, head = self._vocab_params
        return (self.decode_weight_bytes / self._bandwidth, self.kv_bytes_per_token,
                4.0 * self.model.layers * self.model.hidden_size,
                2.0 * (self.model.active - embedding - head), 2.0 * head)

    @cached_property
    def _peaks(self) -> tuple[float, float]:
        # (bandwidth, FLOP/s) of the datasheet path, once: the step loop asks every step
        return self._bandwidth, self._flops

    def kv_bandwidth(self, seqs: int) -> float:
        """Effective KV read bytes/s of a step where ``seqs`` sequences read their cache."""
        if not self.kv_bandwidth_by_batch:
            return self._peaks[0]
        return _interp_log(self.kv_bandwidth_by_batch, seqs) * self.tp * self.efficiency_scale

    def flops_at(self, tokens: float) -> float:
        """Effective FLOP/s of a step that processes ``tokens`` positions."""
        if not self.flops_by_tokens:
            return self._peaks[1]
        return _interp_log(self.flops_by_tokens, tokens) * self.tp * self.efficiency_scale

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
        return self.step_time_pairs(decode_seqs, decode_context_tokens, [(c.tokens, c.context) for c in prefill])

    def step_time_pairs(self, decode_seqs: int, decode_context_tokens: float,
                        prefill: list[tuple[int, int]]) -> float:
        """``step_time_s`` with the chunks as (tokens, context) pairs (the engine's hot path)."""
        k, w_s, kvb, attn_k, body2, head2, t0, flops_c, bw_c, extra = self._hot
        decode_positions = decode_seqs * (k + 1)
        kv_tokens = decode_context_tokens
        attn = attn_k * decode_positions * decode_context_tokens / decode_seqs if decode_seqs else 0.0
        tokens = decode_positions
        for c_tokens, c_context in prefill:
            tokens += c_tokens
            kv_tokens += c_context
            attn += attn_k * c_tokens * (c_context + c_tokens / 2.0)
        if tokens == 0:
            return 0.0
        n_pre = len(prefill)
        flops_s = flops_c or self.flops_at(tokens)
        # Linear layers, then attention: two roofs, one after the other (issue 21, point 2).
        linear = (body2 * tokens + head2 * (decode_positions + n_pre)) / flops_s
        t = t0 + (w_s if w_s > linear else linear)
        kv_s = kv_tokens * kvb / (bw_c or self.kv_bandwidth(decode_seqs + n_pre)) if kv_tokens else 0.0
        attn_s = attn / flops_s
        t += kv_s if kv_s > attn_s else attn_s
        if not extra:
            return t
        if self.decode_seq_overhead_s or self.prefill_seq_overhead_s:
            t += decode_seqs * self.decode_seq_overhead_s + n_pre * self.prefill_seq_overhead_s
        if self.tp > 1:
            t += self.allreduce_s(tokens)
        if k and decode_seqs:
            # k draft steps, each a fraction c of a plain decode pass of the same batch.
            plain = t0 + max(w_s, (body2 + head2) * decode_seqs / self.flops_at(decode_seqs))
            plain += decode_context_tokens * kvb / self.kv_bandwidth(decode_seqs)
            t += k * self.speculative_draft_cost * plain
        return t

    @cached_property
    def _hot(self) -> tuple[int, float, float, float, float, float, float, float, float, bool]:
        # step_time_pairs' constants, once: the rates, the flat FLOP/s and bandwidth (0 where a
        # measured curve applies), and whether any rarer term (per-sequence costs, TP, drafts) does
        w_s, kvb, attn_k, body2, head2 = self._rates
        flops_c = 0.0 if self.flops_by_tokens else self._flops
        bw_c = 0.0 if self.kv_bandwidth_by_batch else self._bandwidth
        extra = bool(self.decode_seq_overhead_s or self.prefill_seq_overhead_s or self.tp > 1
                     or self.speculative_k)
        return (self.speculative_k, w_s, kvb, attn_k, body2, head2, self.step_overhead_s,
                flops_c, bw_c, extra)

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
        """Seed notes, equation (1): one stream cannot exceed B / W (peak bandwidth, whole worker;
        W every weight byte, as the seed counts it). A bound: ``1 / decode_step_s(1, n)`` stays
        under it (t0, 90% of B; the embedding it omits is ~8% of Qwen3-8B's bytes)."""
        return self.gpu.bandwidth_bytes_s * self.tp / self.step_weight_bytes

    def kv_transfer_s(self, tokens: int, link_bytes_s: float) -> float:
        """Time to move ``tokens`` of KV from a prefill to a decode worker over a link per GPU."""
        if tokens <= 0:
            return 0.0
        return KV_TRANSFER_LATENCY_S + tokens * self.kv_bytes_per_token / (link_bytes_s * self.tp)


def _interp_log(points: tuple[tuple[float, float], ...], x: float) -> float:
    """y at ``x`` on a curve of (x, y) points sorted by x, linear in log(x), flat past the ends."""
    if x <= points[0][0]:
        return points[0][1]
    if x >= points[-1][0]:
        return points[-1][1]
    i = bisect.bisect_right(points, (x, math.inf))
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 + (y1 - y0) * math.log(x / x0) / math.log(x1 / x0)


Curve = tuple[tuple[float, float], ...]


class DeviceProfile(StrictModel):
    """A device described by what one engine step achieves on it, measured rather than taken
    from a datasheet: fitted from a few points of a real server (``benchmarks/sim_vs_vllm.py``
    fits vLLM's CPU build) or from a probe of the hardware (``orch device probe`` then ``orch
    device fit``). Every rate is effective (no efficiency factor applied on top) and per GPU.

    The terms of issue 21: ``step_overhead_s`` (t0, the per-step fixed cost: launches and small
    kernels, ~1.3 ms on an H200 inside a CUDA graph in a plain PyTorch probe), the weights'
    stream rate ``bandwidth_bytes_s``, the KV read rate by batch ``kv_bandwidth_by_batch`` (few
    KV heads leave most SMs idle at small batches: ~0.4 TB/s at 1 on an H200, 4.2-4.6 at 32 and
    more), and the GEMM rate by tokens ``flops_by_tokens`` (a 512-token chunk reached ~330
    TFLOP/s, large GEMMs 762). Optionally fixed costs per decoding sequence and per prefill chunk
    of a step (what a CPU engine spends per sequence in Python)."""

    name: str = Field(description="Name of the profile (e.g. the device it was measured on).")
    gpu: str | None = Field(default=None, description="Catalog GPU type it describes (plan simulate applies it to arms of that GPU); None: every arm.")
    fingerprint: str | None = Field(default=None, description="Device name and memory the probe saw, e.g. 'NVIDIA H200|150754820096'.")
    source: str = Field(default="", description="Where the figures were measured.")
    bandwidth_bytes_s: float = Field(gt=0, description="Weights stream rate, bytes/s.")
    flops: float = Field(gt=0, description="GEMM rate of large steps, FLOP/s (when flops_by_tokens is empty: every step).")
    step_overhead_s: float = Field(ge=0, description="Fixed cost of one step, s.")
    kv_cache_bytes: float | None = Field(default=None, gt=0, description="KV cache size of one engine (CPU: VLLM_CPU_KVCACHE_SPACE); None: from memory_bytes as on a GPU.")
    memory_bytes: float | None = Field(default=None, gt=0, description="Device memory, bytes (default: the catalog GPU's).")
    decode_seq_overhead_s: float = Field(default=0.0, ge=0, description="Fixed cost per decoding sequence in a step, s.")
    prefill_seq_overhead_s: float = Field(default=0.0, ge=0, description="Fixed cost per prefill chunk in a step, s.")
    frontend_latency_s: float = Field(default=0.0, ge=0, description="Time a request spends in the server's front end (HTTP, tokenization) before the engine sees it, s.")
    frontend_cpu_s: float = Field(default=0.0, ge=0, description="Engine time the front end takes per request when it shares the engine's cores (CPU builds), s.")
    kv_bandwidth_by_batch: Curve = Field(default=(), description="(sequences reading, KV bytes/s) points, by batch.")
    flops_by_tokens: Curve = Field(default=(), description="(tokens in the step, FLOP/s) points of the linear layers.")

    @field_validator("kv_bandwidth_by_batch", "flops_by_tokens")
    @classmethod
    def _sorted_positive(cls, v: Curve) -> Curve:
        if any(x <= 0 or y <= 0 for x, y in v):
            raise ValueError("curve points must be positive")
        return tuple(sorted(v))

    def gpu_spec(self) -> GPUSpec:
        """The profile as a GPU type (effective figures; NVLink from the catalog GPU if named)."""
        known = GPUS.get(self.gpu) if self.gpu else None
        memory = self.kv_cache_bytes or self.memory_bytes or (known.memory_bytes if known else None)
        if memory is None:
            raise ValueError(f"profile {self.name}: neither kv_cache_bytes nor memory_bytes, and no catalog GPU")
        return GPUSpec(
            name=self.name, memory_bytes=memory, bandwidth_bytes_s=self.bandwidth_bytes_s,
            bf16_flops=self.flops, fp8_flops=self.flops,
            nvlink_bytes_s=known.nvlink_bytes_s if known else self.bandwidth_bytes_s,
            node_labels=known.node_labels if known else (self.name,), gpus_per_node=known.gpus_per_node if known else 1,
        )

    def worker(self, model: ModelSpec, engine: EngineConfig, tp: int = 1, efficiency_scale: float = 1.0) -> WorkerModel:
        """One engine on this device with a plan's engine knobs."""
        w = WorkerModel.from_engine(self.gpu_spec(), model, tp, engine, efficiency_scale)
        return replace(w, step_overhead_s=self.step_overhead_s, bandwidth_efficiency=1.0,
                       compute_efficiency=1.0, kv_cache_bytes=self.kv_cache_bytes,
                       decode_seq_overhead_s=self.decode_seq_overhead_s,
                       prefill_seq_overhead_s=self.prefill_seq_overhead_s,
                       frontend_latency_s=self.frontend_latency_s, frontend_cpu_s=self.frontend_cpu_s,
                       kv_bandwidth_by_batch=self.kv_bandwidth_by_batch, flops_by_tokens=self.flops_by_tokens)
