"""Synthetic vLLM metric samples of load points, made by the step model from a known device
profile (tests of `orch device fit --experiment`)."""

from __future__ import annotations

from orchestrator.plan import MODELS, EngineConfig
from orchestrator.sim.metrics_fit import PointFigures, predict
from orchestrator.sim.model import DeviceProfile, WorkerModel

MODEL = MODELS["qwen3-8b"]
ENGINE = EngineConfig(max_num_seqs=64, max_num_batched_tokens=4096)
# The truth: a device unlike the H100-PCIe datasheet (t0 1.5 ms, 1.6 TB/s, 380 TFLOP/s).
TRUTH = DeviceProfile(name="truth", gpu="H100-PCIe", bandwidth_bytes_s=1.6e12, flops=3.8e14, step_overhead_s=1.5e-3)
# (batch, prompt tokens, rate per s): light to heavy, long prompts (the KV term tells t0 from the bandwidth)
LOADS = ((1.0, 4000, 0.5), (4.0, 4000, 2.0), (10.0, 4000, 4.0), (20.0, 4000, 6.0), (6.0, 2000, 4.0))
LABELS = {"model_name": "Qwen/Qwen3-8B", "engine": "0"}


def worker(profile: DeviceProfile = TRUTH) -> WorkerModel:
    return profile.worker(MODEL, ENGINE, 1)


def figures(batch: float, prompt: int, rate: float, output: int = 64, point_id: int = 0,
            requests: float = 100) -> PointFigures:
    """A point's figures with the means the truth's step model gives (``requests`` sent over
    requests / rate seconds)."""
    f = PointFigures(run_id=1, point_id=point_id, requests=requests, prompt_tokens=prompt, uncached_tokens=prompt,
                     output_tokens=output, batch=batch, token_batch=batch + 1, rate=rate, tpot_s=None,
                     prefill_s=None)
    tpot, prefill = predict(worker(), f)
    return PointFigures(**{**f.__dict__, "tpot_s": tpot, "prefill_s": prefill})


def samples(f: PointFigures, t0: float = 1000.0) -> list[tuple[float, str, dict[str, str], float]]:
    """Before, three during and after scrapes whose deltas are the figures' (a constant batch;
    decode times that make Little's law give it at the figures' rate)."""
    n = f.requests
    assert f.tpot_s is not None and f.prefill_s is not None
    decode = f.batch / f.rate - f.prefill_s
    assert decode > 0
    after = {"vllm:request_success_total": n, "vllm:prompt_tokens_total": n * f.prompt_tokens,
             "vllm:generation_tokens_total": n * f.output_tokens,
             "vllm:request_time_per_output_token_seconds_sum": n * f.tpot_s,
             "vllm:request_time_per_output_token_seconds_count": n,
             "vllm:request_prefill_time_seconds_sum": n * f.prefill_s, "vllm:request_prefill_time_seconds_count": n,
             "vllm:request_decode_time_seconds_sum": n * decode, "vllm:request_decode_time_seconds_count": n}
    out = [(t0, name, LABELS, 0.0) for name in after] + [(t0, "vllm:num_requests_running", LABELS, 0.0)]
    for i in range(1, 4):
        out.append((t0 + i, "vllm:num_requests_running", LABELS, f.batch))
    out += [(t0 + 5, name, LABELS, v) for name, v in after.items()]
    out.append((t0 + 5, "vllm:num_requests_running", LABELS, 0.0))
    return out
