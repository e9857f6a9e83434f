"""The corrected step model (issue 21), each term pinned to hand-computed figures for Qwen3-8B
(bf16) on an H200: 8.19e9 params, vocab 151,936 x hidden 4,096 = 622,329,856 params in each of
the (untied) embedding and LM head, KV 147,456 B/token; datasheet rates 0.9 x 4.8 TB/s and
0.6 x 989 TFLOP/s, t0 0.06 ms."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from orchestrator.plan import MODELS, EngineConfig, gpu
from orchestrator.sim.model import DeviceProfile, PrefillChunk, WorkerModel

QWEN = MODELS["qwen3-8b"]
EMBED = 151_936 * 4_096  # 622,329,856 params
BW = 0.9 * 4.8e12
F = 0.6 * 989e12
T0 = 0.06e-3
KVB = 147_456


def h200() -> WorkerModel:
    return WorkerModel(gpu=gpu("H200"), model=QWEN)


def test_decode_reads_every_weight_but_the_input_embedding() -> None:
    w = h200()
    assert w.step_weight_bytes == pytest.approx(16.38e9)  # the seed's W: every weight
    assert w.decode_weight_bytes == pytest.approx(16.38e9 - 2 * EMBED)  # 15,135,340,288 B
    # B=1, context 1024: t0 + 15.135 GB / 4.32 TB/s + 1024 x 147,456 B / 4.32 TB/s = 3.5985 ms
    assert w.decode_step_s(1, 1024) == pytest.approx(3.5985035e-3, rel=1e-6)


def test_a_tied_lm_head_is_read_and_an_unknown_vocabulary_is_not_corrected() -> None:
    tiny = WorkerModel(gpu=gpu("H200"), model=MODELS["qwen3-8b"].model_copy(update={"name": "tiny-llama"}))
    assert tiny.decode_weight_bytes == tiny.step_weight_bytes  # tied: the head streams it
    custom = WorkerModel(gpu=gpu("H200"), model=QWEN.model_copy(update={"name": "my-model"}))
    assert custom.decode_weight_bytes == custom.step_weight_bytes
    assert custom.linear_flops(10, 1) == 2 * 8.19e9 * 10


def test_prefill_computes_the_lm_head_for_the_sampled_position_only() -> None:
    w = h200()
    # 512 prompt tokens: body 2 x (8.19e9 - 2 x 622.3M) x 512 + head 2 x 622.3M x 1
    linear = 2 * (8.19e9 - 2 * EMBED) * 512 + 2 * EMBED
    assert w.linear_flops(512, 1) == pytest.approx(linear)  # 7.1133e12, not 2 x 8.19e9 x 512 = 8.39e12
    attn = 4 * 36 * 4096 * 512 * 256  # QK^T and AV over half the chunk on average
    # Compute-bound: t0 + linear / F + attention / F = 12.1776 ms
    assert w.step_time_s(prefill=(PrefillChunk(512, 0),)) == pytest.approx(12.177598e-3, rel=1e-6)
    assert T0 + linear / F + attn / F == pytest.approx(12.177598e-3, rel=1e-6)
    # Two chunks in one step sample two positions.
    two = w.step_time_s(prefill=(PrefillChunk(256, 0), PrefillChunk(256, 0)))
    attn2 = 2 * 4 * 36 * 4096 * 256 * 128
    assert two == pytest.approx(T0 + (linear + 2 * EMBED) / F + attn2 / F, rel=1e-9)


def test_linear_layers_and_attention_are_separate_roofs_whose_times_add() -> None:
    w = h200()
    # B=256, context 4096: weights 3.5036 ms vs linear 6.5296 ms -> 6.5296 (compute);
    # KV 35.7914 ms vs attention 1.0423 ms -> 35.7914 (bytes); + t0 = 42.381 ms.
    weights = (16.38e9 - 2 * EMBED) / BW
    linear = 2 * (8.19e9 - EMBED) * 256 / F  # every decode position is sampled
    kv = 256 * 4096 * KVB / BW
    attn = 4 * 36 * 4096 * 256 * 4096 / F
    assert linear > weights and kv > attn
    assert w.decode_step_s(256, 4096) == pytest.approx(T0 + linear + kv, rel=1e-9)
    assert w.decode_step_s(256, 4096) == pytest.approx(42.381e-3, rel=1e-4)
    # One max over the whole step (the old model) said 39.64 ms; the H200 measured 45.28.
    one_max = T0 + max((16.38e9 + 256 * 4096 * KVB) / BW, (2 * 8.19e9 * 256 + 4 * 36 * 4096 * 256 * 4096) / F)
    assert one_max == pytest.approx(39.643e-3, rel=1e-4)


H200_PROBE = DeviceProfile(
    name="h200-probe", gpu="H200", bandwidth_bytes_s=4.26e12, flops=762e12, step_overhead_s=1.3e-3,
    kv_bandwidth_by_batch=((32, 4.2e12), (1, 0.4e12), (8, 2.4e12), (256, 4.6e12)),
    flops_by_tokens=((512, 330e12), (8192, 762e12)),
)


def test_profile_terms_step_overhead_and_kv_bandwidth_by_batch() -> None:
    w = H200_PROBE.worker(QWEN, EngineConfig())
    assert H200_PROBE.kv_bandwidth_by_batch[0] == (1, 0.4e12)  # sorted
    assert w.kv_bandwidth(1) == 0.4e12 and w.kv_bandwidth(1000) == 4.6e12  # flat past the ends
    assert w.kv_bandwidth(16) == pytest.approx(3.3e12)  # halfway in log(batch) from 8 to 32
    # B=1, context 1024: 1.3 ms + 15.135 GB / 4.26 TB/s + 151 MB / 0.4 TB/s = 5.2304 ms (measured 5.28)
    assert w.decode_step_s(1, 1024) == pytest.approx(5.2304e-3, rel=1e-4)


def test_profile_gemm_rate_by_tokens() -> None:
    w = H200_PROBE.worker(QWEN, EngineConfig())
    assert w.flops_at(100) == 330e12 and w.flops_at(2048) == pytest.approx(546e12)
    linear = 2 * (8.19e9 - 2 * EMBED) * 512 + 2 * EMBED
    attn = 4 * 36 * 4096 * 512 * 256
    assert w.step_time_s(prefill=(PrefillChunk(512, 0),)) == pytest.approx(1.3e-3 + (linear + attn) / 330e12)


def test_profile_file_is_strict() -> None:
    doc = H200_PROBE.model_dump(mode="json")
    assert DeviceProfile.model_validate(doc) == H200_PROBE
    with pytest.raises(ValidationError):
        DeviceProfile.model_validate({**doc, "surprise": 1})
    with pytest.raises(ValidationError):
        DeviceProfile.model_validate({**doc, "kv_bandwidth_by_batch": [[1, -1.0]]})
