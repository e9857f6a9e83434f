"""The step-time model against a device probe file (issue 21).

For every whole step the probe measured (decode at a batch and context, prefill of N tokens),
three predictions of the simulator's step model and the measurement:

- ``before``: the model before issue 21 (one max over the whole step, the input embedding in the
  decode bytes, the LM head computed for every prompt token), datasheet rates: the "model
  predicts" column of issue 21's table;
- ``datasheet``: the corrected model on the catalog GPU's datasheet rates (90% of peak bandwidth,
  60% of peak FLOP/s, t0 0.06 ms);
- ``profile``: the corrected model on the profile ``orch device fit`` makes of the same probe
  file (its weights stream, KV read by batch, GEMM rate by tokens and step overhead). The
  probe's whole steps are not used by the fit, so this column is out of sample.

Run: .venv/bin/python benchmarks/sim_vs_gpu.py [PROBE.json] [--gpu H200] [--markdown]
Default probe: benchmarks/data/h200_issue21_probe.json (issue 21's H200 table, encoded by hand).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from orchestrator.plan import GPUS, MODELS, EngineConfig
from orchestrator.sim.model import (
    BANDWIDTH_EFFICIENCY,
    COMPUTE_EFFICIENCY,
    STEP_OVERHEAD_S,
    PrefillChunk,
    WorkerModel,
)
from orchestrator.sim.profiles import (
    ProbeFile,
    StepTime,
    fit_profile,
    gpu_of_fingerprint,
    read_probe,
)

DEFAULT_PROBE = Path(__file__).resolve().parent / "data" / "h200_issue21_probe.json"


def before(w: WorkerModel, s: StepTime) -> float:
    """The step model before issue 21 (kept here only to regenerate the issue's table)."""
    bw = w.gpu.bandwidth_bytes_s * BANDWIDTH_EFFICIENCY
    fl = w.gpu.bf16_flops * COMPUTE_EFFICIENCY
    width = 4.0 * w.model.layers * w.model.hidden_size
    if s.kind == "decode":
        b, c = s.batch or 1, s.context or 0
        nbytes = w.step_weight_bytes + b * c * w.kv_bytes_per_token
        flops = 2.0 * w.model.active * b + width * b * c
    else:
        n = s.tokens or 1
        nbytes = w.step_weight_bytes
        flops = 2.0 * w.model.active * n + width * n * n / 2.0
    return STEP_OVERHEAD_S + max(nbytes / bw, flops / fl)


def predict(w: WorkerModel, s: StepTime) -> float:
    if s.kind == "decode":
        return w.decode_step_s(s.batch or 1, s.context or 0)
    return w.step_time_s(prefill=(PrefillChunk(s.tokens or 1, 0),))


def rows(probe: ProbeFile, gpu: str) -> list[dict[str, float | str]]:
    shape = probe.shape
    model = MODELS.get(shape.name) or shape.model_spec()
    engine = EngineConfig(max_num_batched_tokens=16384)
    sheet = WorkerModel.from_engine(GPUS[gpu], model, 1, engine)
    prof = fit_profile(probe, gpu=gpu).worker(model, engine)
    out: list[dict[str, float | str]] = []
    for s in probe.steps:
        case = (f"decode B={s.batch}, context {s.context}" if s.kind == "decode" else f"prefill {s.tokens} tokens")
        out.append({"case": case, "before": before(sheet, s), "datasheet": predict(sheet, s),
                    "profile": predict(prof, s), "measured": s.seconds})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("probe", nargs="?", type=Path, default=DEFAULT_PROBE)
    ap.add_argument("--gpu", default=None, help="catalog GPU of the datasheet column (default: from the probe)")
    args = ap.parse_args()
    probe = read_probe(args.probe)
    gpu = args.gpu or gpu_of_fingerprint(probe.device.fingerprint)
    if gpu is None:
        raise SystemExit(f"{probe.device.name}: no catalog GPU matches; give --gpu")
    table = rows(probe, gpu)
    if not table:
        raise SystemExit(f"{args.probe}: the probe has no whole steps to compare")
    print(f"probe: {args.probe.name} ({probe.device.name}, {probe.shape.name} shape); datasheet: {gpu}")
    print()
    print("| case | before issue 21 (ms) | corrected, datasheet (ms) | corrected, fitted profile (ms) "
          "| measured (ms) | measured / before | measured / datasheet | measured / profile |")
    print("|---|---|---|---|---|---|---|---|")
    for r in table:
        m = float(r["measured"])
        b, d, p = (float(r[k]) for k in ("before", "datasheet", "profile"))
        print(f"| {r['case']} | {b * 1e3:.2f} | {d * 1e3:.2f} | {p * 1e3:.2f} | {m * 1e3:.2f} "
              f"| {m / b:.2f} | {m / d:.2f} | {m / p:.2f} |")
    print()
    for k in ("before", "datasheet", "profile"):
        errs = [abs(float(r[k]) / float(r["measured"]) - 1) for r in table]
        print(f"{k:>9}: |error| median {statistics.median(errs):.1%}, max {max(errs):.1%}")


if __name__ == "__main__":
    main()
