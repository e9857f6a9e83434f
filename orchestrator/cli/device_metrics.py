"""`orch device fit --experiment NAME [--arm A]`: a device profile from the vLLM metrics an
experiment's valid runs stored (issue 21). The store read (store/metrics_read.py) and the pure
fit (sim/metrics_fit.py) meet here; the arm's model, TP and engine knobs come from the
registered plan."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import UserError
from orchestrator.plan import GPUS
from orchestrator.sim.metrics_fit import (
    SAMPLE_NAMES,
    FitRefused,
    MetricsFit,
    PointFigures,
    fit_terms,
    point_figures,
)
from orchestrator.sim.model import COMPUTE_EFFICIENCY, DeviceProfile, WorkerModel
from orchestrator.sim.profiles import CPU_KV_CACHE_BYTES


@dataclass(frozen=True)
class ExperimentFit:
    """The fitted profile and how it was fitted."""

    experiment: str
    arm: str
    profile: DeviceProfile
    fit: MetricsFit
    runs: tuple[int, ...]
    skipped: tuple[str, ...]  # points left out, with why

    def to_dict(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment, "arm": self.arm, "runs": list(self.runs),
            "relative_se": {k: (None if math.isnan(v) else v) for k, v in self.fit.relative_se.items()}, "notes": list(self.fit.notes), "skipped": list(self.skipped),
            "points": [{
                "run": p.figures.run_id, "point": p.figures.point_id, "batch": p.figures.batch,
                "token_batch": p.figures.token_batch, "prompt_tokens": p.figures.prompt_tokens,
                "output_tokens": p.figures.output_tokens, "tpot_s": p.figures.tpot_s, "tpot_fit_s": p.tpot_fit_s,
                "tpot_residual": p.tpot_residual, "prefill_s": p.figures.prefill_s,
                "prefill_fit_s": p.prefill_fit_s, "prefill_residual": p.prefill_residual,
            } for p in self.fit.points],
        }

    def lines(self) -> list[str]:
        out = [f"experiment {self.experiment}, arm {self.arm}: runs {', '.join(map(str, self.runs))}, "
               f"{len(self.fit.points)} point(s)"]
        out += [f"  left out: {s}" for s in self.skipped]
        out.append("  point   batch  prompt  reply   TPOT ms (fit, resid)       prefill ms (fit, resid)")
        for p in self.fit.points:
            f = p.figures
            pre = (f"{f.prefill_s * 1e3:8.2f} ({p.prefill_fit_s * 1e3:.2f}, {p.prefill_residual:+.1%})"
                   if f.prefill_s and p.prefill_residual is not None else "       -")
            out.append(f"  {f.point_id:5d} {f.batch:7.1f} {f.prompt_tokens:7.0f} {f.output_tokens:6.0f} "
                       f"{(f.tpot_s or 0) * 1e3:8.3f} ({p.tpot_fit_s * 1e3:.3f}, {p.tpot_residual or 0:+.1%})   {pre}")
        se = self.fit.relative_se
        flops = "kept (not identified)" if math.isnan(se["flops"]) else f"{se['flops']:.1%}"
        out.append(f"  standard errors: t0 {se['step_overhead_s']:.1%} of a step, bandwidth {se['bandwidth_bytes_s']:.1%}, "
                   f"GEMM rate {flops}")
        out += [f"  note: {n}" for n in self.fit.notes]
        return out


def fit_experiment(experiment: str, arm: str | None, gpu: str | None = None, name: str | None = None,
                   kv_cache_bytes: float | None = None) -> ExperimentFit:
    """Read the experiment's samples of ``arm`` and fit its device profile (UserError, one line,
    when they cannot identify it)."""
    from orchestrator.store import NotFound, Store
    from orchestrator.store.metrics_read import arm_point_samples

    if gpu is not None and gpu not in GPUS:
        raise UserError(f"--gpu: unknown GPU {gpu!r}; known: {', '.join(GPUS)}")
    with Store.open() as store:
        try:
            info = store.get_experiment(experiment)
        except NotFound as e:
            raise UserError(str(e)) from None
        plan = store.plan_of(info.registration_id)
        arm = arm or next(iter(plan.arms))
        if arm not in plan.arms:
            raise UserError(f"--arm: {arm!r} is not an arm of {info.name} ({', '.join(plan.arms)})")
        runs = arm_point_samples(store, info.id, arm, SAMPLE_NAMES)
    spec = plan.arm(arm)
    if spec.layout != "colocated" or spec.gpu is None:
        raise UserError(f"arm {arm} is {'external' if spec.gpu is None else 'disaggregated'}: the metrics fit "
                        "needs a colocated arm of a catalog GPU (one step model per worker)")
    if not runs:
        raise UserError(f"experiment {info.name} has no valid run of arm {arm}")
    workers = spec.replicas or 1
    # each point sends through its warm-up, window and cool-down
    send_s = plan.search.warmup_s + plan.search.point_s + plan.search.cooldown_s
    figures: list[PointFigures] = []
    skipped: list[str] = []
    for r in runs:
        for p in r.points:
            got = point_figures(r.run_id, p.point_id, p.samples, send_s, workers)
            if isinstance(got, str):
                skipped.append(f"run {r.run_id} point {p.point_id}: {got}")
            else:
                figures.append(got)
    observed = _observed(r.fingerprint for r in runs)
    cpu = observed.get("gpu_type") == "cpu"
    profile_gpu = gpu or (observed["gpu_type"] if observed.get("gpu_type") in GPUS else None)
    catalog = GPUS[spec.gpu]
    cache = kv_cache_bytes or (CPU_KV_CACHE_BYTES if cpu else None)

    def worker_for(t0: float, bandwidth: float, flops: float) -> WorkerModel:
        # The arm's catalog GPU only for NVLink and memory; every rate is the candidate's.
        return DeviceProfile(name="fit", gpu=spec.gpu, bandwidth_bytes_s=bandwidth, flops=flops,
                             step_overhead_s=t0, kv_cache_bytes=cache).worker(plan.model, spec.engine, spec.tp)

    try:
        fitted = fit_terms(figures, worker_for, flops_prior=catalog.bf16_flops * COMPUTE_EFFICIENCY)
    except FitRefused as e:
        raise UserError(f"cannot fit a device profile from {info.name} arm {arm}: {e}") from None
    run_ids = tuple(r.run_id for r in runs)
    points = [p.figures.point_id for p in fitted.points]
    source = (f"orch device fit --experiment {info.name} --arm {arm}: vLLM metrics of runs "
              f"{', '.join(map(str, run_ids))}, points {', '.join(map(str, points))} "
              f"({plan.model.name}, TP {spec.tp}, {observed.get('engine_version') or 'engine version unknown'})")
    profile = DeviceProfile(
        name=name or f"{info.name} arm {arm} ({observed.get('gpu_products') or spec.gpu}, vLLM metrics fit)",
        gpu=profile_gpu, fingerprint=observed.get("gpu_products") or None, source=source,
        bandwidth_bytes_s=fitted.bandwidth_bytes_s, flops=fitted.flops, step_overhead_s=fitted.step_overhead_s,
        kv_cache_bytes=cache,
    )
    return ExperimentFit(info.name, arm, profile, fitted, run_ids, tuple(skipped))


def _observed(fingerprints: Any) -> dict[str, str]:
    """What the runs' stored fingerprints agree on (GPU type, products, engine version); values
    that differ between runs are joined."""
    seen: dict[str, set[str]] = {}
    for fp in fingerprints:
        for key in ("gpu_type", "engine_version"):
            if fp and fp.get(key):
                seen.setdefault(key, set()).add(str(fp[key]))
        if fp and fp.get("gpu_products"):
            seen.setdefault("gpu_products", set()).add("|".join(fp["gpu_products"]))
    return {k: " / ".join(sorted(v)) for k, v in seen.items()}
