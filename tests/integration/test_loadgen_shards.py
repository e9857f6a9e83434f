"""Ray shards: the same point over N actors gives the same records as one process."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import ray

from orchestrator.errors import EnvironmentProblem
from orchestrator.loadgen.null_server import NullServerProcess
from orchestrator.loadgen.runner import run_point
from orchestrator.loadgen.schedules import open_loop_offsets, point_phases
from orchestrator.loadgen.shards import run_point_sharded
from orchestrator.loadgen.workloads import build_requests
from orchestrator.plan import OpenLoop, Workload


@pytest.fixture(scope="module")
def ray_local():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def _key(r):
    # everything but timing
    return (r.request_id, r.conversation_id, r.turn, r.phase, r.prompt_tokens, r.output_tokens_asked,
            r.prompt_hash, r.status, r.output_tokens, r.chunks)


def test_shards_merge_to_the_records_of_one_process(ray_local):
    wl = Workload.model_validate({"prompts": {"input_tokens": {"mean": 40}, "shared_prefix": 0.2,
                                              "conversations": 30, "turns": 2}, "output_tokens": 12})
    offsets = open_loop_offsets(OpenLoop(), 100.0, 2.0, seed=21)
    n = len(offsets)
    reqs = build_requests(wl, n, seed=21)
    phases = point_phases(offsets, 0.5, 1.0)
    batches = []
    with NullServerProcess() as url:
        one = asyncio.run(run_point(url, "null", reqs, offsets, phases, keep_records=True))
        two = run_point_sharded(url, "null", reqs, offsets, phases, shards=2, sink=batches.append,
                                keep_records=True, start_delay_s=1.0)
    assert two.shards == 2 and two.scheduled == n == one.scheduled
    assert sorted(map(_key, one.records)) == sorted(map(_key, two.records))
    assert sum(len(b) for b in batches) == n  # the sink saw every record once
    # both shards ran against one clock: scheduled times are start + offset
    sched = np.array(sorted(r.scheduled_s for r in two.records)) - two.started_at
    assert np.allclose(sched, offsets, rtol=0, atol=2e-6)
    assert two.by_status["ok"] == n


def test_sharding_without_ray_is_an_environment_problem(monkeypatch):
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with pytest.raises(EnvironmentProblem):
        run_point_sharded("http://127.0.0.1:9", "m", [], [], [], shards=2)


def test_sharded_point_feeds_the_live_attainment_while_it_runs(ray_local):
    """The driver drains the shards every flush_s and hands each batch to the point's sink: the
    live display's tally (control.points.watched) sees the window fill before the point ends."""
    import time

    from orchestrator.control.points import watched
    from orchestrator.control.progress import AttainmentTally, PlainProgress
    from orchestrator.plan import SERVICE_CLASSES

    class Recording(PlainProgress):
        def __init__(self) -> None:
            super().__init__()
            self.seen = []

        def point_progress(self, so_far) -> None:
            self.seen.append((time.time(), so_far))

    wl = Workload.model_validate({"prompts": {"input_tokens": {"mean": 40}, "conversations": 30},
                                  "output_tokens": 12})
    offsets = open_loop_offsets(OpenLoop(), 40.0, 4.0, seed=5)
    reqs = build_requests(wl, len(offsets), seed=5)
    phases = point_phases(offsets, 0.5, 3.0)
    n_window = sum(1 for p in phases if p == "measure")
    progress, stored = Recording(), []
    sink = watched(stored.extend, progress, AttainmentTally([SERVICE_CLASSES["standard"]], n_window))
    with NullServerProcess() as url:
        two = run_point_sharded(url, "null", reqs, offsets, phases, shards=2, sink=sink, start_delay_s=1.0,
                                flush_s=0.5)
    last_due = two.started_at + float(offsets[phases.index("measure") + n_window - 1])
    partial = [t for t, x in progress.seen if 0 < x.ended < n_window]
    assert partial and partial[0] < last_due  # before the window's last request was due
    # The tally's attainment is the stored records' (how many kept the class is the machine's:
    # TTFT counts from the scheduled send).
    from orchestrator.analysis.metrics import point_metrics

    stored_att = point_metrics(stored, [SERVICE_CLASSES["standard"]], window_s=3.0,
                               n_scheduled=n_window).per_class["standard"].attainment
    assert progress.seen[-1][1].ended == n_window
    assert progress.seen[-1][1].attainment("standard") == pytest.approx(stored_att)
    assert len(stored) == len(offsets)  # every record still reaches the store sink
