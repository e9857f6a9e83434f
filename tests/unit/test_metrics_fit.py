"""The device profile fit from vLLM's metrics (sim/metrics_fit.py): recovers a known profile from
points its own step model made, reads a point's means from stored samples, and refuses points
that cannot identify the terms (issue 21)."""

from __future__ import annotations

import pytest

from orchestrator.sim.metrics_fit import FitRefused, fit_terms, point_figures
from orchestrator.sim.model import DeviceProfile, WorkerModel
from tests.support.metrics_points import ENGINE, LOADS, MODEL, TRUTH, figures, samples

pytestmark = pytest.mark.unit


def worker_for(t0: float, bandwidth: float, flops: float) -> WorkerModel:
    return DeviceProfile(name="fit", gpu="H100-PCIe", bandwidth_bytes_s=bandwidth, flops=flops,
                         step_overhead_s=t0).worker(MODEL, ENGINE, 1)


PRIOR_FLOPS = 756e12 * 0.6  # the H100-PCIe datasheet's, as the CLI passes


def test_the_fit_recovers_the_profile_that_made_the_points() -> None:
    points = [figures(b, p, r, point_id=i) for i, (b, p, r) in enumerate(LOADS)]
    fit = fit_terms(points, worker_for, PRIOR_FLOPS)
    assert fit.step_overhead_s == pytest.approx(TRUTH.step_overhead_s, rel=0.03)
    assert fit.bandwidth_bytes_s == pytest.approx(TRUTH.bandwidth_bytes_s, rel=0.03)
    assert fit.flops == pytest.approx(TRUTH.flops, rel=0.03)
    assert len(fit.points) == len(LOADS)
    assert all(abs(p.tpot_residual or 1) < 1e-3 and abs(p.prefill_residual or 1) < 1e-3 for p in fit.points)
    assert fit.relative_se["bandwidth_bytes_s"] < 0.25 and not fit.notes


def test_a_points_means_come_from_its_samples_deltas() -> None:
    f = figures(10.0, 4000, 4.0)
    got = point_figures(7, 9, samples(f), send_s=25.0)  # 100 requests in 25 s: 4/s
    assert not isinstance(got, str)
    assert (got.run_id, got.point_id, got.requests) == (7, 9, 100)
    assert got.tpot_s == pytest.approx(f.tpot_s) and got.prefill_s == pytest.approx(f.prefill_s)
    # Little's law: the batch is the rate x the time a request runs (prefill + decode); its
    # tokens see one more (itself).
    assert (got.prompt_tokens, got.output_tokens, got.rate) == pytest.approx((4000, 64, 4.0))
    assert (got.batch, got.token_batch) == pytest.approx((10.0, 11.0))
    # Two workers summed: the rate is per worker.
    two = point_figures(7, 9, samples(f), send_s=12.5, workers=2)
    assert not isinstance(two, str) and (two.batch, two.rate) == pytest.approx((10.0, 4.0))
    assert point_figures(7, 9, samples(f)[:3], send_s=25.0) == "fewer than two scrapes"
    # Without the phase histograms the gauge gives the batch (sum g^2 / sum g for the tokens').
    gauge = [s for s in samples(f) if "prefill" not in s[1] and "decode" not in s[1]]
    got = point_figures(7, 9, gauge, send_s=25.0)
    assert not isinstance(got, str) and (got.batch, got.token_batch) == pytest.approx((10.0, 10.0))


def test_too_few_points_or_one_batch_are_refused_saying_what_would_identify_them() -> None:
    points = [figures(b, p, r, point_id=i) for i, (b, p, r) in enumerate(LOADS)]
    with pytest.raises(FitRefused, match=r"2 point\(s\) with a mean TPOT; the fit needs at least 3: run a rate search"):
        fit_terms(points[:2], worker_for, PRIOR_FLOPS)
    same = [figures(8.0, 4000, 3.0, point_id=i) for i in range(4)]
    with pytest.raises(FitRefused, match="t0 and the bandwidth cannot be told apart; run a rate search"):
        fit_terms(same, worker_for, PRIOR_FLOPS)


def test_points_at_max_num_seqs_are_left_out_and_said_so() -> None:
    # ENGINE's max_num_seqs is 64: a batch of 60 queues for a place (not the step model's).
    points = [figures(b, p, r, point_id=i) for i, (b, p, r) in enumerate(LOADS)]
    full = figures(60.0, 4000, 9.0, point_id=99)
    fit = fit_terms([*points, full], worker_for, PRIOR_FLOPS)
    assert [p.figures.point_id for p in fit.points] == list(range(len(LOADS)))
    assert fit.notes == ("left out point 99 (run 1): batch 60 at max_num_seqs, requests queue for a place",)
    assert fit.bandwidth_bytes_s == pytest.approx(TRUTH.bandwidth_bytes_s, rel=0.03)
    with pytest.raises(FitRefused, match=r"2 point\(s\) with a mean TPOT \(1 more at max_num_seqs, queueing: left out\)"):
        fit_terms([*points[:2], full], worker_for, PRIOR_FLOPS)
