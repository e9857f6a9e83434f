"""A device profile fitted from measurements (DeviceProfile) drives the same step-time model;
the datasheet path keeps its constants."""

from __future__ import annotations

import pytest

from orchestrator.plan import MODELS, EngineConfig, ModelSpec, gpu
from orchestrator.sim.model import (
    BANDWIDTH_EFFICIENCY,
    BLOCK_TOKENS,
    STEP_OVERHEAD_S,
    DeviceProfile,
    PrefillChunk,
    WorkerModel,
)

TINY = ModelSpec(name="tiny-llama", params=5.0e5, layers=2, kv_heads=4, head_dim=32, hidden_size=128)
CPU = DeviceProfile(name="cpu-fit", bandwidth_bytes_s=2.0e9, flops=5.0e10, step_overhead_s=4e-3,
                    kv_cache_bytes=2**30)


def test_datasheet_workers_keep_the_constants() -> None:
    w = WorkerModel(gpu=gpu("H200"), model=MODELS["qwen3-8b"])
    assert w.step_overhead_s == STEP_OVERHEAD_S and w.kv_cache_bytes is None
    expected = STEP_OVERHEAD_S + w.decode_weight_bytes / (4.8e12 * BANDWIDTH_EFFICIENCY)
    assert w.step_time_s(decode_seqs=1) == pytest.approx(expected)


def test_profile_step_is_t0_plus_the_larger_of_bytes_and_flops_at_its_effective_rates() -> None:
    w = CPU.worker(TINY, EngineConfig(max_num_seqs=8, max_num_batched_tokens=1024))
    assert (w.max_num_seqs, w.max_num_batched_tokens) == (8, 1024)
    kvb = 2 * 4 * 32 * 2 * 2  # layers x kv heads x head dim x (K, V) x bf16
    assert w.kv_bytes_per_token == kvb
    # Decode of 4 sequences with 300 tokens of context each: memory-bound here.
    nbytes = 5.0e5 * 2 + 4 * 300 * kvb
    flops = 2 * 5.0e5 * 4 + 4 * 2 * 128 * 4 * 300
    assert nbytes / 2.0e9 > flops / 5.0e10
    assert w.decode_step_s(4, 300) == pytest.approx(4e-3 + nbytes / 2.0e9)
    # A 512-token prefill alone: compute-bound.
    chunk = PrefillChunk(512, 0)
    # tiny-llama's LM head is its (tied) embedding, 2,027 x 128: computed for the one sampled
    # position only; linear layers and attention are separate roofs (issue 21).
    head = 2027 * 128
    linear = 2 * (5.0e5 - head) * 512 + 2 * head
    attn = 4 * 2 * 128 * 512 * 256
    assert w.step_time_s(prefill=(chunk,)) == pytest.approx(4e-3 + max((5.0e5 * 2) / 2.0e9, linear / 5.0e10)
                                                            + attn / 5.0e10)


def test_profile_sizes_the_kv_cache_explicitly() -> None:
    w = CPU.worker(TINY, EngineConfig())
    assert w.kv_capacity_tokens == (2**30 // (w.kv_bytes_per_token * BLOCK_TOKENS)) * BLOCK_TOKENS
    assert CPU.gpu_spec().bandwidth_bytes_s == 2.0e9  # effective: no efficiency factor on top


def test_per_sequence_overheads_add_to_the_step_and_default_to_nothing() -> None:
    engine = EngineConfig(max_num_seqs=8, max_num_batched_tokens=1024)
    plain = CPU.worker(TINY, engine)
    assert plain.decode_seq_overhead_s == plain.prefill_seq_overhead_s == 0.0
    busy = DeviceProfile(name="cpu-fit", bandwidth_bytes_s=2.0e9, flops=5.0e10, step_overhead_s=4e-3,
                         kv_cache_bytes=2**30, decode_seq_overhead_s=1e-4, prefill_seq_overhead_s=2e-3).worker(TINY, engine)
    chunks = (PrefillChunk(100, 0), PrefillChunk(50, 0))
    base = plain.step_time_s(4, 1200, chunks)
    assert busy.step_time_s(4, 1200, chunks) == pytest.approx(base + 4 * 1e-4 + 2 * 2e-3)
    assert busy.decode_step_s(3, 300) == pytest.approx(plain.decode_step_s(3, 300) + 3e-4)
