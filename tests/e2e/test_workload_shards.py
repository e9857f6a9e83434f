"""An experiment whose search goes above one generator process's ceiling completes on Ray
shards: the point above the ceiling runs on 2 shards against one start time, the merged
records are all there and judged, and the run stores the shard count and the calibration."""

from __future__ import annotations

import pytest
import ray

from tests.e2e.helpers import run_in_process, small_plan

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def local_ray(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def test_points_above_one_process_ceiling_run_on_two_shards(store, state, local_ray) -> None:
    # Every point's rate is above one process's ceiling (1.5 req/s), so every point is sharded.
    plan = small_plan(name="e2e-shards", search={
        "rate": {"min": 1.6, "max": 8}, "precision": 0.25, "point_s": 1.5, "warmup_s": 0.25,
        "cooldown_s": 0, "max_points": 2, "use_prior": False},
        # One attempt per arm: a run voided by its timing guards (Ray shards on a loaded machine)
        # is not retried, which bounds the test's length; what the shards did is judged either way.
        design={"blocks": 1, "order": "ABBA", "seed": 5, "max_retries": 0})
    calibration = {"ceiling_rate": 1.5, "steps": [{"rate": 1.0, "held": True}, {"rate": 2.0, "held": False}]}
    out = run_in_process(store, plan, state, generator_ceiling=1.5, max_shards=2, calibration=calibration)
    runs = store.runs(out.experiment_id)
    # Real time (Ray shards, HTTP): whether a run's timing guards passed is the machine's; what
    # the shards did is not.
    assert {r.arm for r in runs} == {"A", "B"} and all(r.status in ("done", "failed") for r in runs)
    sharded = 0
    for r in runs:
        assert r.fingerprint["generator_max_shards"] == 2
        assert r.fingerprint["generator_calibration"] == calibration
        pts = store.points(r.id)
        assert (pts.offered_rate <= 3.0 + 1e-9).all()  # the search's ceiling: 2 shards x 1.5 req/s
        for _, pt in pts.iterrows():
            recs = store.requests(int(pt.id))
            assert len(recs) == pt.n_scheduled and len({x.request_id for x in recs}) == len(recs)
            loop = pt.context.get("loop") or {}
            if pt.offered_rate > 1.5:
                assert loop.get("shards") == 2 and loop.get("per_shard_ceiling_rps") == 1.5
                sharded += 1
            else:
                assert "shards" not in loop  # one process holds it: no Ray
    assert sharded >= len(runs)  # each run measured (at least its first point) on two shards
